"""A GPT-style decoder in plain torch (nanoGPT's shape), with named sizes.

``tiny`` is for tests; ``gpt2-124m`` is GPT-2 small; ``opt-125m`` and ``opt-350m`` have the
shapes of Meta's OPT models (layers, width, heads, FFN, ReLU, 2048 positions). They are
shapes for training from scratch, not loaders of published weights; their ``vocab_size`` is
only the default when no tokenizer is known (``tokshard train`` sizes the embedding from the
manifest, ``trainer.models.resolve``). Any Transformers causal LM can be trained instead (``trainer.models``), built from its config without weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer import docmask
from trainer.docmask import Attend


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    ffn_mult: int = 4
    activation: str = "gelu"
    dropout: float = 0.0
    bias: bool = True


SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=2048, block_size=1024),
    # GPT-2 small; vocabulary 50257 padded to a multiple of 64, as nanoGPT does
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024),
    "opt-125m": GPTConfig(
        n_layer=12, n_head=12, n_embd=768, vocab_size=50272, block_size=2048, activation="relu"
    ),
    "opt-350m": GPTConfig(
        n_layer=24, n_head=16, n_embd=1024, vocab_size=50272, block_size=2048, activation="relu"
    ),
}


def gpt_config(name: str, vocab_size: int | None = None) -> GPTConfig:
    cfg = SIZES[name]
    return replace(cfg, vocab_size=vocab_size) if vocab_size else cfg


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, attend: Attend | None = None) -> torch.Tensor:
        """``attend``: attention within documents (``trainer.docmask``); default plain causal."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if attend is not None:
            y = attend(q, k, v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.ffn_mult * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU(approximate="tanh") if cfg.activation == "gelu" else nn.ReLU()
        self.proj = nn.Linear(cfg.ffn_mult * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attend: Attend | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), attend))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, loss_chunk: int = 0) -> None:
        super().__init__()
        self.config = cfg
        #: tokens whose logits the loss makes at a time (0: all at once; `chunked_cross_entropy`)
        self.loss_chunk = loss_chunk
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        flex: bool | None = None,
        per_token: bool = False,
    ) -> torch.Tensor:
        """Logits ``[B, T, vocab]``, or with ``targets`` the mean next-token cross-entropy over
        the targets not ignored (-100; 0 where none is scored, `scored_mean`), or with ``per_token`` each target's (``[B, T]``, for
        evaluation's per-sample means). ``doc_ids`` (``--doc-mask``): attention within documents
        and positions restarting at each (``trainer.docmask``); ``flex`` picks FlexAttention or
        the dense SDPA mask for them (None: FlexAttention where it is fast, on CUDA), so the two
        can be compared on one batch."""
        T = idx.size(1)
        attend = None
        if doc_ids is None:
            pos = torch.arange(T, device=idx.device)
        else:
            doc = docmask.layout(doc_ids, self.config.n_head, flex)
            pos, attend = doc.positions, doc.attend
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x, attend)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x)
        if per_token:
            return token_losses(x, targets, self.lm_head, self.loss_chunk)
        return chunked_cross_entropy(x, targets, self.lm_head, self.loss_chunk)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding, named as Transformers' models name theirs (``wpe`` is an
        ``nn.Embedding`` too: a caller looking for the ids' table asks for this one)."""
        return self.wte

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n


def scored_mean(losses: torch.Tensor, targets: torch.Tensor, *, ignore_index: int) -> torch.Tensor:
    """The mean of per-target ``losses`` (0 where ignored, as ``F.cross_entropy``'s
    ``reduction="none"`` leaves them) over the targets not ``ignore_index``: their sum over their
    count, the count taken as at least 1. A batch with no scored target (a packed bin of lone
    EOS pieces, a window whose only input is EOS under ``--eod-mask-loss``) is then loss 0 with
    zero gradient, where a plain mean is 0/0 = NaN. Stays on the device (no host sync). Every
    training loss goes through here: `GPT.forward`, `chunked_cross_entropy`,
    ``trainer.models.CausalLMWithLoss``."""
    return losses.sum() / (targets != ignore_index).sum().clamp(min=1)


def chunked_cross_entropy(
    hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, chunk: int
) -> torch.Tensor:
    """The mean next-token cross-entropy of ``head(hidden)`` against ``targets`` over the targets
    not ignored (`scored_mean`: 0 where none is scored), ``chunk`` tokens at a time
    (`token_losses`; 0: all at once)."""
    losses = token_losses(hidden, targets, head, chunk)
    return scored_mean(losses, targets, ignore_index=docmask.IGNORE)


def token_losses(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, chunk: int) -> torch.Tensor:
    """Each target's cross-entropy (``targets``' shape; 0 where ignored), ``chunk`` tokens'
    logits at a time (0: all at once). A modern vocabulary's logits outweigh everything else a
    step holds (256,000 ids x 8 x 1024 tokens: 8 GiB in fp32, three copies with their
    log-softmax and gradient); here each chunk's logits are made, reduced to its losses, and
    dropped, and the backward pass makes them again (activation checkpointing), so a step holds
    one chunk's. The price is the head's forward once more."""
    flat, wanted = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    step = chunk or flat.size(0)
    keep_for_backward = torch.is_grad_enabled() and chunk > 0
    parts = [
        checkpoint(_losses, flat[i : i + step], wanted[i : i + step], head, use_reentrant=False)
        if keep_for_backward
        else _losses(flat[i : i + step], wanted[i : i + step], head)
        for i in range(0, flat.size(0), step)
    ]
    return torch.cat(parts).view(targets.shape)


def _losses(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, ignore_index=docmask.IGNORE, reduction="none")
