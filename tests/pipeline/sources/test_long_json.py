"""A long JSON line's text decoded in pieces: the same text `json_text` reads, or a whole parse."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.sources.files.readers import jsonl, long_json
from pipeline.sources.files.readers.jsonl import json_text, line_text
from pipeline.sources.files.readers.long_json import TextPieces, text_pieces

#: what makes cutting hard: escapes of every kind, surrogate pairs, multi-byte UTF-8
tricky = st.text(
    st.one_of(
        st.sampled_from(list('\\"\n\t\x00\x1f/😀日é\u2028')),
        st.characters(codec="utf-8"),
    ),
    max_size=60,
)
others = st.dictionaries(st.sampled_from(["id", "meta", "url"]), st.one_of(st.integers(), tricky), max_size=2)


def line_of(before: dict, text: str, after: dict, ensure_ascii: bool, sep: str) -> bytes:
    obj = {**before, "text": text, **{k + "_": v for k, v in after.items()}}
    return (json.dumps(obj, ensure_ascii=ensure_ascii, separators=(",", sep)) + "\n").encode()


@settings(max_examples=400, deadline=None)
@given(tricky, others, others, st.booleans(), st.sampled_from([":", ": ", " :\t "]), st.integers(1, 24))
def test_a_top_level_text_field_is_decoded_in_pieces_to_the_parsed_text(
    text, before, after, ensure_ascii, sep, chunk
):
    line = line_of(before, text, after, ensure_ascii, sep)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(long_json, "JOIN_CHARS", -1)  # every text counts as long here
        pieces = text_pieces(line, "text", chunk=chunk)
    assert isinstance(pieces, TextPieces)
    assert "".join(pieces) == json.loads(line)["text"]


@settings(max_examples=600, deadline=None)
@given(
    tricky,
    st.booleans(),
    st.integers(0, 200),
    st.sampled_from(
        [b'"', b"\\", b"\\u", b"\\ud800", b"\\udc00", b"\xff", b"\xc3", b"\x01", b"}", b"", b"\n"]
    ),
    st.booleans(),
    st.integers(1, 24),
)
def test_pieces_are_given_only_for_a_line_json_text_reads_the_same(
    text, ensure_ascii, at, damage, replace, chunk
):
    """Any line, damaged anywhere: pieces only where `json_text` reads the line, and then its text."""
    good = line_of({"id": 1}, text, {"meta": "m"}, ensure_ascii, ": ")
    at = min(at, len(good))
    line = good[:at] + damage + good[at + (1 if replace else 0) :]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(long_json, "JOIN_CHARS", -1)
        pieces = text_pieces(line, "text", chunk=chunk)
    if pieces is not None:
        assert json_text(line, "text") == ("".join(pieces), None)


@pytest.mark.parametrize(
    "line",
    [
        b'{"title": "text", "meta": {"text": "nested"}, "text": "top"}',
        b'{"a\\"text": "x", "text": "y"}',
        b'{"text": "first", "text": "second"}',
    ],
)
def test_the_field_is_found_past_the_key_s_text_elsewhere_and_a_repeated_key_reads_as_parsed(line):
    pieces = text_pieces(line, "text", chunk=1)
    assert pieces is not None and json_text(line, "text") == ("".join(pieces), None)


@pytest.mark.parametrize(
    "line",
    [
        b'{"meta": {"text": "nested"}}',
        b'{"t\\u0065xt": "escaped key"}',
        b'{"a\\"text": "x"}',
        b'["text", "not an object"]',
        b'{"text": "\\ud800 lone surrogate"}',
        b'{"text": 5}',
    ],
)
def test_what_pieces_cannot_prove_reads_as_a_whole_parse_reads_it(line, monkeypatch):
    assert text_pieces(line, "text", chunk=4) is None
    monkeypatch.setattr(jsonl, "LONG_LINE_BYTES", 0)
    assert line_text(line, "text") == json_text(line, "text")


def test_only_lines_longer_than_the_threshold_are_read_in_pieces(monkeypatch):
    line = line_of({}, "some text " * 10, {}, True, ": ")
    assert line_text(line, "text") == ("some text " * 10, None)
    monkeypatch.setattr(jsonl, "LONG_LINE_BYTES", 16)
    monkeypatch.setattr(long_json, "JOIN_CHARS", 99)
    assert isinstance(line_text(line, "text")[0], TextPieces)


def test_a_long_line_whose_text_is_short_gives_the_text_as_one_str(monkeypatch):
    """A line long for other fields: its text reaches the encoder as any short document does."""
    line = line_of({"meta": "m" * 200}, "short text", {}, True, ": ")
    monkeypatch.setattr(jsonl, "LONG_LINE_BYTES", 16)
    monkeypatch.setattr(long_json, "CHUNK_BYTES", 4)
    assert line_text(line, "text") == ("short text", None)


def test_the_head_of_pieces_is_the_head_of_the_text():
    pieces = TextPieces(["ab", "", "cde", "f"])
    assert [pieces.head(n) for n in (0, 1, 2, 3, 5, 6, 99)] == [
        "",
        "a",
        "ab",
        "abc",
        "abcde",
        "abcdef",
        "abcdef",
    ]
