"""Whole documents packed into windows by best fit (``--packing best-fit``), from their lengths alone.

A source's documents (their lengths, EOS included, as the shards' ``.idx`` hold them) are cut
into pieces: a document of at most ``window`` tokens is one piece, a longer one is cut into
``window``-sized pieces and a shorter last one. Consecutive blocks of ``buffer`` documents, in
stream order, are packed apart by best-fit decreasing: each piece, largest first (ties in stream
order), goes into the open bin it leaves the least room in, or opens a new one. A source's bins
are its blocks' bins in block order, each block's in the order they were opened; a bin's pieces
are kept in stream order.

So the packing is a pure function of (lengths, window, buffer): no seed, no index file, the same
on every rank and every resume. The sampler permutes a source's bins exactly as it permutes
plain windows (``trainer.sampler``), which keeps every guarantee of the schedule. Any-fit inside
a block leaves at most one of its bins half full or less, so padding comes only from a block's
last, least-filled bins.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

_LOW = (1 << 32) - 1


@dataclass(frozen=True)
class Pieces:
    """Every piece of a source's documents, in stream order."""

    #: the document each piece comes from (0-based within the source and split)
    document: np.ndarray
    #: where it starts in the source's token stream
    start: np.ndarray
    length: np.ndarray
    #: the piece starts inside its document (a later piece of a document longer than a window)
    continued: np.ndarray


def cut(lengths: np.ndarray, window: int) -> Pieces:
    """Documents of these lengths cut into pieces of at most ``window`` tokens: one piece for
    a document that fits, ``window``-sized pieces and a shorter last one for a longer one."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    count = -(-lengths // window)
    document = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    first = np.cumsum(count) - count
    k = np.arange(len(document), dtype=np.int64) - first[document]
    return Pieces(
        document=document,
        start=starts[document] + k * window,
        length=np.minimum(window, lengths[document] - k * window),
        continued=k > 0,
    )


def best_fit(sizes: list[int], capacity: int) -> tuple[list[int], int]:
    """Best fit of ``sizes`` (each ``<= capacity``) in the order given: each goes into the open
    bin it leaves the least room in (of equals, the first opened), else into a new bin. Returns
    each size's bin, numbered in the order bins were opened, and the number of bins.

    Open bins are one sorted list of ``room << 32 | bin``, so the tightest bin for ``s`` is the
    first entry at or above ``s << 32``: a binary search, and the entry updated where it stands
    when its smaller room still sorts there (else moved down, or dropped once full)."""
    keys: list[int] = []
    bins = [0] * len(sizes)
    opened = 0
    for i, size in enumerate(sizes):
        j = bisect_left(keys, size << 32)
        if j < len(keys):
            key = keys[j]
            b = key & _LOW
            key -= size << 32
            if not key >> 32:
                del keys[j]
            elif j and keys[j - 1] > key:
                del keys[j]
                insort(keys, key, 0, j)
            else:
                keys[j] = key
        else:
            b = opened
            opened += 1
            if size < capacity:
                insort(keys, (capacity - size) << 32 | b)
        bins[i] = b
    return bins, opened


@dataclass(frozen=True)
class Bins:
    """One source's bins: bin ``b`` holds pieces ``first[b]:first[b + 1]``, each ``length``
    tokens from ``start`` in the source's token stream, in stream order."""

    window: int
    first: np.ndarray
    #: ``[pieces, 2]``: each piece's start and length (one array, so a bin's pieces are one slice)
    spans: np.ndarray
    continued: np.ndarray
    #: per bin: a later piece of a cut document follows another piece in it
    joins_cut: np.ndarray

    @property
    def start(self) -> np.ndarray:
        return self.spans[:, 0]

    @property
    def length(self) -> np.ndarray:
        return self.spans[:, 1]

    @property
    def count(self) -> int:
        """How many bins."""
        return len(self.first) - 1

    def used(self) -> np.ndarray:
        """Tokens each bin holds (the rest of its ``window`` is padding)."""
        return np.add.reduceat(self.length, self.first[:-1]) if len(self.length) else np.zeros(0, np.int64)


def pack(lengths: np.ndarray, window: int, buffer: int) -> Bins:
    """Documents of these lengths (in stream order) packed into bins of ``window`` tokens by
    best-fit decreasing within consecutive blocks of ``buffer`` documents."""
    if window < 1 or buffer < 1:
        raise ValueError("packing needs a window and a buffer of at least 1")
    pieces = cut(lengths, window)
    n = len(pieces.length)
    block = pieces.document // buffer
    # by block, then largest first, then in stream order (a stable sort of one key)
    order = np.argsort(block * (window + 1) + (window - pieces.length), kind="stable")
    sizes = pieces.length[order].tolist()
    blocks = int(block[-1]) + 1 if n else 0
    bounds = np.searchsorted(block[order], np.arange(blocks + 1)).tolist()
    bin_in_order = np.empty(n, dtype=np.int64)
    opened = 0
    for lo, hi in pairwise(bounds):
        bins, count = best_fit(sizes[lo:hi], window)
        bin_in_order[lo:hi] = bins
        bin_in_order[lo:hi] += opened
        opened += count
    bin_of = np.empty(n, dtype=np.int64)
    bin_of[order] = bin_in_order
    by_bin = np.argsort(bin_of, kind="stable")  # stream order inside each bin
    sorted_bins = bin_of[by_bin]
    first = np.searchsorted(sorted_bins, np.arange(opened + 1)).astype(np.int64)
    continued = pieces.continued[by_bin]
    joins_cut = np.zeros(opened, dtype=bool)
    joins_cut[sorted_bins[continued & (np.arange(n) != first[sorted_bins])]] = True
    return Bins(
        window=window,
        first=first,
        spans=np.stack([pieces.start[by_bin], pieces.length[by_bin]], axis=1),
        continued=continued,
        joins_cut=joins_cut,
    )
