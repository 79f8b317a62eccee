"""Document-aware training (``--doc-mask``): attention stays inside each document of a window.

A fixed window runs across EOS into the next document. With ``--doc-mask`` the tokens after an
EOS start a new document: they attend only to their own document (a block-diagonal causal
mask) and their position ids restart at 0, as Megatron's ``reset_attention_mask`` and
``reset_position_ids``; the EOS itself belongs to the document it ends. ``--eod-mask-loss``
(Megatron's ``eod_mask_loss``) also drops the loss where the input is EOS, i.e. predicting the
next document's first token from the previous one, so the loss equals training each document
alone. ``tests/test_trainer_docmask.py`` checks both against Megatron's own masks.

Attention: PyTorch's ``scaled_dot_product_attention`` with a boolean ``[B, 1, T, T]`` mask
(everywhere), or FlexAttention with a block mask that skips whole blocks outside the diagonal
(on CUDA, where ``torch.nn.attention.flex_attention`` exists).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100  # cross_entropy's ignore_index

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def document_ids(inputs: torch.Tensor, eos_id: int) -> torch.Tensor:
    """``[B, T]``: which document of its row each input token is in (a new one after each EOS)."""
    starts = torch.zeros_like(inputs, dtype=torch.int32)
    starts[:, 1:] = (inputs[:, :-1] == eos_id).to(torch.int32)
    return starts.cumsum(dim=1, dtype=torch.int32)


def position_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: positions restarting at 0 where each document starts."""
    T = doc_ids.size(1)
    index = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    first = torch.ones_like(doc_ids, dtype=torch.bool)
    first[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start = torch.where(first, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start


def loss_targets(
    inputs: torch.Tensor, targets: torch.Tensor, eos_id: int, eod_mask_loss: bool
) -> torch.Tensor:
    """Targets with the cross-document predictions ignored when ``eod_mask_loss``."""
    return targets.masked_fill(inputs == eos_id, IGNORE) if eod_mask_loss else targets


@dataclass(frozen=True)
class ModelInputs:
    """The model's arguments for a batch: with ``--doc-mask`` also each token's document id,
    and the targets ``--eod-mask-loss`` leaves out. Built once per run."""

    #: the EOS that separates documents (None: plain windows, no ``--doc-mask``)
    eos_id: int | None = None
    eod_mask_loss: bool = False

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.eos_id is None:
            return inputs, targets
        doc_ids = document_ids(inputs, self.eos_id)
        return inputs, loss_targets(inputs, targets, self.eos_id, self.eod_mask_loss), doc_ids


def dense_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` boolean: True where query ``i`` may attend key ``j`` (causal, same document)."""
    T = doc_ids.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same & causal)[:, None]


def flex_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class DocumentLayout:
    """What one forward pass needs: position ids and the attention for every layer."""

    positions: torch.Tensor
    attend: Attend


def layout(doc_ids: torch.Tensor, n_head: int, flex: bool | None = None) -> DocumentLayout:
    """Build the mask once per batch; every layer reuses it."""
    use_flex = flex_available(doc_ids.device) if flex is None else flex
    attend = flex_attend(doc_ids, n_head) if use_flex else sdpa_attend(doc_ids)
    return DocumentLayout(position_ids(doc_ids), attend)


def sdpa_attend(doc_ids: torch.Tensor) -> Attend:
    mask = dense_mask(doc_ids)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flex_attend(doc_ids: torch.Tensor, n_head: int) -> Attend:
    """FlexAttention with a block mask: blocks wholly outside a document are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def same_document(b, h, q, kv):
        return (doc_ids[b, q] == doc_ids[b, kv]) & (q >= kv)

    B, T = doc_ids.shape
    block = create_block_mask(same_document, B, None, T, T, device=doc_ids.device)
    kernel = _compiled_flex() if doc_ids.device.type == "cuda" else flex_attention
    return lambda q, k, v: kernel(q, k, v, block_mask=block)


_FLEX = None


def _compiled_flex():
    """flex_attention is fast only compiled; compile it once per process."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX
