"""Parquet: a run of a file's row groups, the text column only, pages checked."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.access import open_binary
from pipeline.sources.files.readers.base import Reader
from pipeline.sources.files.readers.jsonl import checked


class ParquetReader(Reader):
    kinds = (".parquet",)

    def read(self, spec: dict[str, Any], cursor: Cursor | None, size: int) -> Iterator[Record]:
        path = spec["path"]
        with corrupt_parquet_is_one_line(path), open_binary(path) as f:
            yield from self._records(f, spec, cursor, size)

    def _records(
        self, f: BinaryIO, spec: dict[str, Any], cursor: Cursor | None, size: int
    ) -> Iterator[Record]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path, field = spec["path"], self.text_field
        skip = cursor["row"] if cursor else 0
        total_rows = max(spec["rows"], 1)
        # pages written with checksums are checked: a flipped byte is an error, not other text
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        if field not in pf.schema_arrow.names:
            raise TokshardError(
                f"{path}: no column {field!r} (columns: {', '.join(pf.schema_arrow.names)}); set text_field"
            )
        col_type = pf.schema_arrow.field(field).type
        if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
            raise TokshardError(f"{path}: column {field!r} is {col_type}, not text; set text_field")
        row = 0
        for batch in pf.iter_batches(batch_size=1024, row_groups=spec["row_groups"], columns=[field]):
            if row + batch.num_rows <= skip:
                row += batch.num_rows
                continue
            values = batch.column(0).to_pylist()
            for value in values:
                row += 1
                if row <= skip:
                    continue
                where = f"{path} row group {spec['row_groups'][0]}+, row {row}"
                text, bad = (None, f"missing field {field!r}") if value is None else checked(value)
                yield Record(text, {"row": row}, where, bad, size * row // total_rows)


@contextlib.contextmanager
def corrupt_parquet_is_one_line(path: str) -> Iterator[None]:
    """pyarrow's errors for a damaged file (bad magic, a cut footer, a flipped page) become
    one line that names the file."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError as exc:
        raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
    except (pa.ArrowException, OSError, EOFError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: corrupt parquet file ({why}); re-create it or remove it") from exc
