"""What every format's reader provides: the documents of one piece of a partition, in order,
each with the cursor just after it (the piece and the position in it, so a worker resumes
exactly there), its progress through the partition and its location in the input.

A piece is opened through `open_piece`, which checks it against the plan first: a rerun, or
a late worker, never reads a later version of a file beside shards of the planned one."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, ClassVar, NamedTuple

from pipeline.format import lfs_pointer
from pipeline.format.errors import DataError
from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.access import open_binary, open_local, same_version, unreadable, version_tag
from pipeline.sources.files.fingerprints import SMALL_FILE, content_sample
from pipeline.sources.files.pieces import Piece
from pipeline.storage.locations import is_url


class Place(NamedTuple):
    """Where a piece sits in its partition: its index, which cursors name, and the partition's
    planned bytes before it, from which progress counts."""

    index: int
    before: int

    def cursor(self, **position: Any) -> Cursor:
        return {"piece": self.index, **position}


def row_place(path: str, row: int) -> str:
    """Where a row of a parquet or Arrow file is, as a message names it: its place in the whole
    file, counted from 1 as a JSON line's is (a document's provenance counts rows from 0)."""
    return f"{path} row {row} of the file"


#: how a reader opens a piece: `open_piece`, or a partition's prefetch of small objects
Opener = Callable[[Piece], BinaryIO]


class Reader(ABC):
    """Base of the format readers; `pipeline.sources.files.readers.read_partition` picks one
    per piece by its kind."""

    #: the file kinds (`pipeline.sources.files.formats.SUFFIXES` values) this reader reads
    kinds: ClassVar[tuple[str, ...]]

    def __init__(self, text_field: str, opener: Opener | None = None) -> None:
        self.text_field = text_field
        self.open: Opener = opener or open_piece

    @abstractmethod
    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        """The piece's documents from ``position`` on (None: from its start)."""


def open_piece(piece: Piece) -> BinaryIO:
    """A piece's bytes, checked against the plan: a local file's size and time when it is
    opened (a small whole file is then read in one call, `small_file_bytes`), a larger
    piece's sampled ends before that, an object's version tag when it is opened."""
    data = small_file_bytes(piece)
    if data is not None:
        return io.BytesIO(data)
    path = piece.path
    if is_url(path):
        f = open_binary(path)
        now = version_tag(getattr(f, "details", None) or {})
        if piece.etag is not None and now is not None and not same_version(piece.etag, now):
            f.close()
            raise changed(piece, f"its version {now} is not {piece.etag}")
        if piece.sample is not None and piece.etag is None:
            _check_sample(piece)
        if piece.whole and piece.size < lfs_pointer.MAX_BYTES:  # small enough to be a Git LFS pointer
            with f:
                data = f.read()
            lfs_pointer.refuse(path, data)
            return io.BytesIO(data)
        return f
    if piece.sample is not None:
        _check_sample(piece)
    f = open_local(path, 1 << 20)
    try:
        _check_listed(piece, os.fstat(f.fileno()))
    except BaseException:
        f.close()
        raise
    return f


def small_file_bytes(piece: Piece) -> bytes | None:
    """All of a small whole local file (at most `SMALL_FILE` bytes), read in one call on one
    descriptor once its size and time are found as planned; None for any other piece. A
    partition of many small files opens each with this: a few system calls and no file
    object."""
    if (
        piece.size > SMALL_FILE
        or piece.end is not None  # not whole (`Piece.whole`, inline: this runs once per file)
        or piece.row_groups is not None
        or piece.sample is not None
        or "://" in piece.path  # a URL, perhaps (`is_url` says), read as one below
    ):
        return None
    try:
        fd = os.open(piece.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there: no waiting
    except OSError as exc:
        raise unreadable(piece.path, exc) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise unreadable(piece.path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
        _check_listed(piece, st)
        data = os.read(fd, piece.size + 1)  # one byte more: a file grown since shows
        while 0 < len(data) < piece.size and (more := os.read(fd, piece.size + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) != piece.size:
        raise changed(piece, "size")
    lfs_pointer.refuse(piece.path, data)
    return data


def _check_listed(piece: Piece, st: os.stat_result) -> None:
    """A local file as opened is the one planned: its modification time, and a whole file's size."""
    if (piece.mtime is not None and st.st_mtime_ns != piece.mtime) or (
        piece.whole and st.st_size != piece.size
    ):
        raise changed(piece, "size or modification time")


def check_read(piece: Piece) -> None:
    """A local piece, once read (to its end, or as far as a commit covers), is still the file
    planned: one stat of its path, its modification time and a whole file's size as listed. An
    edit in place, or a new version put there, since it was opened is named, not read as the
    planned version. An object is left as it is: it is read as the version opened (its tag is
    checked then), which an upload replaces whole rather than edits."""
    if "://" in piece.path and is_url(piece.path):
        return
    try:
        st = os.stat(piece.path)
    except FileNotFoundError:
        raise changed(piece, "removed while it was read") from None
    except OSError as exc:
        raise unreadable(piece.path, exc) from exc
    if (piece.mtime is not None and st.st_mtime_ns != piece.mtime) or (
        piece.whole and st.st_size != piece.size
    ):
        raise changed(piece, "written to while it was read: its size or modification time is not as planned")


def _check_sample(piece: Piece) -> None:
    if content_sample(piece.path, piece.start, piece.stop) != piece.sample:
        raise changed(piece, f"bytes {piece.start}-{piece.stop} differ")


def changed(piece: Piece, what: str) -> DataError:
    return DataError(
        f"input {piece.path} changed since this run started ({what}); restore it or start over with a new --out"
    )


@contextlib.contextmanager
def corrupt_is_one_line(path: str, kind: str) -> Iterator[None]:
    """pyarrow's errors for a damaged file of ``kind`` (parquet, Arrow: a bad magic number, a cut
    footer or stream, a flipped page) become one line that names the file."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError as exc:
        raise DataError(f"input {path} is gone; restore it and rerun") from exc
    except (pa.ArrowException, OSError, EOFError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: corrupt {kind} file ({why}); re-create it or remove it") from exc
