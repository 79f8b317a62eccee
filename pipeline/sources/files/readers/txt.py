"""Plain text: each .txt file is one document; a large one reaches the encoder as a stream."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from pipeline.sources.base import Cursor, Record
from pipeline.sources.files.access import file_size, open_binary
from pipeline.sources.files.readers.base import Reader

#: .txt files larger than this reach the encoder as a stream, never as one string
STREAM_TXT_BYTES = 16 << 20
_STREAM_CHUNK = 4 << 20


class TextStream:
    """A document too large to hold as one string: UTF-8 decoded chunk by chunk."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")  # a BOM is no text
        with open_binary(self.path) as f:
            while chunk := f.read(_STREAM_CHUNK):
                yield decoder.decode(chunk)
            yield decoder.decode(b"", final=True)


class TextReader(Reader):
    kinds = (".txt",)

    def read(self, spec: dict[str, Any], cursor: Cursor | None, size: int) -> Iterator[Record]:
        files = spec["files"]
        done = 0
        for i, path in enumerate(files):
            nbytes = file_size(path)
            done += nbytes
            if cursor and i < cursor["file"]:
                continue
            if nbytes > STREAM_TXT_BYTES:
                yield Record(TextStream(path, nbytes), {"file": i + 1}, path, None, done)  # type: ignore[arg-type]
                continue
            with open_binary(path) as f:
                data = f.read()
            try:
                text, bad = data.decode("utf-8-sig"), None  # a BOM is no text (as in JSON lines)
            except UnicodeDecodeError:
                text, bad = None, "invalid UTF-8"
            yield Record(text, {"file": i + 1}, path, bad, done)
