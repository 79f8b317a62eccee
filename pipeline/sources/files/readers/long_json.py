"""A JSON line too long to parse whole: its text field decoded piece by piece.

Parsing a 20 MB line builds one str of its whole text (up to four bytes a character), which
the encoder then cuts into pieces anyway. Here the text field's string is found in the
line's bytes and decoded in chunks cut between escapes and UTF-8 characters, so the document
reaches the encoder as the same text in narrow pieces (as a large .txt file does).

Exactness: every chunk is decoded by orjson as a JSON string of its own (so it is valid
UTF-8 and valid JSON string content, with no unescaped quote), and the rest of the line is
parsed by orjson with the string replaced by each of two different placeholders; only if the
field's value is the placeholder both times is the string the field's value. Anything else
(an escaped key, the field nested or repeated, a lone surrogate, malformed JSON) returns None
and the caller parses the line whole, so every line reads exactly as `json_text` reads it.
"""

from __future__ import annotations

import orjson

#: lines longer than this have their text decoded in pieces
LONG_LINE_BYTES = 8 << 20
#: bytes of the JSON string decoded at a time
CHUNK_BYTES = 4 << 20
#: a text of at most this many characters is joined into one str (as a whole parse gives it):
#: the encoder then takes it as it takes any other document of that length
JOIN_CHARS = 4 << 20

_PLACEHOLDERS = (b'"\\u0000tokshard-a"', b'"\\u0000tokshard-b"')
_WHITESPACE = b" \t\r\n"
_BACKSLASH, _QUOTE, _COLON, _U = 0x5C, 0x22, 0x3A, 0x75
_HIGH_SURROGATE = (b"D8", b"D9", b"DA", b"DB")


class TextPieces(tuple):
    """A document's text as strings in order, never joined into one (a long JSON string)."""

    __slots__ = ()

    def head(self, chars: int) -> str:
        """The text's first ``chars`` characters (as a whole parse's str would give them)."""
        taken, count = [], 0
        for piece in self:
            if count >= chars:
                break
            taken.append(piece)
            count += len(piece)
        return "".join(taken)[:chars]


def text_pieces(line: bytes, field: str, chunk: int | None = None) -> TextPieces | str | None:
    """The value of ``field`` in the JSON object ``line``, as pieces if it is long; None where this cannot
    prove it (the caller then parses the line whole). ``chunk``: bytes decoded at a time."""
    chunk = chunk or CHUNK_BYTES
    span = _field_string(line, field)
    if span is None:
        return None
    start, end = span
    out = []
    view = memoryview(line)
    buf = bytearray()
    a = start + 1
    while a < end:
        b, width = None, chunk
        while b is None:  # no place to cut within ``width`` (a long run of escapes): look further
            b = end if end - a <= width else _cut(line, a + width, a)
            width *= 2
        n = b - a
        if len(buf) < n + 2:
            buf = bytearray(n + 2)
        buf[0] = _QUOTE
        buf[1 : n + 1] = view[a:b]
        buf[n + 1] = _QUOTE
        try:
            with memoryview(buf) as whole, whole[: n + 2] as quoted:
                out.append(orjson.loads(quoted))
        except orjson.JSONDecodeError:
            return None
        a = b
    return TextPieces(out) if sum(map(len, out)) > JOIN_CHARS else "".join(out)


def _field_string(line: bytes, field: str, tries: int = 8) -> tuple[int, int] | None:
    """Offsets of the quotes around the string that is the value of ``field`` (checked by
    `_is_the_field`), looked for after the first few places the key's JSON appears."""
    key = orjson.dumps(field)
    at = 0
    for _ in range(tries):
        at = line.find(key, at)
        if at < 0:
            return None
        at += len(key)
        start = _value_start(line, at)
        if start is None:
            continue
        end = _string_end(line, start)
        if end < 0:
            return None
        if _is_the_field(line[:start], line[end + 1 :], field):
            return start, end
    return None


def _value_start(line: bytes, i: int) -> int | None:
    """Offset of the opening quote of a string value after a key ending at ``i``."""
    i = _skip_space(line, i)
    if i >= len(line) or line[i] != _COLON:
        return None
    i = _skip_space(line, i + 1)
    return i if i < len(line) and line[i] == _QUOTE else None


def _skip_space(line: bytes, i: int) -> int:
    while i < len(line) and line[i] in _WHITESPACE:
        i += 1
    return i


def _string_end(line: bytes, start: int) -> int:
    """Offset of the quote closing the JSON string opened at ``start`` (-1: none)."""
    p = start + 1
    while (q := line.find(b'"', p)) >= 0:
        b = q
        while line[b - 1] == _BACKSLASH:
            b -= 1
        if (q - b) % 2 == 0:
            return q
        p = q + 1
    return -1


def _is_the_field(head: bytes, tail: bytes, field: str) -> bool:
    """Whether the line parses as an object whose ``field`` is the string between ``head`` and
    ``tail``: with two different placeholders there, the field's value must be each in turn."""
    for placeholder in _PLACEHOLDERS:
        try:
            obj = orjson.loads(head + placeholder + tail)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(obj, dict) or obj.get(field) != orjson.loads(placeholder):
            return False
    return True


def _cut(raw: bytes, c: int, lo: int) -> int | None:
    """The last place at or before ``c`` (after ``lo``, a place itself) where JSON string
    content may be split: not inside a UTF-8 character or an escape, nor between the two
    escapes of a surrogate pair."""
    while c > lo and 0x80 <= raw[c] < 0xC0:
        c -= 1
    while c > lo:
        j = raw.rfind(b"\\", max(lo, c - 6), c)  # an escape reaching c starts in the 6 bytes before
        if j < 0:
            return c
        p = j
        while p > lo and raw[p - 1] == _BACKSLASH:
            p -= 1
        if (j - p) % 2:  # an even run: escaped backslashes, ending before c
            return c
        is_u = raw[j + 1] == _U
        stop = j + 6 if is_u else j + 2
        if stop > c or (is_u and stop == c and raw[j + 2 : j + 4].upper() in _HIGH_SURROGATE):
            c = j  # inside the escape at j, or just after a high surrogate: cut before it
            continue
        return c
    return None
