"""The hashes a manifest records: xxh3-128 of each shard file, sha256 of the tokenizer file.

Written by the shard writer, checked by `pipeline.format.verify` (for `tokshard verify` and
`tokshard train --verify` alike) and by the trainer's data cache.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

import xxhash

from pipeline.format.file_kind import require_file

HASH_NAME = "xxh3_128"
READ_CHUNK = 1 << 24


def new_hasher() -> xxhash.xxh3_128:
    """An incremental hasher for a file being written (`recorded` turns it into the text)."""
    return xxhash.xxh3_128()


def recorded(hasher: xxhash.xxh3_128) -> str:
    """The hash as the manifest records it: ``xxh3_128:<hex>``."""
    return f"{HASH_NAME}:{hasher.hexdigest()}"


def bytes_hash(data: bytes) -> str:
    return recorded(xxhash.xxh3_128(data))


def file_hash(path: str | os.PathLike, limit: int | None = None) -> str:
    """Hash of a file (or its first ``limit`` bytes) in the form the manifest records."""
    h = new_hasher()
    remaining = limit
    require_file(path)
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            chunk = f.read(READ_CHUNK if remaining is None else min(READ_CHUNK, remaining))
            if not chunk:
                break
            h.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return recorded(h)


def stream_hash(f: BinaryIO) -> str:
    """Hash of what ``f`` reads to its end (an object streamed from a store), as `file_hash`."""
    h = new_hasher()
    while chunk := f.read(READ_CHUNK):
        h.update(chunk)
    return recorded(h)


def sha256_file(path: str | os.PathLike) -> str:
    require_file(path)
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
