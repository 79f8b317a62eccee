"""`Place`: a folder that holds files, on this machine or in an object store.

Both sides reach stored files through this one interface: the run state of a `prepare`, its
shards and manifest, `verify` and the ownership check. Names given to its methods are relative
to the folder, with ``/`` between parts. Two implementations: `LocalFolder`
(`pipeline.storage.local_folder`) and `ObjectStore` (`pipeline.storage.object_store`); which one
a location string names is decided once, by `pipeline.storage.places.open_place`.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


class Place(ABC):
    """A folder that holds files; its methods take names relative to it."""

    #: how messages name the folder (a local path or a URL)
    url: str
    #: the folder on this machine's filesystem, or None for an object store
    local_root: Path | None = None

    @abstractmethod
    def check_reachable(self) -> None:
        """Fail now, in one line, if the place cannot be reached (endpoint, credentials, bucket)."""

    def where(self, rel: str = "") -> str:
        """How messages name ``rel`` (a path or URL)."""
        return f"{self.url.rstrip('/')}/{rel.lstrip('/')}" if rel else self.url

    @abstractmethod
    def read_bytes(self, rel: str) -> bytes | None:
        """The file's bytes, or None if there is no such file (read past every cache)."""

    @abstractmethod
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace the file whole: a reader sees the old content or the new, never a part."""

    @abstractmethod
    def exists(self, rel: str) -> bool:
        """Whether the file is there now."""

    @abstractmethod
    def list(self, prefix: str = "") -> dict[str, int]:
        """Every file under ``prefix``, recursively: relative name -> size in bytes."""

    def is_a_file(self) -> bool:
        """Whether the folder's own name is a file (an object's key, where a store has no
        folders): a place to write into it is not. A local one is refused as a path first."""
        return False

    @abstractmethod
    def names(self) -> list[str]:
        """The folder's own entries, one level, sorted, a subfolder's with a trailing ``/``;
        [] if the folder is missing or empty."""

    @abstractmethod
    def upload(self, local: str | os.PathLike, rel: str) -> None:
        """Copy a local file in; the file appears only once all of it is stored."""

    @abstractmethod
    def download(self, rel: str, local: str | os.PathLike) -> None:
        """Copy the file to a local path."""

    @abstractmethod
    def delete(self, rel: str) -> None:
        """Remove the file (nothing if it is not there)."""

    @abstractmethod
    def open_read(self, rel: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """The file opened for reading, as a context manager."""

    def size(self, rel: str) -> int | None:
        """The file's size in bytes, or None if it is not there."""
        return self.list(rel).get(rel)

    @contextlib.contextmanager
    def local_copy(self, rel: str, dest: Path) -> Iterator[Path | None]:
        """``rel`` readable as a file on this machine for the duration: the file itself in a
        local folder, else a download to ``dest`` removed afterwards (None: it is not there)."""
        if self.local_root is not None:
            path = self.local_root / rel
            yield path if path.is_file() else None
            return
        if not self.exists(rel):
            yield None
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.download(rel, dest)
        try:
            yield dest
        finally:
            dest.unlink(missing_ok=True)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"{type(self).__name__}({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by location (Dask tasks carry places): the receiver opens its own."""
        return (type(self), (self.url,))
