"""The unit a partition is made of: a file, or a byte range or row groups of one, as the run
plan records it (serialized here and only here), and a partition's cursor: the piece where
reading resumes and the position in it.

A partition's spec is ``{"pieces": [...]}``, each piece a plain tuple of `Piece`'s fields (what
a task carries to its worker: pickled as plain data, where a named tuple or a dict per file
would cost more to pickle and unpickle; `pieces_of` makes them `Piece`s again). The plan writes
each piece as a reference
into its split's file table, the origin's entries, which the plan holds anyway (`FileTable`):
the entry's index alone for a whole file as listed, else the index and what differs, so
100,000 small files are named once in the plan, not twice. Plans of older tokshard versions
(pieces written whole; or one file, range or run of .txt files per partition, with cursors
that name no piece) are read as the same pieces, so a folder started by one resumes with this
one."""

from __future__ import annotations

from collections.abc import Sequence
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
    #: .parquet: these row groups; .arrow: these record batches; None: all of them
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
    """A partition's spec: its pieces as plain tuples (the plan writes them through `FileTable`)."""
    return {"pieces": [tuple(p) for p in pieces]}


class FileTable:
    """A split's files as the run's origin lists them (each entry's path, size and, as listed,
    modification time or version tag), which the plan's pieces refer to by index."""

    def __init__(self, entries: Sequence[dict[str, Any]]) -> None:
        self.entries = entries
        self._index: dict[str, int] | None = None
        self._next = 0  # where the next piece's file is, most likely (pieces are in file order)

    def _position(self, path: str) -> int | None:
        """The index of ``path``'s entry (the one after the last piece's first)."""
        i: int | None = self._next
        if i >= len(self.entries) or self.entries[i]["path"] != path:  # type: ignore[operator]
            if self._index is None:
                self._index = {e["path"]: i for i, e in enumerate(self.entries)}
            i = self._index.get(path)
        if i is not None:
            self._next = i + 1
        return i

    def listed(self, i: int, kind: str) -> Piece:
        """Entry ``i`` as a whole piece of ``kind``, with what its worker checks (size, time,
        version tag): the piece a small file becomes at planning."""
        e = self.entries[i]
        return Piece(e["path"], kind, e["size"], 0, None, None, e.get("mtime"), None, e.get("etag"))

    def spec_json(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A partition's spec as the plan writes it: ``kind``, the first piece's, and each piece
        as the index of its file (a piece of `listed` form) or ``{"file": index, ...}`` with the
        fields that differ from that form (a piece of a file not in the table: written whole)."""
        if "pieces" not in spec:  # an older plan's, kept as it was
            return spec
        pieces: list[tuple] = spec["pieces"]
        kind = pieces[0][1] if pieces else None
        written: list[int | dict[str, Any]] = []
        for piece in pieces:
            i = self._position(piece[0])
            written.append(Piece._make(piece).to_json() if i is None else self._piece_json(piece, i, kind))
        return {"kind": kind, "pieces": written}

    def _piece_json(self, piece: tuple, i: int, kind: str | None) -> int | dict[str, Any]:
        e = self.entries[i]
        if piece[1:] == (kind, e["size"], 0, None, None, e.get("mtime"), None, e.get("etag")):
            return i  # (`listed`'s fields, without building the piece: one per input file)
        listed = self.listed(i, kind)  # type: ignore[arg-type]
        found: dict[str, Any] = {"file": i}
        for name, value, base in zip(Piece._fields, piece, listed, strict=True):
            if value != base:
                found[name] = list(value) if name == "row_groups" and value is not None else value
        return found

    def spec_of_json(self, data: dict[str, Any]) -> dict[str, Any]:
        """The inverse of `spec_json` (a spec of an older plan: its pieces written whole)."""
        if "pieces" not in data:
            return data
        kind = data.get("kind")
        return {"pieces": [tuple(self._piece_of_json(p, kind)) for p in data["pieces"]]}

    def _piece_of_json(self, data: int | dict[str, Any], kind: str | None) -> Piece:
        if isinstance(data, int):
            return self.listed(data, kind)  # type: ignore[arg-type]
        if "file" not in data:
            return Piece.from_json(data)
        changed = {k: v for k, v in data.items() if k != "file"}
        if changed.get("row_groups") is not None:
            changed["row_groups"] = tuple(changed["row_groups"])
        return self.listed(data["file"], changed.pop("kind", kind))._replace(**changed)


def partition_key(pieces: list[Piece]) -> str:
    """A partition's key: its first piece's, and how many follow."""
    return pieces[0].key if len(pieces) == 1 else f"{pieces[0].key}+{len(pieces) - 1}"


def pieces_of(spec: dict[str, Any], size: int) -> list[Piece]:
    """A partition's pieces (``size``: its planned bytes, which an older plan's one piece has)."""
    if "pieces" in spec:
        return list(map(Piece._make, spec["pieces"]))
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
