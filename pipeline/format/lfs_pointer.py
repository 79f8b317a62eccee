"""Git LFS pointers: the small text files a clone made without git-lfs holds in place of its
large files (a hub repo's parquet shards or prepared .bin shards, a 30 MB tokenizer.json). Each
is under 1024 bytes by the spec (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md);
a checkout may have turned its line ends into CRLF. Whoever first reads a file's bytes refuses
a pointer by name, so it is never read as text or tokens, or called corrupt."""

from __future__ import annotations

import os
import re

from pipeline.format.errors import DataError
from pipeline.format.file_kind import not_a_file

MAX_BYTES = 1024
START = b"version https://git-lfs.github.com/spec/"
_SIZE = re.compile(rb"^size (\d+)\r?$", re.MULTILINE)
#: what to do about one
FETCH = "fetch it (`git lfs pull` in the clone, or download the file) and run again"


def size_stood_for(data: bytes) -> int | None:
    """The size of the file that ``data`` stands for, where ``data`` is the whole of a Git LFS
    pointer (-1 where its size line is missing); else None."""
    if len(data) >= MAX_BYTES or not data.startswith(START):
        return None
    m = _SIZE.search(data)
    return int(m[1]) if m else -1


def is_pointer_file(path: str | os.PathLike) -> bool:
    """Is the local file at ``path`` a Git LFS pointer (False where it cannot be read)?"""
    try:
        if not_a_file(path):  # a pipe would wait forever on open
            return False
        with open(path, "rb") as f:
            return size_stood_for(f.read(MAX_BYTES)) is not None
    except OSError:
        return False


def refuse(path: str, data: bytes) -> None:
    """Refuse ``data``, a whole file's bytes, where it is a pointer."""
    size = size_stood_for(data)
    if size is not None:
        known = f" ({size:,} bytes, never downloaded)" if size >= 0 else " (never downloaded)"
        raise DataError(f"{path} is a Git LFS pointer, not the file it stands for{known}; {FETCH}")
