"""The prefetch thread hands the loop exactly the planned batches, in order, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import cached_manifest

from pipeline.format import manifest as manifest_mod
from trainer.data import WindowDataset
from trainer.prefetch import Prefetcher
from trainer.sampler import MixtureSampler, rank_positions


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    m = manifest_mod.load(cached_manifest(tmp_path_factory))
    ds = WindowDataset(m, "train", seq_len=32)
    return ds, MixtureSampler(ds.sources, ds.windows, {s: 1.0 for s in ds.sources}, seed=3)


def test_batches_arrive_in_plan_order_with_shifted_targets(data):
    ds, sampler = data
    plan = [rank_positions(8 * i, 0, 0, 1, 4) for i in range(10)]
    got = list(Prefetcher(ds, sampler, iter(plan), torch.device("cpu"), depth=2))
    assert len(got) == 10
    for positions, batch in zip(plan, got, strict=True):
        d = sampler.draw(positions)
        want = torch.from_numpy(ds.batch(d.sources, d.windows))
        assert torch.equal(batch.inputs, want[:, :-1]) and torch.equal(batch.targets, want[:, 1:])
        assert batch.inputs.dtype == torch.int64 and np.array_equal(batch.draws.positions, positions)


def test_an_error_in_the_thread_reaches_the_loop(data):
    ds, sampler = data

    def plan():
        yield np.arange(4)
        raise RuntimeError("shard vanished")

    it = Prefetcher(ds, sampler, plan(), torch.device("cpu"))
    next(it)
    with pytest.raises(RuntimeError, match="shard vanished"):
        next(it)


def test_close_stops_a_thread_blocked_on_a_full_queue(data):
    ds, sampler = data
    endless = (rank_positions(4 * i, 0, 0, 1, 4) for i in range(10**9))
    it = Prefetcher(ds, sampler, endless, torch.device("cpu"), depth=1)
    next(it)
    it.close()
    assert not it._thread.is_alive()
