"""A reader per input format, chosen once by the file's kind."""

from __future__ import annotations

from pipeline.sources.files.readers.base import Reader
from pipeline.sources.files.readers.compressed import CompressedJsonLinesReader
from pipeline.sources.files.readers.jsonl import JsonLinesReader
from pipeline.sources.files.readers.parquet import ParquetReader
from pipeline.sources.files.readers.txt import TextReader

READERS: dict[str, type[Reader]] = {
    kind: cls
    for cls in (JsonLinesReader, CompressedJsonLinesReader, ParquetReader, TextReader)
    for kind in cls.kinds
}


def reader_for(kind: str, text_field: str) -> Reader:
    return READERS[kind](text_field)
