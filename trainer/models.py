"""``--model NAME``: a named size of our GPT, or ``hf:CONFIG`` for any Transformers causal LM.

``hf:CONFIG`` takes a hub name (``hf:facebook/opt-350m``; only its config.json is fetched), a
folder holding config.json, a config JSON file, or the name of one shipped in
``trainer/configs/models`` (``hf:opt-125m``, ``hf:opt-350m``, ``hf:gpt-neo-2.7b``, offline); ``AutoModelForCausalLM.from_config`` builds
it with fresh weights. Needs the optional extra: ``pip install 'tokshard[transformers]'``.
The spec is resolved first (vocabulary, positions, width: cheap), so the manifest guards run
before any weights are allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.format.errors import TokshardError
from trainer import docmask
from trainer.data import ModelLimits
from trainer.model import GPT, SIZES, chunked_cross_entropy, gpt_config, scored_mean, token_losses

HF_PREFIX = "hf:"
#: Transformers configs shipped with tokshard: ``hf:opt-125m`` works offline
SHIPPED = Path(__file__).resolve().parent / "configs" / "models"


#: Transformers model types whose logits are their output embedding applied to their base
#: model's last hidden state, nothing after it (no soft-capping or scaling): their loss can make
#: its logits a chunk at a time (``--loss-chunk``); tests/trainer/test_trainer_model.py checks each
CHUNKABLE_HF_TYPES = ("gpt2", "gpt_neo", "gpt_neox", "llama", "mistral", "opt", "qwen2")
#: which models can take ``--loss-chunk``, for the lines that refuse it
CHUNKABLE_MODELS = f"tokshard's own models or an hf: model of type {', '.join(CHUNKABLE_HF_TYPES)}"


#: embeddings are padded to a multiple of this (as Megatron-LM and nanoGPT pad GPT-2's 50257 to 50304)
VOCAB_MULTIPLE = 64


@dataclass(frozen=True)
class ModelSpec:
    name: str
    limits: ModelLimits
    hidden_size: int
    n_layer: int
    hf_config: Any = None  # a transformers PretrainedConfig for hf: models
    vocab_note: str = ""  # where the embedding size came from, for the log
    loss_chunk: int = (
        0  # tokens whose logits the loss makes at a time (0: all; `model.chunked_cross_entropy`)
    )
    loss_note: str = ""  # why the loss is chunked, where tokshard chose it (`trainer.guards.loss_chunk`)

    @property
    def unchunkable(self) -> str | None:
        """Why this model's loss cannot make its logits a chunk at a time (None: it can)."""
        kind = getattr(self.hf_config, "model_type", None)
        if self.hf_config is None or kind in CHUNKABLE_HF_TYPES:
            return None
        return f"{self.name} is a model of type {kind!r}, and only {CHUNKABLE_MODELS} make their loss a chunk at a time"

    def build(self) -> nn.Module:
        """The module DeepSpeed trains: ``forward(idx, targets) -> loss``."""
        if self.hf_config is None:
            return GPT(gpt_config(self.name, self.limits.vocab_size), self.loss_chunk)
        from transformers import AutoModelForCausalLM

        return CausalLMWithLoss(AutoModelForCausalLM.from_config(self.hf_config), self.loss_chunk)


