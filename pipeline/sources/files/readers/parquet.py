"""Parquet: a file's row groups (all, or a planned run of them), the text column only, pages
checked. A document's location is its row in the file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from pipeline.format import lfs_pointer
from pipeline.format.errors import TokshardError
from pipeline.format.provenance import Input
from pipeline.sources.base import NAME_THE_FIELD, Record, no_column
from pipeline.sources.files.formats import PARQUET_MAGIC
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader, corrupt_is_one_line, row_place
from pipeline.sources.files.readers.jsonl import column_texts
from pipeline.sources.text_columns import holds_text

BATCH_ROWS = 1024


class ParquetReader(Reader):
    kinds = (".parquet",)

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        with corrupt_is_one_line(piece.path, "parquet"), self.open(piece) as f:
            check_magic(f, piece.path)
            yield from self._records(f, piece, place, position["row"] if position else 0)

    def _records(self, f: BinaryIO, piece: Piece, place: Place, skip: int) -> Iterator[Record]:
        import pyarrow.parquet as pq

        path, field = piece.path, self.text_field
        # pages written with checksums are checked: a flipped byte is an error, not other text
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        if field not in pf.schema_arrow.names:
            raise no_column(path, field, pf.schema_arrow.names)
        col_type = pf.schema_arrow.field(field).type
        if not holds_text(col_type):
            raise TokshardError(f"{path}: column {field!r} is {col_type}, not text; {NAME_THE_FIELD}")
        meta = pf.metadata
        groups = list(range(meta.num_row_groups) if piece.row_groups is None else piece.row_groups)
        if not groups:
            return
        first_row = sum(meta.row_group(g).num_rows for g in range(groups[0]))  # rows before the piece
        rows = max(1, sum(meta.row_group(g).num_rows for g in groups))
        row = 0
        origin = Input(path, "row")
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[field]):
            if row + batch.num_rows <= skip:
                row += batch.num_rows
                continue
            for text, bad in column_texts(batch.column(0), field):
                row += 1
                if row <= skip:
                    continue
                where = row_place(path, first_row + row)
                progress = place.before + piece.size * row // rows
                yield Record(text, place.cursor(row=row), where, bad, progress, origin, first_row + row - 1)


def check_magic(f: BinaryIO, path: str) -> None:
    """A parquet file starts with its magic number too (pyarrow checks only the footer's); one
    that is a Git LFS pointer is refused as that."""
    if f.read(4) not in PARQUET_MAGIC:
        f.seek(0)
        lfs_pointer.refuse(path, f.read(lfs_pointer.MAX_BYTES))
        raise OSError("no parquet magic number at its start")
    f.seek(0)
