"""How tokshard writes JSON (`pipeline.format.atomic.json_bytes`): readable, and read back as written."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.format.atomic import json_bytes

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
#: strings that look like the boundary between two records of a table, and like JSON syntax
tricky = st.sampled_from(["}, {", "},\n{", '"}, {"', "[", "]", "\\", "é\u2028"])
values = st.recursive(
    scalars | tricky,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | tricky, inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_what_json_bytes_writes_reads_back_as_the_same_value(value):
    assert json.loads(json_bytes(value)) == value


def test_each_record_of_a_table_is_one_line_even_when_a_string_looks_like_a_boundary():
    rows = [{"path": "a}, {b", "size": 1}, {"path": "c", "size": 2}, {"path": "d", "size": 3}]
    doc = {"files": rows, "tool": {"name": "tokshard"}, "globs": ["*.jsonl", "x/*.txt"]}
    text = json_bytes(doc).decode()
    lines = text.splitlines()
    assert [json.loads(line.strip().rstrip(",")) for line in lines[2:5]] == rows
    assert ' "globs": ["*.jsonl", "x/*.txt"]' in lines  # a list of plain values: one line
    assert ' "tool": {' in lines  # an object that is not a table's record: indented
    assert json.loads(text) == doc


def test_compact_json_has_no_line_breaks_inside():
    doc = {"files": [{"path": "a", "size": 1}] * 3, "nested": {"x": [1, [2]]}}
    text = json_bytes(doc, compact=True)
    assert text.count(b"\n") == 1 and json.loads(text) == doc
