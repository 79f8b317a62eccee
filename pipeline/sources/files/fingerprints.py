"""What identifies an input's content cheaply, so that a rerun never mixes two versions of it.

A local file: its size and modification time, as its listing gave them; a file larger than
`SMALL_FILE` also a hash of its first and last MiB (all of it up to 2 MiB), read once at
planning, where its first and last bytes are checked too: an edit in place that keeps size
and time shows there. A small file is read by its worker only, which checks size and time
first. An object: its size and the version tag its listing gives (S3's ETag changes with
every write), so a bucket of 100,000 objects is fingerprinted by its listing alone. A
planned byte range of a large file has a sample of its own ends (`content_sample`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import xxhash

from pipeline.format.errors import DataError
from pipeline.sources.files.access import open_binary, version_tag
from pipeline.sources.files.formats import check_ends, kind_of
from pipeline.sources.files.listing import InputFile
from pipeline.storage.locations import is_url
from pipeline.storage.object_store import errors as store_errors
from pipeline.storage.object_store import url_filesystem

#: bytes hashed at each end of an input file, and of a planned byte range, to notice edits in place
FILE_SAMPLE = 1 << 20
RANGE_SAMPLE = 64 << 10
#: a file this small is identified by its size and time alone, and read whole in one call
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


def fingerprints(files: list[InputFile]) -> list[dict[str, Any]]:
    """`fingerprint` of every file: those that need a read on a few threads, the others (small
    local files, objects) from their listing at once."""
    found: list[dict[str, Any] | None] = []
    add = found.append
    for f in files:
        path, size, mtime, etag, _ = f
        if etag is None and mtime is not None and size <= SMALL_FILE:  # inline: once per file
            add({"path": path, "size": size, "mtime": mtime})  # (`listed_fingerprint`'s entry)
        else:
            add(None if needs_read(f) else listed_fingerprint(f))
    reads = [i for i, entry in enumerate(found) if entry is None]
    for i, entry in zip(reads, io_map(fingerprint, [files[i] for i in reads]), strict=True):
        found[i] = entry
    return found  # type: ignore[return-value]


def needs_read(f: InputFile) -> bool:
    """Whether a file's fingerprint reads its bytes (a large local file, or an object whose
    store gives no version tag: the listing gives a local file its time, an object none)."""
    return f.etag is None and (f.size > SMALL_FILE or f.mtime is None)


def fingerprint(f: InputFile, check: bool = True) -> dict[str, Any]:
    """A listed file's entry in the run's origin. For a local file larger than `SMALL_FILE`
    this reads its ends and, with ``check``, refuses one whose ends show it unreadable as its
    kind (UTF-16 text, a JSON array, a parquet file without its magic numbers); a small one's
    worker checks the same when it reads it."""
    if not needs_read(f):
        return listed_fingerprint(f)
    ends = read_ends(f.path, 0, f.size, FILE_SAMPLE)
    if check:
        check_ends(f.path, f.kind or kind_of(f.path), ends.head, ends.tail)
    if is_url(f.path):  # a store that gives no version tag
        return {"path": f.path, "size": f.size, "sample": ends.sample}
    return {"path": f.path, "size": f.size, "mtime": f.mtime, "sample": ends.sample}


def listed_fingerprint(f: InputFile) -> dict[str, Any]:
    """`fingerprint` of a file whose listing says all of it (`needs_read` false)."""
    if f.etag:
        return {"path": f.path, "size": f.size, "etag": f.etag}
    return {"path": f.path, "size": f.size, "mtime": f.mtime}


def fingerprint_now(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded entry's `fingerprint` as of now, with the keys it was recorded with (an
    object recorded by an older tokshard has a sample and an ``mtime``); a file gone is the
    user's to restore."""
    path = entry["path"]
    try:
        if is_url(path):
            with store_errors(path):
                fs, p = url_filesystem(path)
                fs.invalidate_cache(p)
                info = fs.info(p)
            now = InputFile(path, int(info["size"]), etag=version_tag(info) if "etag" in entry else None)
            found = fingerprint(now, check=False)
            if "mtime" in entry:
                found["mtime"] = str(info.get("mtime", ""))
            return found
        st = os.stat(path)
        found = fingerprint(InputFile(path, st.st_size, mtime=st.st_mtime_ns), check=False)
        if "sample" in entry and "sample" not in found:  # a small file an older tokshard sampled
            found["sample"] = content_sample(path, 0, st.st_size, FILE_SAMPLE)
        return found
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
