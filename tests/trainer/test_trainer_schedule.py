"""The schedule's segments: a mixture change or an added source at a resume continues every
source from the samples it has given (pure functions of the schedule, no training)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.format.errors import TokshardError
from trainer.sampler import MixtureSampler
from trainer.schedule import Schedule, SourceInfo

A, B, C = SourceInfo("a", 500, "ha"), SourceInfo("b", 800, "hb"), SourceInfo("c", 300, "hc")


def draws(schedule: Schedule, lo: int, hi: int) -> list[tuple[str, int, int]]:
    d = schedule.draw(np.arange(lo, hi))
    return [
        (schedule.sources[s], int(e), int(w)) for s, e, w in zip(d.sources, d.epochs, d.windows, strict=True)
    ]


def test_one_segment_is_the_mixture_sampler():
    plain = MixtureSampler(["a", "b"], [500, 800], {"a": 0.5, "b": 0.5}, seed=7)
    sched = Schedule.fresh([A, B], {"a": 0.5, "b": 0.5}, seed=7)
    p = np.arange(0, 3000)
    d0, d1 = plain.draw(p), sched.draw(p)
    assert (d0.sources == d1.sources).all() and (d0.windows == d1.windows).all()


def test_a_mix_change_continues_each_source_without_repeats_or_skips():
    before = Schedule.fresh([A, B], {"a": 0.5, "b": 0.5}, seed=3)
    change_at = 400
    after = before.continued([A, B], {"a": 0.1, "b": 0.9}, change_at).schedule
    assert draws(after, 0, change_at) == draws(before, 0, change_at)  # the past is unchanged
    seq = draws(after, 0, 1200)
    for name in ("a", "b"):
        first_epoch = [w for s, e, w in seq if s == name and e == 0]
        assert len(first_epoch) == len(set(first_epoch))  # no window twice within the epoch
        # what was drawn so far is exactly the first k entries of the epoch's permutation
        k = len(first_epoch)
        assert sorted(first_epoch) == sorted(draws_of_source(before, name, k))
    tail = [s for s, _, _ in seq[change_at:]]
    assert tail.count("a") / len(tail) == pytest.approx(0.1, abs=0.01)
    head = [s for s, _, _ in seq[:change_at]]
    assert head.count("a") / len(head) == pytest.approx(0.5, abs=0.01)


def draws_of_source(schedule: Schedule, name: str, k: int) -> list[int]:
    """The first ``k`` windows source ``name`` gives in an unchanged schedule that draws only it."""
    alone = Schedule([*schedule.infos], [schedule.segments[0].__class__(0, {name: 1})], schedule.seed)
    return [w for _, _, w in draws(alone, 0, k)]


def test_an_added_source_starts_at_its_first_window_and_the_others_continue():
    before = Schedule.fresh([A, B], {"a": 0.5, "b": 0.5}, seed=3)
    resumed = before.continued([A, B, C], {"a": 0.2, "b": 0.3, "c": 0.5}, 600)
    after = resumed.schedule
    assert draws(after, 0, 600) == draws(before, 0, 600)
    c_windows = [w for s, _, w in draws(after, 600, 1200) if s == "c"]
    assert c_windows == draws_of_source(after, "c", len(c_windows))
    assert any("'c' added" in x for x in resumed.changes) and not resumed.data_changes


def test_three_changes_survive_the_checkpoint_round_trip():
    s = Schedule.fresh([A, B], {"a": 1, "b": 1}, seed=11)
    for at, mix in ((100, {"a": 0.1, "b": 0.9}), (350, {"a": 0.7, "b": 0.3}), (900, {"a": 0.5, "b": 0.5})):
        s = s.continued([A, B], mix, at).schedule
    back = Schedule.from_json(s.to_json(), seed=11)
    assert draws(back, 0, 2000) == draws(s, 0, 2000)
    assert len(back.segments) == 4
    seq = draws(back, 0, 2000)
    for name, n in (("a", 500), ("b", 800)):
        epochs = {}
        for src, e, w in seq:
            if src == name:
                epochs.setdefault(e, []).append(w)
        for e, ws in epochs.items():
            assert len(ws) == len(set(ws)) and (e == max(epochs) or len(ws) == n)


def test_unchanged_mix_adds_no_segment_and_a_changed_source_is_reported():
    s = Schedule.fresh([A, B], {"a": 0.5, "b": 0.5}, seed=1)
    same = s.continued([A, B], None, 300)
    assert len(same.schedule.segments) == 1 and not same.changes
    changed = s.continued([A, SourceInfo("b", 800, "other")], None, 300)
    assert changed.data_changes and "'b'" in changed.data_changes[0]


def test_added_sources_without_a_mix_are_refused():
    s = Schedule.fresh([A, B], {"a": 0.5, "b": 0.5}, seed=1)
    with pytest.raises(TokshardError, match="new to this run; pass --mix"):
        s.continued([A, B, C], None, 300)


def test_a_checkpoint_from_before_schedules_resumes_as_one_segment(tmp_path_factory):
    """Older checkpoints recorded only the mix and the manifest's fingerprint."""
    from support import cached_manifest

    from pipeline.format import manifest as manifest_mod
    from trainer.checkpoint.resume import saved_schedule
    from trainer.checkpoint.state import TrainerState
    from trainer.data import WindowDataset
    from trainer.schedule import window_sources

    m = manifest_mod.load(cached_manifest(tmp_path_factory))
    now = window_sources(WindowDataset(m, "train", 32))
    mix = {"stdlib": 0.25, "asyncio": 0.75}
    data = {"manifest_fingerprint": m.fingerprint(), "manifest": str(m.path), "seq_len": 32, "mix": mix,
            "train_split": "train"}  # fmt: skip
    older = {"step": 8, "samples": 64, "seed": 5, "world_size": 1, "train_batch_size": 8, "data": data}
    saved = TrainerState.from_json(older)
    old = saved_schedule(saved, [m], now)
    resumed = old.continued(now, None, 64)
    assert not resumed.data_changes and not resumed.changes
    fresh = Schedule.fresh(now, mix, seed=5)
    assert draws(resumed.schedule, 0, 500) == draws(fresh, 0, 500)
    other = TrainerState.from_json({**older, "data": {**data, "manifest_fingerprint": "sha256:else"}})
    assert saved_schedule(other, [m], now).continued(now, None, 64).data_changes
