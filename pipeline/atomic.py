"""Durable file replacement: write a temporary name, fsync, rename, fsync the folder.

A reader sees either the old file or the whole new one, never a partial write, and a
crash right after the rename cannot lose it. Stdlib only (the manifest module uses it).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from pipeline.errors import TokshardError

TMP_SUFFIX = ".tmp"


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(tmp: Path, final: Path) -> None:
    """Rename an already fsynced temporary file over its final name, durably."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise disk_error(exc, path, len(data)) from exc


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_bytes(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def disk_error(exc: OSError, path: str | os.PathLike, needed: int | None = None) -> TokshardError:
    """Turn ENOSPC and friends into one line that says where and what to do."""
    where = Path(path).parent
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            st = os.statvfs(where)
            free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free"
        except OSError:
            free = "free space unknown"
        need = f", about {needed / 2**20:.1f} MiB more needed" if needed else ""
        return TokshardError(
            f"disk full writing {path} ({free}{need}); free space or move --out, then rerun: "
            "committed work is kept"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return TokshardError(f"cannot write {path}: {exc.strerror}; choose a writable --out")
    return TokshardError(f"cannot write {path}: {exc.strerror or exc}")
