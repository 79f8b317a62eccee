"""Packed windows (``--packing best-fit``): whole documents packed into windows of ``seq_len + 1``
tokens, and the one place that chooses between them and plain windows (``open_samples``).

Each source's document lengths come from its shards' ``.idx`` (one file per shard, read at
start-up; nothing is written), and ``trainer.packing`` packs them into bins in memory. A bin is
read like a window: its pieces are copied out of the memory-mapped shards one after the other,
and what is left of the window is padding.

A row of a batch is the bin's ``seq_len + 1`` tokens followed by its ``seq_len`` targets. The
targets are the next tokens, as for a window, except that no target is taken from padding (the
last document's EOS predicts nothing), nor where a later piece of a document cut at a window's
edge follows another document in a bin (that token was not the next one of the document before
it; the first token of such a piece, alone at a bin's start, has no target either: one token per
``seq_len + 1`` of a document longer than a window). Ignored targets are ``IGNORE``, which the
loss skips. Padding is EOS ids: with ``--doc-mask`` each padding token is a document of its own,
so no document attends to padding or padding to a document; without it, padding comes after
every real token, so causal attention never lets a real token see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.format.manifest import Manifest
from trainer.data import Piece, Rows, Samples, WindowDataset, open_streams
from trainer.docmask import IGNORE
from trainer.packing import Bins, pack
from trainer.settings import Packing


class PackedDataset:
    """Bins of whole documents over several sources' streams of one split (``--packing best-fit``)."""

    def __init__(
        self,
        manifest: Manifest | Sequence[Manifest],
        split: str,
        seq_len: int,
        sources: Iterable[str] | None = None,
        buffer: int = Packing().buffer,
    ) -> None:
        self.split = split
        self.seq_len = seq_len
        self.window = seq_len + 1
        self.width = self.window + seq_len
        self.buffer = buffer
        self.sources, self.streams, self.owners = open_streams(manifest, split, sources)
        self.eos_id = self.owners[0].eos_id
        self.bins: list[Bins] = [
            pack(np.diff(s.document_ends(), prepend=0), self.window, buffer) for s in self.streams
        ]
        self.windows = [b.count for b in self.bins]

    def _bin(self, source: int, window: int) -> tuple[list[int], list[int], list[bool]]:
        """Bin ``window`` of a source: its pieces' stream starts, lengths and continued flags."""
        p = self.bins[source]
        lo, hi = int(p.first[window]), int(p.first[window + 1])
        return p.start[lo:hi].tolist(), p.length[lo:hi].tolist(), p.continued[lo:hi].tolist()

    def batch(self, sources: np.ndarray, windows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``(source, bin)``: ``[len(windows), 2 * seq_len + 1]`` int64, each the bin's
        tokens (padded with EOS) and then its targets."""
        W = self.window
        if out is None:
            out = np.empty((len(windows), self.width), dtype=np.int64)
        tokens, targets = out[:, :W], out[:, W:]
        ends, cuts = [], []
        for row, (s, b) in enumerate(zip(sources.tolist(), windows.tolist(), strict=True)):
            bins = self.bins[s]
            lo, hi = bins.first[b : b + 2].tolist()
            col = self.streams[s].read_pieces(tokens[row], bins.spans[lo:hi].tolist())
            if col < W:
                tokens[row, col:] = self.eos_id
                ends.append((row, col))
            if bins.joins_cut[b]:  # a later piece of a cut document after another piece: no target into it
                starts = np.cumsum(bins.length[lo : hi - 1])
                cuts += [(row, int(c) - 1) for c in starts[bins.continued[lo + 1 : hi]]]
        targets[:] = tokens[:, 1:]
        for row, col in ends:
            targets[row, col - 1 :] = IGNORE
        for row, col in cuts:
            targets[row, col] = IGNORE
        return out

    def inputs_targets(self, rows: Rows) -> tuple[Rows, Rows]:
        """Inputs are a bin's first ``seq_len`` tokens; the targets follow the bin in the row."""
        return rows[:, : self.seq_len], rows[:, self.window :]

    def pieces(self, source: int, window: int) -> list[Piece]:
        stream = self.streams[source]
        starts, lengths, _ = self._bin(source, window)
        return [
            piece
            for start, n in zip(starts, lengths, strict=True)
            for piece in stream.pieces(start, start + n)
        ]

    def describe(self, source: int, window: int) -> dict[str, Any]:
        _, lengths, _ = self._bin(source, window)
        return {"padding": self.window - sum(lengths)}

    def tokens_of(self, source: int, window: int) -> np.ndarray:
        stream = self.streams[source]
        return np.concatenate(
            [stream.read(start, n) for start, n, _ in zip(*self._bin(source, window), strict=True)]
        )

    def shard_at(self, source: int, window: int, column: int) -> Path:
        col = column if column < self.window else column - self.window + 1  # a target: the next token
        stream = self.streams[source]
        for start, n, _ in zip(*self._bin(source, window), strict=True):
            if col < n:
                return stream.shard_at(start + col)
            col -= n
        return stream.shard_at(self._bin(source, window)[0][-1])  # padding: name the bin's last shard

    def shards_of(self, source: int, window: int) -> list[Path]:
        stream = self.streams[source]
        return list(dict.fromkeys(stream.shard_at(start) for start in self._bin(source, window)[0]))


def open_samples(
    manifests: Manifest | Sequence[Manifest],
    split: str,
    seq_len: int,
    sources: Iterable[str] | None,
    packing: Packing,
) -> Samples:
    """The training samples of ``split``: plain windows, or packed ones with ``--packing best-fit``."""
    if packing.packed:
        return PackedDataset(manifests, split, seq_len, sources, packing.buffer)
    return WindowDataset(manifests, split, seq_len, sources)
