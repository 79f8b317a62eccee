"""What identifies an input's content cheaply, so that a rerun never mixes two versions of it:
size, modification time and hashes of sampled bytes, per file and per planned byte range."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xxhash

from pipeline.format.errors import DataError, TokshardError
from pipeline.format.store import errors as store_errors
from pipeline.format.store import is_url
from pipeline.sources.files.access import open_binary

#: bytes hashed at each end of an input file, and of a .jsonl range, to notice edits in place
FILE_SAMPLE = 1 << 20
RANGE_SAMPLE = 64 << 10


def stat_key(path: str) -> dict[str, Any]:
    """What identifies a file's content cheaply: size, modification time, and a hash of its
    first and last MiB (an edit in place that keeps size and time still shows there, unless
    it touches only the middle of a big file; the .jsonl ranges have samples of their own)."""
    if is_url(path):
        import fsspec

        with store_errors(path):
            fs, p = fsspec.core.url_to_fs(path)
            info = fs.info(p)
        size, mtime = int(info["size"]), str(info.get("mtime", ""))
    else:
        import os

        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    return {"path": path, "size": size, "mtime": mtime, "sample": content_sample(path, 0, size, FILE_SAMPLE)}


def content_sample(path: str, start: int, end: int, edge: int) -> str:
    """xxh3 of the first and last ``edge`` bytes of ``path``'s bytes [start, end) (all of
    them if fewer than 2 * edge): a check for edits in place at a bounded read."""
    h = xxhash.xxh3_128()
    with open_binary(path) as f:
        f.seek(start)
        if end - start <= 2 * edge:
            h.update(f.read(end - start))
        else:
            h.update(f.read(edge))
            f.seek(end - edge)
            h.update(f.read(edge))
    return h.hexdigest()


def stat_key_now(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded input's `stat_key` as of now; a file gone is the user's to restore."""
    try:
        return stat_key(entry["path"])
    except OSError as exc:
        raise TokshardError(
            f"input {entry['path']} is gone since this run started; restore it or use a new --out"
        ) from exc


def io_map(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` on a few threads: each call is a small read (a stat, a
    sample), which on object storage is a request's round trip, not work."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(fn, items))


def range_sample(spec: dict[str, Any]) -> str:
    """The sample of a planned .jsonl range (its ``path``, ``start`` and ``end``)."""
    return content_sample(spec["path"], spec["start"], spec["end"], RANGE_SAMPLE)


def check_range_unchanged(path: str, spec: dict[str, Any]) -> None:
    """A worker's check, when it starts or resumes a .jsonl range, that the range still holds
    what was planned (a plan of an older tokshard has no sample: nothing to check)."""
    if "sample" not in spec:
        return
    try:
        sample = range_sample(spec)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
    if sample != spec["sample"]:
        raise DataError(
            f"input {path} changed since this run started (bytes {spec['start']}-{spec['end']} differ); "
            "restore it or start over with a new --out"
        )
