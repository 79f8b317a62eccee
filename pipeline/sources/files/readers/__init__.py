"""A reader per input format, chosen once per piece by its kind, and a partition read piece
after piece from its cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.pieces import pieces_of, resume_point
from pipeline.sources.files.readers.arrow import ArrowReader
from pipeline.sources.files.readers.base import Place, Reader
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
    pieces = pieces_of(spec, size)
    first, position = resume_point(spec, cursor)
    readers: dict[str, Reader] = {}
    before = sum(p.size for p in pieces[:first])
    with Prefetch(pieces[first:]) as prefetch:
        for index in range(first, len(pieces)):
            piece = pieces[index]
            if piece.kind not in readers:
                readers[piece.kind] = READERS[piece.kind](text_field, prefetch.open)
            at = position if index == first else None
            yield from readers[piece.kind].read(piece, Place(index, before), at)
            before += piece.size
