"""The sample order: a pure function of (seed, position), split across ranks, mixture-exact."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.format.errors import TokshardError
from trainer.sampler import PERIOD, FeistelPermutation, MixtureSampler, parse_mix, quotas, rank_positions


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097, 123_457])
def test_feistel_is_a_permutation(n):
    out = FeistelPermutation(n, key=42)(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))


def test_feistel_depends_on_key_and_shuffles():
    a = FeistelPermutation(10_000, key=1)(np.arange(10_000))
    b = FeistelPermutation(10_000, key=2)(np.arange(10_000))
    assert not np.array_equal(a, b)
    assert np.array_equal(a, FeistelPermutation(10_000, key=1)(np.arange(10_000)))
    # not near the identity: neighbours land far apart
    assert np.median(np.abs(np.diff(a))) > 1000


def test_quotas_sum_to_the_period_and_keep_tiny_sources():
    q = quotas({"big": 1e12, "mid": 3e11, "tiny": 1.0})
    assert sum(q.values()) == PERIOD
    assert q["tiny"] == 1
    assert abs(q["big"] / q["mid"] - 10 / 3) < 1e-3


def test_weights_whose_sum_overflows_keep_their_ratio():
    """``--mix a=1.5e308,b=1e308`` is 60/40: the sum of the weights (inf) must not flatten it."""
    q = quotas({"a": 1.5e308, "b": 1e308})
    assert sum(q.values()) == PERIOD
    assert q == quotas({"a": 3.0, "b": 2.0})


def sampler(weights=None, seed=0):
    names = ["a", "b", "c"]
    windows = [1000, 37, 5000]
    return MixtureSampler(names, windows, weights or {"a": 0.5, "b": 0.2, "c": 0.3}, seed)


def test_mixture_holds_over_every_window_of_steps():
    s = sampler()
    src = s.draw(np.arange(20_000)).sources
    want = s.weights()
    for width in (10, 64, 1000):
        for start in range(0, 20_000 - width, 97):
            counts = np.bincount(src[start : start + width], minlength=3)
            for i, name in enumerate(s.sources):
                assert abs(counts[i] - width * want[name]) <= 2, (width, start, name)


def test_draws_are_deterministic_in_seed_and_position():
    pos = np.arange(5_000, 5_100)
    a, b = sampler(seed=7).draw(pos), sampler(seed=7).draw(pos)
    assert np.array_equal(a.windows, b.windows) and np.array_equal(a.sources, b.sources)
    c = sampler(seed=8).draw(pos)
    assert not np.array_equal(a.windows, c.windows)
    # random access equals walking there
    walk = sampler(seed=7).draw(np.arange(5_100))
    assert np.array_equal(walk.windows[5_000:], a.windows)


def test_each_epoch_of_a_source_visits_every_window_once():
    s = sampler()
    d = s.draw(np.arange(40_000))
    b = d.windows[d.sources == 1]  # source "b": 37 windows
    epochs = d.epochs[d.sources == 1]
    for e in range(epochs.max()):
        assert sorted(b[epochs == e].tolist()) == list(range(37))
    assert not np.array_equal(b[epochs == 0], b[epochs == 1])  # reshuffled each epoch
    assert s.epochs_at(40_000)["b"] == int((d.sources == 1).sum() // 37)


def test_ranks_split_a_global_batch_without_overlap_for_any_world_size():
    micro, global_batch = 2, 8
    for world in (1, 2, 4):
        accum = global_batch // (micro * world)
        got = [
            p
            for rank in range(world)
            for m in range(accum)
            for p in rank_positions(16, m, rank, world, micro).tolist()
        ]
        assert sorted(got) == list(range(16, 24))


def test_parse_mix():
    assert parse_mix("a=0.7, b=0.3") == {"a": 0.7, "b": 0.3}
    assert parse_mix(None) is None
    for bad in ("a", "a=x", "a=-1", "=2", "a=nan"):
        with pytest.raises(TokshardError, match="SOURCE=WEIGHT"):
            parse_mix(bad)


def test_a_source_left_out_of_the_mix_is_never_drawn():
    s = sampler(weights={"a": 1.0, "c": 1.0})
    assert 1 not in set(s.draw(np.arange(1000)).sources.tolist())
