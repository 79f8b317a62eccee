"""Arrow IPC files: what `datasets`' ``save_to_disk`` writes (``data-00000-of-00003.arrow``,
the stream format) and what Feather v2 / ``pyarrow.ipc.new_file`` write (the file format). A
file is one piece, read batch by batch, the text column only; a document's location is its
row in the file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from pipeline.format.errors import TokshardError
from pipeline.format.provenance import Input
from pipeline.sources.base import Record
from pipeline.sources.files.formats import ARROW_FILE_MAGIC
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader, corrupt_is_one_line, open_piece
from pipeline.sources.files.readers.jsonl import checked
from pipeline.sources.text_columns import is_text_type


class ArrowReader(Reader):
    kinds = (".arrow",)

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        with corrupt_is_one_line(piece.path, "Arrow"), open_piece(piece) as f:
            yield from self._records(f, piece, place, position["row"] if position else 0)

    def _records(self, f: BinaryIO, piece: Piece, place: Place, skip: int) -> Iterator[Record]:
        path, field = piece.path, self.text_field
        batches = record_batches(f)
        schema = next(batches)
        if field not in schema.names:
            raise TokshardError(
                f"{path}: no column {field!r} (columns: {', '.join(schema.names)}); set text_field"
            )
        col_type = schema.field(field).type
        if not is_text_type(col_type):
            raise TokshardError(f"{path}: column {field!r} is {col_type}, not text; set text_field")
        column = schema.get_field_index(field)
        origin = Input(path, "row")
        row = 0
        for batch in batches:
            if row + batch.num_rows <= skip:
                row += batch.num_rows
                continue
            progress = place.before + min(piece.size, _position(f))
            for value in batch.column(column).to_pylist():
                row += 1
                if row <= skip:
                    continue
                text, bad = (None, f"missing field {field!r}") if value is None else checked(value)
                yield Record(text, place.cursor(row=row), f"{path} row {row}", bad, progress, origin, row - 1)


def record_batches(f: BinaryIO) -> Iterator[Any]:
    """The file's schema, then its record batches in order, whichever IPC format it is in."""
    import pyarrow as pa

    head = f.read(len(ARROW_FILE_MAGIC))
    f.seek(0)
    if head == ARROW_FILE_MAGIC:
        reader = pa.ipc.open_file(f)
        yield reader.schema
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
        return
    reader = pa.ipc.open_stream(f)
    yield reader.schema
    yield from reader


def _position(f: BinaryIO) -> int:
    with contextlib.suppress(OSError, ValueError):
        return f.tell()
    return 0
