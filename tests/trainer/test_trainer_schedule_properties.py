"""The sampler's schedule, property by property (hypothesis): for any sources, weights, seed
and resume point, positions map to samples deterministically, every source walks through its
windows in order without repeating or skipping one, the mix holds over every run of
positions, and a resume that changes the mix keeps the past and continues every source."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.sampler import PERIOD
from trainer.schedule import Schedule, SourceInfo

NAMES = ("a", "b", "c", "d")


@st.composite
def schedules(draw) -> tuple[list[SourceInfo], dict[str, float], int]:
    count = draw(st.integers(1, len(NAMES)))
    infos = [SourceInfo(n, draw(st.integers(1, 60)), f"h{n}") for n in NAMES[:count]]
    weights = {s.name: draw(st.floats(0.05, 20.0)) for s in infos}
    return infos, weights, draw(st.integers(0, 2**32))


def by_source(schedule: Schedule, positions: np.ndarray) -> dict[str, list[tuple[int, int]]]:
    """Each source's (epoch, window) draws, in position order."""
    d = schedule.draw(positions)
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s, e, w in zip(d.sources.tolist(), d.epochs.tolist(), d.windows.tolist(), strict=True):
        out[schedule.sources[s]].append((e, w))
    return out


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(0, 10**9), st.integers(1, 400))
def test_a_draw_depends_only_on_its_position(spec, start, n):
    infos, weights, seed = spec
    schedule = Schedule.fresh(infos, weights, seed)
    positions = np.arange(start, start + n, dtype=np.int64)
    whole = schedule.draw(positions)
    again = Schedule.fresh(infos, weights, seed).draw(positions[::-1])
    assert whole.windows.tolist() == again.windows.tolist()[::-1]
    assert whole.sources.tolist() == again.sources.tolist()[::-1]


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(1, 3))
def test_each_source_walks_its_windows_once_per_epoch(spec, epochs):
    infos, weights, seed = spec
    schedule = Schedule.fresh(infos, weights, seed)
    quotas = schedule.segments[0].quotas
    longest = max(-(-epochs * s.windows * PERIOD // quotas[s.name]) for s in infos)
    drawn = by_source(schedule, np.arange(min(longest, 4 * PERIOD), dtype=np.int64))
    for info in infos:
        seen = drawn[info.name]
        for epoch in range(len(seen) // info.windows):
            one = seen[epoch * info.windows : (epoch + 1) * info.windows]
            assert {e for e, _ in one} == {epoch}
            assert sorted(w for _, w in one) == list(range(info.windows))


@settings(max_examples=200, deadline=None)
@given(schedules(), st.integers(0, 10**6), st.integers(1, 3000))
def test_the_mix_holds_over_every_run_of_positions(spec, start, width):
    infos, weights, seed = spec
    schedule = Schedule.fresh(infos, weights, seed)
    quotas = schedule.segments[0].quotas
    d = schedule.draw(np.arange(start, start + width, dtype=np.int64))
    counts = np.bincount(d.sources, minlength=len(infos))
    for i, info in enumerate(infos):
        # Sainte-Lague interleaving: a prefix of the pattern is within 1/2 + (m/2) q/P of its
        # share (m sources), so any run of positions, a difference of two prefixes, within twice that
        share = quotas[info.name] / PERIOD
        assert abs(counts[i] - width * share) <= 1 + len(infos) * share


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(1, 2000), st.integers(1, 2000), st.data())
def test_a_resume_with_another_mix_keeps_the_past_and_continues_every_source(spec, at, after, data):
    infos, weights, seed = spec
    before = Schedule.fresh(infos, weights, seed)
    new_weights = {n: data.draw(st.floats(0.05, 20.0)) for n in weights}
    resumed = before.continued(infos, new_weights, at)
    assert not resumed.data_changes
    past = np.arange(at, dtype=np.int64)
    assert resumed.schedule.draw(past).windows.tolist() == before.draw(past).windows.tolist()
    assert resumed.schedule.draw(past).sources.tolist() == before.draw(past).sources.tolist()
    # every source's samples after the change are the very ones it would have given next
    walked = by_source(resumed.schedule, np.arange(at + after, dtype=np.int64))
    alone = {s.name: Schedule.fresh([s], {s.name: 1.0}, seed) for s in infos}
    for name, seen in walked.items():
        own = by_source(alone[name], np.arange(len(seen), dtype=np.int64))[name]
        assert seen == own
