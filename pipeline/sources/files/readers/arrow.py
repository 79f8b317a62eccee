"""Arrow IPC files: what `datasets`' ``save_to_disk`` writes (``data-00000-of-00003.arrow``,
the stream format) and what Feather v2 / ``pyarrow.ipc.new_file`` write (the file format). The
text column only, batch by batch; a document's location is its row in the file. A large local
file is planned as runs of its record batches, as a parquet file is of its row groups, so one
file spreads over several workers; a local file is read memory-mapped, where skipping the
batches before a run reads only their headers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import TokshardError
from pipeline.format.provenance import Input
from pipeline.sources.base import NAME_THE_FIELD, Record, no_column
from pipeline.sources.files.formats import ARROW_FILE_MAGIC
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader, corrupt_is_one_line, row_place
from pipeline.sources.files.readers.jsonl import column_texts
from pipeline.sources.text_columns import holds_text
from pipeline.storage.locations import is_url


class ArrowReader(Reader):
    kinds = (".arrow",)

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        import pyarrow as pa

        with corrupt_is_one_line(piece.path, "Arrow"), self.open(piece) as f:  # checked as planned
            mapped = None if is_url(piece.path) else pa.memory_map(piece.path)
            with mapped or contextlib.nullcontext():
                yield from self._records(mapped or f, piece, place, position["row"] if position else 0)

    def _records(self, source: Any, piece: Piece, place: Place, skip: int) -> Iterator[Record]:
        path, field = piece.path, self.text_field
        batches = record_batches(source)
        schema = next(batches)
        if field not in schema.names:
            raise no_column(path, field, schema.names)
        col_type = schema.field(field).type
        if not holds_text(col_type):
            raise TokshardError(f"{path}: column {field!r} is {col_type}, not text; {NAME_THE_FIELD}")
        column = schema.get_field_index(field)
        wanted = None if piece.row_groups is None else set(piece.row_groups)
        last = None if piece.row_groups is None else max(piece.row_groups)
        origin = Input(path, "row")
        first_row = 0  # rows of the file before the piece's first batch
        row = 0  # rows of the piece read
        done = 0  # bytes of the piece's batches read: its progress
        for index, batch in enumerate(batches):
            if wanted is not None and index not in wanted:
                if index > last:
                    break
                first_row += batch.num_rows
                continue
            done += batch.nbytes
            if row + batch.num_rows <= skip:
                row += batch.num_rows
                continue
            progress = place.before + min(piece.size, done)
            for text, bad in column_texts(batch.column(column), field):
                row += 1
                if row <= skip:
                    continue
                where = row_place(path, first_row + row)
                yield Record(text, place.cursor(row=row), where, bad, progress, origin, first_row + row - 1)


def record_batches(source: Any) -> Iterator[Any]:
    """The file's schema, then its record batches in order, whichever IPC format it is in."""
    import pyarrow as pa

    if _is_file_format(source):
        reader = pa.ipc.open_file(source)
        yield reader.schema
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
        return
    reader = pa.ipc.open_stream(source)
    yield reader.schema
    yield from reader


def _is_file_format(source: Any) -> bool:
    head = source.read(len(ARROW_FILE_MAGIC))
    source.seek(0)
    return head == ARROW_FILE_MAGIC


def batch_sizes(path: str) -> list[int] | None:
    """The bytes of each record batch of a local Arrow file, from its messages' headers
    (memory-mapped: no batch is read); None where its batches cannot be read apart (a stream
    with dictionary batches, which later batches depend on)."""
    import pyarrow as pa

    with corrupt_is_one_line(path, "Arrow"), pa.memory_map(path) as source:
        if _is_file_format(source):
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i).nbytes for i in range(reader.num_record_batches)]
        messages = pa.ipc.MessageReader.open_stream(source)
        sizes: list[int] = []
        at = source.tell()
        while True:
            try:
                message = messages.read_next_message()
            except StopIteration:
                return sizes
            if message.type.startswith("dictionary"):
                return None
            if message.type == "record batch":
                sizes.append(source.tell() - at)
            at = source.tell()
