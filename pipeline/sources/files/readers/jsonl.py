"""JSON Lines, uncompressed: a whole file, or a line-aligned byte range of one (a range owns
the lines that *start* in it and reads on past its end to finish the last one). A document's
location is the byte offset of its line."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import orjson

from pipeline.format.provenance import Input
from pipeline.sources.base import Record, missing_field, null_field
from pipeline.sources.files.access import open_binary
from pipeline.sources.files.formats import HEAD_BYTES, UTF8_BOM, check_compression, check_text_head
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place, Reader, small_file_bytes
from pipeline.sources.files.readers.long_json import LONG_LINE_BYTES, TextPieces, text_pieces
from pipeline.storage.locations import is_url


class JsonLinesReader(Reader):
    kinds = (".jsonl",)

    def read(self, piece: Piece, place: Place, position: dict[str, Any] | None) -> Iterator[Record]:
        pos = 0 if position is None else position["offset"]
        data = small_file_bytes(piece)
        if data is not None:  # a small whole file: its lines cut from its bytes in memory
            yield from self._records(piece, place, pos, functools.partial(line_in, data))
            return
        with self.open(piece) as f:
            if position is not None:
                f.seek(pos)
            elif piece.start > 0:  # the line under way at ``start`` belongs to the piece before
                pos = after_newline(f, piece.start - 1)
                f.seek(pos)
            read_line = (
                (lambda _pos: f.readline()) if is_url(piece.path) else functools.partial(read_line_at, f)
            )
            yield from self._records(piece, place, pos, read_line)

    def _records(
        self, piece: Piece, place: Place, pos: int, read_line: Callable[[int], bytes]
    ) -> Iterator[Record]:
        """The piece's documents from the line at ``pos`` on (``read_line``: the line there)."""
        path, start, end = piece.path, piece.start, piece.stop
        head_unchecked = pos == 0
        origin = Input(path, "offset")
        while pos < end:
            line = read_line(pos)
            if not line:
                break
            line_start = (
                len(UTF8_BOM) if pos == 0 and line.startswith(UTF8_BOM) else pos
            )  # (its JSON's place)
            pos += len(line)
            if line.isspace():  # (strip() would copy a long line to find out)
                continue
            if head_unchecked:
                check_compression(path, ".jsonl", line[:HEAD_BYTES])
                check_text_head(path, line[:HEAD_BYTES], ".jsonl")
                head_unchecked = False
            text, bad = line_text(line, self.text_field)
            where = f"{path}:{line_number(path, line_start)}" if bad else path
            yield Record(
                text,
                place.cursor(offset=pos),
                where,
                bad,
                place.before + pos - start,
                origin,
                line_start,
            )


def line_text(line: bytes, field: str) -> tuple[str | TextPieces | None, str | None]:
    """`json_text`, with a long line's text decoded in pieces where `text_pieces` can prove them."""
    if len(line) > LONG_LINE_BYTES and (pieces := text_pieces(line, field)) is not None:
        return pieces, None
    return json_text(line, field)


def json_text(line: bytes, field: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason) for one JSON line.

    orjson parses (parsing is most of a task's time besides encoding); what it refuses goes to
    `json`, which accepts a little more (a BOM, NaN, lone surrogates) and names the fault, so
    every UTF-8 line reads exactly as `json` reads it."""
    try:
        obj, strict = orjson.loads(line), True
    except orjson.JSONDecodeError:
        strict = False
        try:  # decoded here: `json` would take bytes of UTF-16 or UTF-32 for that text
            obj = json.loads(line.decode("utf-8-sig", "surrogatepass"), parse_int=_integer)
        except UnicodeDecodeError:
            return None, "invalid UTF-8"
        except ValueError:  # json.JSONDecodeError, and any other refusal of the line
            return None, "malformed JSON"
        except RecursionError:
            return None, "JSON nested too deeply"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    if field not in obj:
        return None, missing_field(field, obj)
    text = obj[field]
    if text is None:
        return None, null_field(field)
    if not isinstance(text, str):
        return None, f"non-string field {field!r}"
    return (text, None) if strict else checked(text)  # orjson refuses lone surrogates itself


class LongInteger:
    """An integer of more digits than Python converts from text (4,300 by default): orjson
    refuses any beyond 64 bits, and `json` raises on these. Only the text field's value
    matters, so another field's such number is kept unconverted; as the text field it is a
    non-string field, as any number is."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits


def _integer(digits: str) -> int | LongInteger:
    return int(digits) if len(digits) < sys.get_int_max_str_digits() else LongInteger(digits)


def column_text(value: str | bytes | None, field: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason) for one value of a text column (parquet, Arrow), or of a
    column of bytes read as UTF-8 (`text_columns.is_bytes_type`)."""
    if value is None:
        return None, null_field(field)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None  # strict: refuses encoded surrogates too
        except UnicodeDecodeError:
            return None, "invalid UTF-8"
    return checked(value)


def column_texts(column: Any, field: str) -> list[tuple[str | None, str | None]]:
    """`column_text` for each value of an Arrow text column. Arrow does not check that a string
    column holds UTF-8 (Spark and other writers store raw web bytes there), and converting a
    column fails as a whole on one bad value: each value of such a column is then converted
    alone, and the bad one is a bad record, as an undecodable JSON line is."""
    try:
        values = column.to_pylist()
    except UnicodeDecodeError:
        return [_one_value(column, i, field) for i in range(len(column))]
    return [column_text(value, field) for value in values]


def _one_value(column: Any, i: int, field: str) -> tuple[str | None, str | None]:
    try:
        value = column[i].as_py()
    except UnicodeDecodeError:
        return None, "invalid UTF-8"
    return column_text(value, field)


def checked(text: str) -> tuple[str | None, str | None]:
    """Lone surrogates (from JSON escapes) cannot be UTF-8 encoded: a bad record, not a crash."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None, "invalid unicode (lone surrogate)"
    return text, None


def line_number(path: str, offset: int) -> int:
    """1-based line number of the byte at ``offset`` (only computed to report an error)."""
    count = 0
    with open_binary(path) as f:
        remaining = offset
        while remaining > 0 and (chunk := f.read(min(1 << 24, remaining))):
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count + 1


def line_in(data: bytes, pos: int) -> bytes:
    """The line of ``data`` at ``pos``, with its newline (b"" at the end)."""
    end = data.find(b"\n", pos)
    return data[pos:] if end < 0 else data[pos : end + 1]


def read_line_at(f: BinaryIO, pos: int, head: int = 1 << 20) -> bytes:
    """The line at ``pos`` (where ``f`` stands). One longer than ``head`` has its end found first
    (`after_newline`) and then read in one piece, rather than gathered by `readline` in
    chunks and joined."""
    line = f.readline(head)
    if len(line) < head or line.endswith(b"\n"):
        return line
    end = after_newline(f, pos + len(line))
    f.seek(pos)
    return f.read(end - pos)


def after_newline(f: BinaryIO, offset: int, chunk: int = 1 << 18) -> int:
    """The offset just past the first newline at or after ``offset`` (the end if none), found
    in one reused buffer: a partition starting inside a 9 MB line skips its rest without
    building it (which would cost as much as reading it)."""
    f.seek(offset)
    buf = bytearray(chunk)
    with memoryview(buf) as view:
        while got := f.readinto(view):
            found = buf.find(b"\n", 0, got)
            if found >= 0:
                return offset + found + 1
            offset += got
    return offset
