"""tokshard's data for any PyTorch loop: the very micro-batches `tokshard train` feeds a rank.

``TrainingSamples`` is a ``torch.utils.data.IterableDataset`` with ``state_dict()`` and
``load_state_dict()``. For a seed, mixture, packing, global batch, micro-batch, world size and
rank it yields the micro-batches ``tokshard train`` trains that rank on, in the same order (the
loop itself draws its positions with ``micro_batch_positions`` below), each sample with the
documents that fill it. The state is global (samples
consumed and the schedule), so a run saved on 8 ranks resumes on 4, and ``load_state_dict``
also accepts a ``tokshard train`` checkpoint's ``tokshard.json`` (``from_checkpoint``). A new
``mix`` or added manifests at a resume continue every source where it stopped
(``trainer.schedule``).

A manifest may be a URL (``s3://bucket/run/manifest.json``): its shards, and the provenance
sidecars ``origin`` reads, are fetched into the node's data cache (``data_cache``,
`pipeline.storage.data_cache`) and hash-checked there before use, as ``tokshard train`` does.

Imports numpy, torch and tokshard's format contract and storage only: no DeepSpeed. See
docs/TRAINING.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.format.errors import TokshardError
from trainer import remote
from trainer.checkpoint import resume
from trainer.checkpoint.state import TrainerState, read_state, read_tag
from trainer.data import ModelLimits, check_vocabulary, sources_with_split
from trainer.docmask import loss_targets
from trainer.origins import StreamOrigins
from trainer.packed import open_samples
from trainer.run_folders import recorded_settings
from trainer.sampler import DEFAULT_SEED, parse_mix, rank_positions
from trainer.schedule import Schedule, token_shares, window_sources
from trainer.settings import Packing


def micro_batch_positions(
    samples: int,
    steps: int | None,
    global_batch: int,
    micro: int,
    rank: int,
    world: int,
    first_micro: int = 0,
) -> Iterator[np.ndarray]:
    """Positions of ``rank``'s micro-batches for ``steps`` optimizer steps (None: forever) from
    global position ``samples``: micro-step ``m`` takes ``rank_positions(samples, m, ...)``."""
    accum = global_batch // (micro * world)
    done = 0
    while steps is None or done < steps:
        for m in range(first_micro, accum):
            yield rank_positions(samples, m, rank, world, micro)
        first_micro = 0
        samples += global_batch
        done += 1


class TrainingSamples(torch.utils.data.IterableDataset):
    """Micro-batches ``{"inputs", "targets", "positions", "sources", "windows", "documents"}`` of one rank.

    ``manifest``: a manifest path (or folder), or a list of them. ``mix``: ``{"src": w}`` or
    ``"src=w,..."`` (default: by token count). ``packing``: ``"none"`` (windows of ``seq_len + 1``
    tokens) or ``"best-fit"`` (whole documents packed into them, over blocks of
    ``packing_buffer`` documents; ignored targets are -100). ``global_batch`` must split into
    ``world`` ranks of ``micro_batch``; the gradient accumulation is what remains, as in
    DeepSpeed. ``documents``: per sample, the pieces that fill it, in order
    (``trainer.data.Piece``: source, split, document id counting from 0 within them, and the
    ``[start, end)`` token range inside the document). ``data_cache``: the node's cache folder
    for manifest URLs (default ``~/.cache/tokshard/data``). ``eod_mask_loss``: targets -100
    where the input is EOS as well, the targets ``tokshard train --doc-mask --eod-mask-loss``
    scores (`trainer.docmask.loss_targets`); without it, the targets of a run without
    ``--eod-mask-loss`` (the attention mask of ``--doc-mask`` is the model's to build).
    """

    def __init__(
        self,
        manifest: str | Path | list[str | Path],
        *,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        rank: int = 0,
        world: int = 1,
        seed: int = DEFAULT_SEED,
        mix: dict[str, float] | str | None = None,
        split: str = "train",
        packing: str = "none",
        packing_buffer: int | None = None,
        data_cache: str | Path | None = None,
        eod_mask_loss: bool = False,
    ) -> None:
        if global_batch % (micro_batch * world):
            raise TokshardError(
                f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} x {world} ranks"
            )
        if not 0 <= rank < world:
            raise TokshardError(f"rank {rank} is not in a world of {world}")
        paths = manifest if isinstance(manifest, list) else [manifest]
        cache = None if data_cache is None else str(data_cache)
        self.manifests, _ = remote.open_manifests([str(p) for p in paths], cache, None)
        self.packing = Packing(packing, packing_buffer or Packing.buffer)
        self.dataset = open_samples(
            self.manifests, split, seq_len, sources_with_split(self.manifests, split), self.packing
        )
        self.seq_len, self.global_batch, self.micro = seq_len, global_batch, micro_batch
        self.rank, self.world, self.seed, self.split = rank, world, seed, split
        self.eod_mask_loss = eod_mask_loss
        self._mix = parse_mix(mix) if isinstance(mix, str) else mix
        self.schedule = Schedule.fresh(
            window_sources(self.dataset), self._mix or token_shares(self.dataset), seed
        )
        self.samples = 0  # global position of the current optimizer step's first sample
        self.micro_step = 0  # this rank's next micro-step within that step
        self._origins: dict[str, StreamOrigins] = {}

    @property
    def accum(self) -> int:
        return self.global_batch // (self.micro * self.world)

    @property
    def vocab_size(self) -> int:
        """The tokenizer's ids: the fewest embedding rows a model of this data needs."""
        return max(m.vocab_size for m in self.manifests)

    @property
    def eos_id(self) -> int:
        """The EOS id that ends each document (one tokenizer across the manifests)."""
        return self.manifests[0].eos_id

    def check_model(self, model: torch.nn.Module, embedding: torch.nn.Embedding | None = None) -> None:
        """Refuse ``model`` (TokshardError) if its token embedding (``embedding``, else the
        model's ``get_input_embeddings()``, else its only ``nn.Embedding``) has fewer rows than
        the data has ids, before a step would die of an IndexError inside ``torch.embedding``."""
        rows = _embedding_rows(model, embedding)
        limits = ModelLimits(type(model).__name__, rows, 1 << 30)
        fix = "build it with {need} embedding rows (tokshard's GPT: gpt_config(NAME, vocab_size=data.vocab_size))"
        check_vocabulary(str(self.manifests[0].path), self.vocab_size, limits, fix)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for positions in micro_batch_positions(
            self.samples, None, self.global_batch, self.micro, self.rank, self.world, self.micro_step
        ):
            draws = self.schedule.draw(positions)
            rows = torch.from_numpy(self.dataset.batch(draws.sources, draws.windows))
            inputs, targets = self.dataset.inputs_targets(rows)
            targets = loss_targets(inputs, targets, self.eos_id, self.eod_mask_loss)
            self.micro_step += 1
            if self.micro_step == self.accum:
                self.samples, self.micro_step = self.samples + self.global_batch, 0
            pairs = list(zip(draws.sources.tolist(), draws.windows.tolist(), strict=True))
            yield {
                "inputs": inputs,
                "targets": targets,
                "positions": draws.positions,
                "sources": [self.schedule.sources[s] for s, _ in pairs],
                "windows": draws.windows,
                "documents": [self.dataset.pieces(s, w) for s, w in pairs],
            }

    def origin(self, source: str, document: int) -> dict[str, Any]:
        """Where document ``document`` of ``source`` (numbered from 0 within its split, as
        ``tokshard samples`` names them) came from: its input and line, row or byte offset, its
        shard and that shard's content hash (DataError for data prepared without provenance)."""
        if source not in self.dataset.sources:
            raise TokshardError(f"no source {source!r} here; these are {', '.join(self.dataset.sources)}")
        if source not in self._origins:
            i = self.dataset.sources.index(source)
            self._origins[source] = StreamOrigins(self.dataset.owners[i], source, self.split)
        return self._origins[source].origin(document)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs; JSON-serializable, and the same on every rank at a step boundary."""
        return {
            "samples": self.samples,
            "micro_step": self.micro_step,
            "world": self.world,
            "micro_batch": self.micro,
            "global_batch": self.global_batch,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "train_split": self.split,
            "packing": self.packing.to_json(),
            "schedule": self.schedule.to_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (ours, or a ``tokshard train`` checkpoint's tokshard.json), with
        this object's world, rank and batch sizes; this object's ``mix``, if given, applies from here."""
        if "data" in state:  # a checkpoint's: at a step boundary, any layout
            checkpoint = TrainerState.from_json(state)
            split, seq_len = checkpoint.data.train_split, checkpoint.data.seq_len
            packing = checkpoint.data.packing
            seed, samples, micro_step = checkpoint.seed, checkpoint.samples, 0
            saved = resume.saved_schedule(checkpoint, self.manifests, window_sources(self.dataset))
        else:
            split, seq_len = state["train_split"], state["seq_len"]
            packing = Packing.from_json(state.get("packing"))
            seed, samples, micro_step = (
                int(state["seed"]),
                int(state["samples"]),
                int(state.get("micro_step", 0)),
            )
            saved = Schedule.from_json(state["schedule"], seed)
        if (split, seq_len, packing) != (self.split, self.seq_len, self.packing):
            raise TokshardError(
                f"the state is for split {split!r}, seq-len {seq_len} and packing {packing}, this data is "
                f"{self.split!r}, {self.seq_len} and {self.packing}"
            )
        layout = (self.world, self.micro, self.global_batch)
        if micro_step and (state.get("world"), state.get("micro_batch"), state.get("global_batch")) != layout:
            raise TokshardError(
                "the state was saved inside an optimizer step; resume it with the same world, micro-batch and "
                "global batch, or save at a step boundary (micro_step 0) to change them"
            )
        resumed = saved.continued(window_sources(self.dataset), self._mix, samples)
        if resumed.data_changes:
            raise TokshardError(
                "the data changed since the state was saved: " + "; ".join(resumed.data_changes)
            )
        self.schedule, self.seed = resumed.schedule, seed
        self.samples, self.micro_step = samples, micro_step

    @classmethod
    def from_checkpoint(cls, save_dir: str | Path, tag: str | None = None, **kwargs: Any) -> TrainingSamples:
        """The samples a ``tokshard train --resume`` from ``save_dir`` would train on next.

        What the checkpoint fixes (seq-len, split, packing, global batch, manifests, seed) is
        taken from it, and so is ``eod_mask_loss`` (from the run's run.json where the checkpoint,
        an older tokshard's, records none: that of the folder it logged into, the checkpoint's
        run folder, else ``save_dir``; False where neither does). An argument given here wins."""
        save_dir = Path(save_dir)
        tag, checkpoint = (tag, read_tag(save_dir, tag)) if tag else read_state(save_dir)
        kwargs.setdefault("eod_mask_loss", _recorded_eod_mask_loss(save_dir, checkpoint))
        kwargs.setdefault("seq_len", checkpoint.data.seq_len)
        kwargs.setdefault("split", checkpoint.data.train_split)
        kwargs.setdefault("packing", checkpoint.data.packing.mode)
        kwargs.setdefault("packing_buffer", checkpoint.data.packing.buffer)
        kwargs.setdefault("global_batch", checkpoint.train_batch_size)
        kwargs.setdefault("manifest", list(checkpoint.data.manifests))
        samples = cls(seed=checkpoint.seed, **kwargs)
        samples.load_state_dict(checkpoint.to_json())
        return samples


def _recorded_eod_mask_loss(save_dir: Path, checkpoint: TrainerState) -> bool:
    """Whether the run that saved ``checkpoint`` trained with ``--eod-mask-loss``: as the
    checkpoint says, else (an older tokshard's) as its run.json says, which a later resume may
    have rewritten; False where neither says (that run's targets are the plain ones)."""
    if checkpoint.eod_mask_loss is not None:
        return checkpoint.eod_mask_loss
    run_dir = Path(checkpoint.run_dir) if checkpoint.run_dir else save_dir
    model = recorded_settings(run_dir).get("model")
    return isinstance(model, dict) and model.get("eod_mask_loss") is True


def _embedding_rows(model: torch.nn.Module, embedding: torch.nn.Embedding | None) -> int:
    """Rows of ``model``'s token embedding. Without ``get_input_embeddings()`` (Transformers',
    tokshard's GPT) a model of several ``nn.Embedding`` (positions, types) does not say which
    one takes the ids: the first declared is not it in every model, so it is not guessed."""
    found = embedding if embedding is not None else _input_embedding(model)
    if found is not None:
        return int(found.num_embeddings)
    name = type(model).__name__
    tables = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
    if len(tables) == 1:
        return int(model.get_submodule(tables[0]).num_embeddings)
    if not tables:
        raise TokshardError(f"model {name} has no nn.Embedding to check against the data's ids")
    raise TokshardError(
        f"model {name} has {len(tables)} nn.Embedding ({', '.join(tables)}) and no get_input_embeddings() "
        "saying which takes the token ids; pass that one: check_model(model, embedding=model.NAME)"
    )


def _input_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model.get_input_embeddings()`` where it has one (Transformers' base class raises
    NotImplementedError where a model defines none)."""
    getter = getattr(model, "get_input_embeddings", None)
    if not callable(getter):
        return None
    try:
        return getter()
    except NotImplementedError:
        return None
