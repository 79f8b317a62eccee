"""`LocalFolder`: a `Place` on this machine's filesystem (also a shared one every worker mounts).

Whole-file writes are durable and atomic (`pipeline.format.atomic`: temporary name, fsync,
rename), so a crash leaves the old file or the new one. Failures become one-line
`TokshardError`s naming the path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pipeline.format.atomic import copy_file, disk_error, write_bytes
from pipeline.format.errors import TokshardError, name_too_long
from pipeline.storage.place import Place


class LocalFolder(Place):
    """A folder of the local filesystem (it need not exist yet)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.local_root = Path(root)
        self.url = str(root)

    def check_reachable(self) -> None:
        """A local folder is always reachable (whether it exists is the caller's question)."""

    def path(self, rel: str) -> Path:
        return self.local_root / rel if rel else self.local_root

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return self.path(rel).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if name_too_long(exc):
                return None
            raise TokshardError(f"cannot read {self.path(rel)}: {exc.strerror or exc}") from exc

    def write_bytes(self, rel: str, data: bytes) -> None:
        path = self.path(rel)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, path) from exc
        write_bytes(path, data)

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def size(self, rel: str) -> int | None:
        try:
            return self.path(rel).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            if name_too_long(exc):
                return None
            raise

    def list(self, prefix: str = "") -> dict[str, int]:
        top = self.path(prefix)
        try:
            if top.is_file():
                return {prefix: top.stat().st_size}
        except OSError as exc:
            if name_too_long(exc):
                return {}
            raise
        found = {}
        for path in sorted(top.rglob("*")) if top.is_dir() else []:
            with contextlib.suppress(FileNotFoundError):  # removed while listed
                if path.is_file():
                    found[path.relative_to(self.local_root).as_posix()] = path.stat().st_size
        return found

    def names(self) -> list[str]:
        try:
            entries = list(os.scandir(self.local_root))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.name + ("/" if e.is_dir() else "") for e in entries)

    def upload(self, local: str | os.PathLike, rel: str) -> None:
        path = self.path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        copy_file(local, path)

    def download(self, rel: str, local: str | os.PathLike) -> None:
        try:
            shutil.copyfile(self.path(rel), local)
        except FileNotFoundError:
            raise TokshardError(f"{self.path(rel)} does not exist") from None

    def delete(self, rel: str) -> None:
        self.path(rel).unlink(missing_ok=True)

    @contextlib.contextmanager
    def open_read(self, rel: str) -> Iterator[BinaryIO]:
        try:
            f = open(self.path(rel), "rb")
        except FileNotFoundError:
            raise TokshardError(f"{self.path(rel)} does not exist") from None
        with f:
            yield f
