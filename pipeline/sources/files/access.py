"""Bytes of an input file, local or in an object store (fsspec, only for URLs), raw or
decompressed."""

from __future__ import annotations

import gzip
import io
import os
from typing import BinaryIO

from pipeline.format.store import errors as store_errors
from pipeline.format.store import is_url
from pipeline.sources.files.zstd_frames import ZstdFrames


def open_binary(path: str) -> BinaryIO:
    """The file's raw bytes, buffered for sequential reads."""
    if is_url(path):
        import fsspec

        with store_errors(path):
            return fsspec.open(path, "rb").open()
    return open(path, "rb", buffering=1 << 20)


def file_size(path: str) -> int:
    if is_url(path):
        import fsspec

        with store_errors(path):
            fs, p = fsspec.core.url_to_fs(path)
            return int(fs.size(p))
    return os.path.getsize(path)


def decompressed(path: str, kind: str) -> BinaryIO:
    """The decompressed bytes of a .jsonl.gz or .jsonl.zst file."""
    raw = open_binary(path)
    if kind == ".jsonl.gz":
        return gzip.GzipFile(fileobj=raw)
    return io.BufferedReader(ZstdFrames(raw), 1 << 20)
