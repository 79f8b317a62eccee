"""Plain text: each .txt file is one document; a large one reaches the encoder as a stream."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import DataError
from pipeline.format.provenance import Input
from pipeline.sources.base import Record
from pipeline.sources.files.access import open_binary
from pipeline.sources.files.formats import HEAD_BYTES, check_compression, check_text_head
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader

#: .txt files larger than this reach the encoder as a stream, never as one string
STREAM_TXT_BYTES = 16 << 20
_STREAM_CHUNK = 4 << 20


def where_undecodable(path: str, at: int) -> str:
    """A file that is one document names the byte where it stops being UTF-8: a Latin-1
    book, say, shows its first é."""
    return f"{path} (byte {at:,})"


#: a run of NUL bytes no text holds: where a file has one, it is preallocated, or was cut by a
#: crash (zeros where its last blocks were never written), or binary, and a .txt of it was read
#: as that many NUL tokens
NUL_RUN = bytes(4096)


def refuse_nul_run(path: str, data: bytes, before: int = 0) -> None:
    """Refuse ``data`` (bytes of ``path`` from ``before`` on) where it holds a `NUL_RUN`."""
    at = data.find(NUL_RUN)
    if at >= 0:
        raise DataError(
            f"{path} holds a run of NUL bytes from byte {before + at:,} on, not text: a file preallocated "
            "or cut short by a crash, or binary data; repair it or leave it out of the inputs"
        )


class TextStream:
    """A document too large to hold as one string: UTF-8 decoded chunk by chunk. Where it
    is not UTF-8, iterating raises UnicodeDecodeError and `where` names the byte."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self.where = path

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        read = 0  # bytes given to the decoder so far, the byte-order mark included
        with open_binary(self.path) as f:
            chunk = f.read(_STREAM_CHUNK)
            if chunk.startswith(codecs.BOM_UTF8):  # a BOM is no text (as in JSON lines)
                chunk, read = chunk[len(codecs.BOM_UTF8) :], len(codecs.BOM_UTF8)
            while chunk:
                refuse_nul_run(self.path, chunk, read)
                yield self._decoded(decoder, chunk, read)
                read += len(chunk)
                chunk = f.read(_STREAM_CHUNK)
            yield self._decoded(decoder, b"", read, final=True)

    def _decoded(
        self, decoder: codecs.IncrementalDecoder, chunk: bytes, read: int, final: bool = False
    ) -> str:
        held = len(decoder.getstate()[0])  # an earlier chunk's unfinished character, decoded with this one
        try:
            return decoder.decode(chunk, final=final)
        except UnicodeDecodeError as e:
            self.where = where_undecodable(self.path, read - held + e.start)
            raise


class TextReader(Reader):
    """One document per piece; the cursor after it names the next piece."""

    kinds = (".txt",)

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        path = piece.path
        cursor, progress, origin = (
            {"piece": place.index + 1},
            place.before + piece.size,
            Input(path, "offset"),
        )
        if piece.size > STREAM_TXT_BYTES:
            with self.open(piece) as f:
                head = f.read(HEAD_BYTES)
            check_compression(path, ".txt", head)
            check_text_head(path, head, ".txt")
            yield Record(TextStream(path, piece.size), cursor, path, None, progress, origin)  # type: ignore[arg-type]
            return
        with self.open(piece) as f:
            data = f.read()
        check_compression(path, ".txt", data[:HEAD_BYTES])
        check_text_head(path, data[:HEAD_BYTES], ".txt")
        refuse_nul_run(path, data)
        where = path
        try:
            text, bad = data.decode("utf-8-sig"), None  # a BOM is no text (as in JSON lines)
        except UnicodeDecodeError as e:
            at = e.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
            text, bad, where = None, "invalid UTF-8", where_undecodable(path, at)
        yield Record(text, cursor, where, bad, progress, origin)
