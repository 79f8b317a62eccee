"""The best-fit packer, property by property (hypothesis): for any document lengths, window and
buffer, every token of every document lands in exactly one bin once, no document that fits a
window is cut, a longer one is cut only into window-sized pieces and a shorter last one, no bin
holds more than a window, and the result depends on nothing but its inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.packing import Bins, best_fit, pack

lengths_st = st.lists(st.integers(1, 300), min_size=1, max_size=400).map(lambda x: np.array(x, np.int64))
windows_st = st.integers(1, 120)
buffers_st = st.integers(1, 64)


def bins_of(p: Bins) -> list[list[tuple[int, int, bool]]]:
    """Each bin's pieces as (start, length, continued)."""
    return [
        list(
            zip(
                p.start[lo:hi].tolist(),
                p.length[lo:hi].tolist(),
                p.continued[lo:hi].tolist(),
                strict=True,
            )
        )
        for lo, hi in zip(p.first[:-1].tolist(), p.first[1:].tolist(), strict=True)
    ]


@settings(max_examples=150, deadline=None)
@given(lengths_st, windows_st, buffers_st)
def test_every_token_lands_in_exactly_one_bin_once(lengths, window, buffer):
    p = pack(lengths, window, buffer)
    covered = np.zeros(int(lengths.sum()), dtype=np.int64)
    for bin_ in bins_of(p):
        for start, n, _ in bin_:
            covered[start : start + n] += 1
    assert (covered == 1).all()


@settings(max_examples=150, deadline=None)
@given(lengths_st, windows_st, buffers_st)
def test_no_document_that_fits_a_window_is_cut_and_longer_ones_only_into_windows(lengths, window, buffer):
    p = pack(lengths, window, buffer)
    assert p.joins_cut.tolist() == [any(c for _, _, c in bin_[1:]) for bin_ in bins_of(p)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pieces: dict[int, list[tuple[int, int, bool]]] = {}
    for bin_ in bins_of(p):
        for start, n, continued in bin_:
            doc = int(np.searchsorted(starts, start, side="right")) - 1
            pieces.setdefault(doc, []).append((start - int(starts[doc]), n, continued))
    for doc, length in enumerate(lengths.tolist()):
        got = sorted(pieces[doc])
        if length <= window:
            assert got == [(0, length, False)]
        else:
            assert [g[0] for g in got] == list(range(0, length, window))
            assert all(n == window for _, n, _ in got[:-1]) and 0 < got[-1][1] <= window
            assert [c for _, _, c in got] == [False] + [True] * (len(got) - 1)


@settings(max_examples=150, deadline=None)
@given(lengths_st, windows_st, buffers_st)
def test_no_bin_exceeds_the_window_and_each_block_leaves_at_most_one_half_empty_bin(lengths, window, buffer):
    p = pack(lengths, window, buffer)
    used = p.used()
    assert (used <= window).all() and (used > 0).all()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    block_of_bin = (np.searchsorted(starts, p.start[p.first[:-1]], side="right") - 1) // buffer
    for block in np.unique(block_of_bin):
        assert int((used[block_of_bin == block] * 2 <= window).sum()) <= 1


@settings(max_examples=60, deadline=None)
@given(lengths_st, windows_st, buffers_st)
def test_the_packing_is_a_pure_function_of_lengths_window_and_buffer(lengths, window, buffer):
    a, b = pack(lengths, window, buffer), pack(lengths.copy(), window, buffer)
    for field in ("first", "start", "length", "continued"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist()


@settings(max_examples=60, deadline=None)
@given(lengths_st, windows_st)
def test_blocks_are_packed_apart_so_a_later_block_never_changes_an_earlier_one(lengths, window):
    """The first block's bins are the same whatever documents follow it."""
    buffer = max(1, len(lengths) // 2)
    whole = pack(lengths, window, buffer)
    head = pack(lengths[:buffer], window, buffer)
    assert bins_of(whole)[: head.count] == bins_of(head)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=200))
def test_best_fit_puts_each_size_in_the_tightest_open_bin(sizes):
    capacity = 50
    bins, count = best_fit(sizes, capacity)
    room = []
    for size, b in zip(sizes, bins, strict=True):
        fitting = [r for r in room if r >= size]
        if b == len(room):
            assert not fitting  # a new bin only when none has room
            room.append(capacity - size)
        else:
            assert room[b] == min(fitting)
            room[b] -= size
    assert count == len(room)
