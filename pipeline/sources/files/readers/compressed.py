"""JSON Lines compressed with gzip or zstd: read from the start (a compressed stream cannot be
entered in the middle), so each file is read whole, by line number."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import DataError
from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.access import decompressed
from pipeline.sources.files.readers.base import Reader
from pipeline.sources.files.readers.jsonl import json_text


class CompressedJsonLinesReader(Reader):
    kinds = (".jsonl.gz", ".jsonl.zst")

    def read(self, spec: dict[str, Any], cursor: Cursor | None, size: int) -> Iterator[Record]:
        path = spec["path"]
        skip = cursor["line"] if cursor else 0
        try:
            with decompressed(path, spec["kind"]) as f:
                for lineno, line in enumerate(f, 1):
                    if lineno <= skip or not line or line.isspace():
                        continue
                    text, bad = json_text(line, self.text_field)
                    yield Record(text, {"line": lineno}, f"{path}:{lineno}", bad, _raw_pos(f))
        except FileNotFoundError as exc:
            raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
        except (OSError, EOFError) as exc:
            raise DataError(f"{path}: corrupt compressed file ({exc}); re-create it or remove it") from exc
        except Exception as exc:
            if type(exc).__name__ == "ZstdError":
                raise DataError(f"{path}: corrupt zstd file ({exc}); re-create it or remove it") from exc
            raise


def _raw_pos(f: Any) -> int:
    """Compressed bytes consumed so far (progress only; 0 if the stream does not say)."""
    try:
        return f.fileobj.tell() if isinstance(f, gzip.GzipFile) else f.raw.tell()
    except (AttributeError, OSError, ValueError):
        return 0
