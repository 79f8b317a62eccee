"""Evaluation: the mean next-token loss over a split's evaluation windows, per source too.

The windows are evenly spaced through each source (``eval_items``): the same set for every
run and every number of ranks, so two runs' evaluations compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from trainer import docmask
from trainer.data import WindowDataset


def eval_items(windows: list[int], per_source: int) -> list[tuple[int, int]]:
    """Evenly spaced windows of each source: the same set for every run and rank count."""
    items = []
    for s, n in enumerate(windows):
        k = min(per_source, n)
        items += [(s, int(w)) for w in np.unique(np.arange(k, dtype=np.int64) * n // k)]
    return items


@torch.no_grad()
def evaluate(
    engine,
    dataset: WindowDataset,
    per_source: int,
    micro: int,
    dist,
    doc_eos: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[float, dict[str, float]] | None:
    """Mean next-token loss over the evaluation windows (per source too). Every rank runs the
    same number of forward passes (padding with weight-0 rows), as ZeRO-3 needs.

    ``stop`` is asked before each forward pass (the same answer on every rank,
    `trainer.stop_request`): True abandons the evaluation there (None), since one of many
    windows takes minutes and a job's time limit does not wait for it.

    No mean here is 0/0 (as a training micro-batch with every target ignored would be without
    `trainer.model.scored_mean`): evaluation scores every target of plain windows (no packing,
    no ``--eod-mask-loss``), so a window's mean is over ``seq_len`` targets; every evaluated
    source holds at least one window (``trainer.guards.evaluable`` leaves out one too short,
    ``WindowDataset`` refuses it) and ``--eval-samples`` is at least 1, so each source's weight
    is at least 1."""
    items = eval_items(dataset.windows, per_source)
    chunk = dist.world * micro
    padded = items + [items[0]] * (-len(items) % chunk)
    weight = np.array([1.0] * len(items) + [0.0] * (len(padded) - len(items)))
    mine = list(range(dist.rank, len(padded), dist.world))
    n_src = len(dataset.sources)
    sums = torch.zeros(2 * n_src, dtype=torch.float64, device=dist.device)
    engine.eval()
    for i in range(0, len(mine), micro):
        if stop is not None and stop():
            return None
        rows = mine[i : i + micro]
        src = np.array([padded[r][0] for r in rows])
        win = np.array([padded[r][1] for r in rows])
        tokens = torch.from_numpy(dataset.batch(src, win)).to(dist.device)
        doc_ids = None if doc_eos is None else docmask.document_ids(tokens[:, :-1], doc_eos)
        documents = {} if doc_ids is None else {"doc_ids": doc_ids}
        # the model's own loss, chunked as it trains (`trainer.model.token_losses`)
        per_token = engine(tokens[:, :-1], tokens[:, 1:], per_token=True, **documents)
        per_sample = per_token.mean(dim=1).double()
        w = torch.from_numpy(weight[rows]).to(dist.device)
        idx = torch.from_numpy(src).to(dist.device)
        sums.index_add_(0, idx, per_sample * w)
        sums.index_add_(0, idx + n_src, w)
    if dist.world > 1:
        torch.distributed.all_reduce(sums)
    loss_sum, count = sums[:n_src].cpu(), sums[n_src:].cpu()
    by_source = {s: float(loss_sum[i] / count[i]) for i, s in enumerate(dataset.sources)}
    mean = float(loss_sum.sum() / count.sum())
    return (mean if math.isfinite(mean) else float("inf")), by_source
