"""What identifies an input's content cheaply, so that a rerun never mixes two versions of it.

A local file: size, modification time and a hash of its first and last MiB (all of it when
smaller), read once at planning, where its first and last bytes are checked too. An object:
its size and the version tag its listing gives (S3's ETag changes with every write), so a
bucket of 100,000 objects is fingerprinted by its listing alone. A planned byte range of a
large file has a sample of its own ends (`content_sample`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import xxhash

from pipeline.format.errors import DataError
from pipeline.format.store import errors as store_errors
from pipeline.format.store import is_url
from pipeline.sources.files.access import open_binary, version_tag
from pipeline.sources.files.formats import check_ends, kind_of
from pipeline.sources.files.listing import InputFile

#: bytes hashed at each end of an input file, and of a planned byte range, to notice edits in place
FILE_SAMPLE = 1 << 20
RANGE_SAMPLE = 64 << 10
#: a file this small is read whole, in one call, and both its samples hash every byte of it
SMALL_FILE = 2 * RANGE_SAMPLE

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Ends:
    """The bytes read to fingerprint a file: its head and tail (each all of it when small)."""

    head: bytes
    tail: bytes

    @property
    def sample(self) -> str:
        h = xxhash.xxh3_128(self.head)
        if self.tail is not self.head:
            h.update(self.tail)
        return h.hexdigest()


def read_ends(path: str, start: int, end: int, edge: int) -> Ends:
    """The first and last ``edge`` bytes of ``path``'s bytes [start, end) (all of them, once,
    if fewer than 2 * edge)."""
    with open_binary(path) as f:
        f.seek(start)
        if end - start <= 2 * edge:
            data = f.read(end - start)
            return Ends(data, data)
        head = f.read(edge)
        f.seek(end - edge)
        return Ends(head, f.read(edge))


def content_sample(path: str, start: int, end: int, edge: int = RANGE_SAMPLE) -> str:
    """xxh3 of the first and last ``edge`` bytes of ``path``'s bytes [start, end) (all of
    them if fewer than 2 * edge): a check for edits in place at a bounded read."""
    return read_ends(path, start, end, edge).sample


def bytes_sample(data: bytes) -> str:
    """`content_sample` of bytes already in memory, all of them (at most 2 * the edge)."""
    return Ends(data, data).sample


def fingerprint(f: InputFile, check: bool = True) -> dict[str, Any]:
    """A listed file's entry in the run's origin. For a local file this reads its ends and,
    with ``check``, refuses one whose ends show it unreadable as its kind (UTF-16 text, a
    JSON array, a parquet file without its magic numbers)."""
    if is_url(f.path) and f.etag is not None:
        return {"path": f.path, "size": f.size, "etag": f.etag}
    ends = read_ends(f.path, 0, f.size, FILE_SAMPLE)
    if check:
        check_ends(f.path, kind_of(f.path), ends.head, ends.tail)
    if is_url(f.path):  # a store that gives no version tag
        return {"path": f.path, "size": f.size, "sample": ends.sample}
    return {"path": f.path, "size": f.size, "mtime": f.mtime, "sample": ends.sample}


def fingerprint_now(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded entry's `fingerprint` as of now, with the keys it was recorded with (an
    object recorded by an older tokshard has a sample and an ``mtime``); a file gone is the
    user's to restore."""
    path = entry["path"]
    try:
        if is_url(path):
            import fsspec

            with store_errors(path):
                fs, p = fsspec.core.url_to_fs(path)
                fs.invalidate_cache(p)
                info = fs.info(p)
            now = InputFile(path, int(info["size"]), etag=version_tag(info) if "etag" in entry else None)
            found = fingerprint(now, check=False)
            if "mtime" in entry:
                found["mtime"] = str(info.get("mtime", ""))
            return found
        st = os.stat(path)
        return fingerprint(InputFile(path, st.st_size, mtime=st.st_mtime_ns), check=False)
    except FileNotFoundError as exc:
        raise DataError(
            f"input {path} is gone since this run started; restore it or use a new --out"
        ) from exc


def io_map(fn: Callable[[T], R], items: list[T], threads: int = 16) -> list[R]:
    """``[fn(x) for x in items]`` on a few threads, in chunks: each call is a small read (a
    stat, a sample), which on object storage is a request's round trip, not work; chunks keep
    the pool's own cost per item small for 100,000 of them."""
    if len(items) < 2:
        return [fn(x) for x in items]
    size = max(1, min(256, len(items) // (4 * threads)))
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    with ThreadPoolExecutor(max_workers=min(threads, len(chunks))) as pool:
        return [y for ys in pool.map(lambda chunk: [fn(x) for x in chunk], chunks) for y in ys]
