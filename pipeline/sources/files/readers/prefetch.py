"""Small objects of a partition fetched some at a time ahead of its reader.

In an object store every object costs a round trip or two before its first byte, so a
partition of many small objects read one after another spends most of its time waiting on the
network. `Prefetch` fetches the partition's whole small objects, in reading order, a few at
once and within a bound on the bytes held, each checked against the plan exactly as
`open_piece` checks it; the reader then opens them from memory, and a fetch's error is raised
where the reader reaches that object, as if it had opened it itself. Local files and large
objects are opened as before (`open_piece`).
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import BinaryIO

from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import open_piece
from pipeline.storage.locations import is_url

#: objects up to this size are fetched whole ahead of the reader (larger ones are streamed)
PREFETCH_OBJECT_BYTES = 8 << 20
#: fetches at once (the store client caps its own connections too)
PREFETCH_THREADS = 16
#: at most this many bytes fetched ahead and not yet opened (one object is always allowed)
PREFETCH_BYTES = 64 << 20


def fetched_whole(piece: Piece) -> bool:
    return piece.whole and piece.size <= PREFETCH_OBJECT_BYTES and is_url(piece.path)


def _fetch(piece: Piece) -> bytes:
    with open_piece(piece) as f:
        return f.read()


class Prefetch:
    """The opener of one partition's pieces (``pieces``: those it will read, in the order the
    readers open them)."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        self._queue = deque(p for p in pieces if fetched_whole(p))
        self._fetching: deque[tuple[Piece, Future[bytes]]] = deque()
        self._held = 0
        self._pool = ThreadPoolExecutor(PREFETCH_THREADS, "tokshard-prefetch") if self._queue else None

    def open(self, piece: Piece) -> BinaryIO:
        if all(fetched != piece for fetched, _ in self._fetching):
            return open_piece(piece)
        while True:  # (pieces fetched before it that a reader never opened are let go)
            fetched, future = self._fetching.popleft()
            self._held -= fetched.size
            if fetched == piece:
                break
            future.cancel()
        self._fill()
        return io.BytesIO(future.result())

    def _fill(self) -> None:
        while self._queue and len(self._fetching) < PREFETCH_THREADS:
            piece = self._queue[0]
            if self._fetching and self._held + piece.size > PREFETCH_BYTES:
                return
            self._queue.popleft()
            assert self._pool is not None
            self._fetching.append((piece, self._pool.submit(_fetch, piece)))
            self._held += piece.size

    def __enter__(self) -> Prefetch:
        self._fill()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