def padded_vocab(vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``VOCAB_MULTIPLE`` (faster matmuls, same ids)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def resolve(name: str, vocab_size: int | None = None, tokenizer_vocab: int | None = None) -> ModelSpec:
    """Look a model up by name without building it.

    ``vocab_size`` (``--vocab-size``) sets the embedding. Otherwise our GPT shapes, trained
    from scratch, follow the tokenizer (``tokenizer_vocab``, the manifest's, padded to a
    multiple of 64), while an ``hf:`` config keeps the vocabulary it fixes (a tokenizer larger
    than it is refused by the manifest guard)."""
    if name.startswith(HF_PREFIX):
        return _hf_spec(name[len(HF_PREFIX) :], vocab_size)
    if name not in SIZES:
        raise TokshardError(
            f"unknown --model {name!r}: use one of {', '.join(SIZES)} or hf:CONFIG "
            "(a Transformers config: hub name, folder or config.json)"
        )
    note = f"--vocab-size {vocab_size}" if vocab_size else ""
    if not vocab_size and tokenizer_vocab:
        vocab_size = padded_vocab(tokenizer_vocab)
        note = f"the tokenizer's {tokenizer_vocab} ids, padded to a multiple of {VOCAB_MULTIPLE}"
    cfg = gpt_config(name, vocab_size)
    note = f"embedding of {cfg.vocab_size} rows ({note or 'the model default'})"
    limits = ModelLimits(name, cfg.vocab_size, cfg.block_size)
    return ModelSpec(name, limits, cfg.n_embd, cfg.n_layer, vocab_note=note)


def _hf_spec(source: str, vocab_size: int | None) -> ModelSpec:
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise TokshardError(
            "--model hf:... needs Transformers: pip install 'tokshard[transformers]'"
        ) from exc
    shipped = SHIPPED / f"{source}.json"
    local = Path(source).expanduser()
    if not source.strip() or (source.startswith((".", "/", "~")) and not local.exists()):
        raise TokshardError(
            f"--model hf:{source}: no such config file or folder; give hf:FOLDER holding a config.json, "
            "hf:CONFIG.json, a hub name or a shipped one"
        )
    where = str(local) if local.exists() else str(shipped) if shipped.is_file() else source
    try:
        config = AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise TokshardError(f"--model hf:{source}: {_config_failure(exc)}") from exc
    refuse_non_causal(config, source)
    if vocab_size:
        config.vocab_size = vocab_size
    positions = _first(config, "max_position_embeddings", "n_positions", "n_ctx", "seq_length")
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    name = f"{HF_PREFIX}{source}"
    limits = ModelLimits(name, int(config.vocab_size), int(positions or 1 << 30))
    note = (
        f"embedding of {config.vocab_size} rows ({'--vocab-size' if vocab_size else 'fixed by the config'})"
    )
    return ModelSpec(name, limits, int(hidden or 0), int(layers or 0), hf_config=config, vocab_note=note)


#: encoder families whose causal-LM class attends both ways unless the config sets is_decoder
ENCODER_TYPES = frozenset(
    {"bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
     "megatron-bert", "qdqbert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
     "xlm-roberta", "xlm-roberta-xl", "xmod"}
)  # fmt: skip


def refuse_non_causal(config: Any, source: str) -> None:
    """A model that sees the tokens it is asked to predict learns nothing a causal LM needs, and
    its loss falls as if it did: an encoder's config trained without a word."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    kind = getattr(config, "model_type", "")
    if getattr(config, "is_encoder_decoder", False) or kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise TokshardError(
            f"--model hf:{source}: a {kind or 'typeless'} config, which Transformers builds no causal "
            "(decoder-only) LM from; choose a decoder's config (OPT, GPT-2, Llama, ...)"
        )
    if kind in ENCODER_TYPES and not getattr(config, "is_decoder", False):
        raise TokshardError(
            f'--model hf:{source}: a {kind} config without "is_decoder": true, so its model attends '
            "both ways and sees the tokens it predicts; set it in the config, or choose a decoder's"
        )


def _config_failure(exc: BaseException) -> str:
    """Why a config could not be loaded, in one line (Transformers' own messages run to several,
    and call a gated repo a connection problem's neighbour)."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    cause = exc.__cause__
    if isinstance(cause, GatedRepoError):
        return (
            "its hub repo is gated: accept its terms on huggingface.co and set HF_TOKEN (or `hf auth login`), "
            "or give hf:FOLDER holding its config.json"
        )
    if isinstance(cause, LocalEntryNotFoundError):
        return (
            "not in the local hub cache and the hub cannot be reached; give hf:FOLDER holding its config.json, "
            "or fetch it where the hub is reachable"
        )
    if isinstance(cause, RepositoryNotFoundError):
        return "no such hub repo (nor a local folder); check the name"
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return f"cannot load a Transformers config ({first})"


def _first(config: Any, *names: str) -> Any:
    return next((getattr(config, n) for n in names if getattr(config, n, None)), None)


class CausalLMWithLoss(nn.Module):
    """A Transformers causal LM behind our ``forward(idx, targets)``: windows already hold the
    shifted targets, so the loss is the plain cross-entropy of its logits. With ``loss_chunk``
    (a model of `CHUNKABLE_HF_TYPES`) they are made that many tokens at a time from the base
    model's last hidden state, as `trainer.model.token_losses` makes our GPT's."""

    def __init__(self, model: nn.Module, loss_chunk: int = 0) -> None:
        super().__init__()
        self.model = model
        self.loss_chunk = loss_chunk

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, per_token: bool = False
    ) -> torch.Tensor:
        """Logits, or the mean cross-entropy over the targets not ignored (0 where none is
        scored, `trainer.model.scored_mean`), or with ``per_token`` each target's (``GPT.forward``)."""
        if targets is not None and self.loss_chunk:
            hidden = self.model.base_model(input_ids=idx, use_cache=False)[0]
            head = self.model.get_output_embeddings()
            if per_token:
                return token_losses(hidden, targets, head, self.loss_chunk)
            return chunked_cross_entropy(hidden, targets, head, self.loss_chunk)
        logits = self.model(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits
        losses = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            targets.reshape(-1),
            ignore_index=docmask.IGNORE,
            reduction="none",
        ).view(targets.shape)
        return losses if per_token else scored_mean(losses, targets, ignore_index=docmask.IGNORE)
