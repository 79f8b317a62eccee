"""The unit a partition is made of: a file, or a byte range or row groups of one, as the run
plan records it (serialized here and only here), and a partition's cursor: the piece where
reading resumes and the position in it.

A partition's spec is ``{"pieces": [...]}``; plans of older tokshard versions (one file, range
or run of .txt files per partition, with cursors that name no piece) are read as the same
pieces, so a folder started by one resumes with this one."""

from __future__ import annotations

from typing import Any, NamedTuple

from pipeline.sources.base import Cursor
from pipeline.sources.files.access import file_size


class Piece(NamedTuple):
    """A file, or part of one, that a partition reads (an immutable record; a named tuple
    because a plan makes one per file, 100,000 of them for as many small files)."""

    path: str
    kind: str
    #: planned bytes (a parquet piece of chosen row groups: theirs, compressed): progress units
    size: int
    #: .jsonl: the byte range [start, end) whose lines it owns; ``end`` None: the whole file
    start: int = 0
    end: int | None = None
    #: .parquet: these row groups; None: all of them
    row_groups: tuple[int, ...] | None = None
    #: a local file: its modification time (ns) as listed, checked when it is opened
    mtime: int | None = None
    #: `pipeline.sources.files.fingerprints.content_sample` of the bytes a piece of a large
    #: file reads, checked before they are used
    sample: str | None = None
    #: an object: its version tag as listed, checked when it is opened
    etag: str | None = None

    @property
    def whole(self) -> bool:
        return self.end is None and self.row_groups is None

    @property
    def stop(self) -> int:
        """Where the piece's bytes end (a .jsonl range reads on to finish its last line)."""
        return self.start + self.size if self.end is None else self.end

    @property
    def key(self) -> str:
        if self.end is not None:
            return f"{self.path}@{self.start}-{self.end}"
        if self.row_groups is not None:
            return f"{self.path}#rg{self.row_groups[0]}-{self.row_groups[-1]}"
        return self.path

    def to_json(self) -> dict[str, Any]:
        """The piece as the plan records it: its fields, those left at their defaults omitted."""
        found: dict[str, Any] = {"path": self.path, "kind": self.kind, "size": self.size}
        if self.start:
            found["start"] = self.start
        if self.end is not None:
            found["end"] = self.end
        if self.row_groups is not None:
            found["row_groups"] = list(self.row_groups)
        if self.mtime is not None:
            found["mtime"] = self.mtime
        if self.sample is not None:
            found["sample"] = self.sample
        if self.etag is not None:
            found["etag"] = self.etag
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Piece:
        groups = data.get("row_groups")
        return cls(**data) if groups is None else cls(**{**data, "row_groups": tuple(groups)})


def partition_spec(pieces: list[Piece]) -> dict[str, Any]:
    return {"pieces": [p.to_json() for p in pieces]}


def partition_key(pieces: list[Piece]) -> str:
    """A partition's key: its first piece's, and how many follow."""
    return pieces[0].key if len(pieces) == 1 else f"{pieces[0].key}+{len(pieces) - 1}"


def pieces_of(spec: dict[str, Any], size: int) -> list[Piece]:
    """A partition's pieces (``size``: its planned bytes, which an older plan's one piece has)."""
    if "pieces" in spec:
        return [Piece.from_json(p) for p in spec["pieces"]]
    kind = spec["kind"]
    if kind == ".txt":
        return [Piece(path, kind, file_size(path)) for path in spec["files"]]
    if kind == ".jsonl":
        start, end = spec["start"], spec["end"]
        return [Piece(spec["path"], kind, end - start, start, end, sample=spec.get("sample"))]
    if kind == ".parquet":
        return [Piece(spec["path"], kind, size, row_groups=tuple(spec["row_groups"]))]
    return [Piece(spec["path"], kind, size)]


def resume_point(spec: dict[str, Any], cursor: Cursor | None) -> tuple[int, dict[str, Any] | None]:
    """The piece a cursor resumes in and its position there (None: from the piece's start)."""
    if cursor is None:
        return 0, None
    if "piece" in cursor:
        position = {k: v for k, v in cursor.items() if k != "piece"}
        return cursor["piece"], position or None
    if "pieces" not in spec and spec["kind"] == ".txt":  # an older plan's: files done so far
        return cursor["file"], None
    return 0, dict(cursor)
