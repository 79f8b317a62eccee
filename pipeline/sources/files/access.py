"""Bytes of an input file, local or in an object store (fsspec, only for URLs), raw or
decompressed, and the one line that says why a file cannot be read."""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import lzma
import os
from typing import Any, BinaryIO

from pipeline.format.errors import DataError
from pipeline.sources.files.zstd_frames import ZstdFrames
from pipeline.storage.locations import is_url, protocol
from pipeline.storage.object_store import errors as store_errors
from pipeline.storage.object_store import open_object, url_filesystem


def open_binary(path: str) -> BinaryIO:
    """The file's raw bytes, buffered for sequential reads (an object's metadata read past the
    filesystem's listing cache: it may have changed since this process listed it); a local
    file that cannot be opened is one line saying why."""
    if is_url(path):
        with store_errors(path):
            fs, p = url_filesystem(path)
            fs.invalidate_cache(p)
            try:
                f = open_object(fs, p, path)
            except FileNotFoundError as exc:  # listed, then deleted: the data's fault, as locally
                raise unreadable(path, exc) from exc
            if protocol(path) in ("http", "https") and (f.size or 0) > f.blocksize:
                f.seek(f.size - 1)  # a server without byte ranges fails here, not mid-read
                f.read(1)
                f.seek(0)
            return f
    return open_local(path, 1 << 20)


def open_local(path: str, buffering: int) -> BinaryIO:
    """A local file's raw bytes, opened without waiting: a FIFO put where a listed file was
    would block the open until someone wrote to it (the caller's check of size and time then
    refuses it)."""
    try:
        return open(path, "rb", buffering=buffering, opener=_without_waiting)
    except OSError as exc:
        raise unreadable(path, exc) from exc


def _without_waiting(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def file_size(path: str) -> int:
    if is_url(path):
        with store_errors(path):
            fs, p = url_filesystem(path)
            try:
                return int(fs.size(p))
            except FileNotFoundError as exc:
                raise unreadable(path, exc) from exc
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise unreadable(path, exc) from exc


def version_tag(info: dict[str, Any]) -> str | None:
    """The version an object store gives an object in its listing and its metadata (S3's
    ETag, changed by every write), or None where the store gives none."""
    tag = info.get("ETag") or info.get("etag")
    return str(tag) if tag else None


def same_version(listed: str, opened: str) -> bool:
    """Whether a listing's version tag and an opened object's name one version. The quotes
    around an ETag (and a weak one's ``W/``) are not part of it: some S3-compatible stores
    (NetApp ONTAP) leave them out of listings while their HEAD answers carry them."""
    return _bare_tag(listed) == _bare_tag(opened)


def _bare_tag(tag: str) -> str:
    return tag.removeprefix("W/").strip('"')


def decompress(raw: BinaryIO, kind: str) -> BinaryIO:
    """The decompressed bytes of a compressed JSON Lines file's raw bytes (`formats.COMPRESSED`)."""
    if kind == ".jsonl.gz":
        return gzip.GzipFile(fileobj=raw)
    if kind == ".jsonl.xz":
        return lzma.LZMAFile(raw)
    if kind == ".jsonl.bz2":
        return bz2.BZ2File(raw)
    return io.BufferedReader(ZstdFrames(raw), 1 << 20)


def decompressed(path: str, kind: str) -> BinaryIO:
    return decompress(open_binary(path), kind)


#: why a local file cannot be read, and what to do, by errno
_UNREADABLE = {
    errno.EACCES: "permission denied; make it readable (chmod), or narrow the glob",
    errno.EPERM: "permission denied; make it readable (chmod), or narrow the glob",
    errno.EISDIR: "it is a directory; name the files in it",
    errno.ENOTDIR: "a folder in its path is a file; check the path",
    errno.ELOOP: "its symbolic links loop; fix the link",
    errno.EIO: "an I/O error (a failing disk or a network filesystem gone?); fix the disk or mount, then rerun",
    errno.ENOTCONN: "its filesystem is not connected (an unmounted network or FUSE filesystem?); mount it, then rerun",
    errno.ESTALE: "a stale network filesystem handle; remount it, then rerun",
}


def unreadable(path: str, exc: OSError) -> DataError:
    """One line for an input the system refuses to read, saying why and what to do: a fault
    of the data where the command named (exit 1), never a file left out."""
    if isinstance(exc, FileNotFoundError):
        return DataError(f"input {path} is gone; restore it and rerun")
    why = _UNREADABLE.get(exc.errno or 0) or f"{exc.strerror or exc}; check the file, then rerun"
    return DataError(f"cannot read input {path}: {why}")
