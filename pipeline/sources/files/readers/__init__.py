"""A reader per input format, chosen once per piece by its kind, and a partition read piece
after piece from its cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.pieces import Piece, pieces_of, resume_point
from pipeline.sources.files.readers.arrow import ArrowReader
from pipeline.sources.files.readers.base import Place, Reader, check_read
from pipeline.sources.files.readers.compressed import CompressedJsonLinesReader
from pipeline.sources.files.readers.jsonl import JsonLinesReader
from pipeline.sources.files.readers.parquet import ParquetReader
from pipeline.sources.files.readers.prefetch import Prefetch
from pipeline.sources.files.readers.txt import TextReader

READERS: dict[str, type[Reader]] = {
    kind: cls
    for cls in (JsonLinesReader, CompressedJsonLinesReader, ParquetReader, ArrowReader, TextReader)
    for kind in cls.kinds
}


def read_partition(
    spec: dict[str, Any], size: int, cursor: Cursor | None, text_field: str
) -> Iterator[Record]:
    """A partition's documents in order, from ``cursor`` on (``size``: its planned bytes)."""
    return iter(PartitionRead(spec, size, cursor, text_field))


class PartitionRead:
    """A partition's documents in order, from ``cursor`` on (iterate it), each local piece
    checked against the plan once it is read to its end (`check_read`: one stat), and the piece
    being read checked whenever `check` is called: before a commit makes what was read durable.
    A file edited in place while it is read (same size, a new time) then stops the task before
    any of its new text is committed, where it would leave the shards with the old text up to
    the reader's place and the new text after, under the old version's fingerprint."""

    def __init__(self, spec: dict[str, Any], size: int, cursor: Cursor | None, text_field: str) -> None:
        self.spec, self.size, self.cursor, self.text_field = spec, size, cursor, text_field
        #: the piece whose bytes were read last (the one whose document was given last)
        self.piece: Piece | None = None

    def __iter__(self) -> Iterator[Record]:
        pieces = pieces_of(self.spec, self.size)
        first, position = resume_point(self.spec, self.cursor)
        readers: dict[str, Reader] = {}
        before = sum(p.size for p in pieces[:first])
        with Prefetch(pieces[first:]) as prefetch:
            for index in range(first, len(pieces)):
                piece = self.piece = pieces[index]
                if piece.kind not in readers:
                    readers[piece.kind] = READERS[piece.kind](self.text_field, prefetch.open)
                at = position if index == first else None
                yield from readers[piece.kind].read(piece, Place(index, before), at)
                check_read(piece)
                before += piece.size

    def check(self) -> None:
        """The piece read last is still as planned (`check_read`); nothing to check before the first."""
        if self.piece is not None:
            check_read(self.piece)
