"""A recipe as a user's editor saves it: a byte-order mark, Windows line ends, or not UTF-8."""

from __future__ import annotations

import codecs

import pytest

from pipeline import recipe
from pipeline.format.errors import TokshardError

RECIPE = (
    'tokenizer = "tok/tokenizer.json"\n\n[sources.text]\ntype = "files"\nsplits = { train = ["a.jsonl"] }\n'
)


def test_a_recipe_with_a_byte_order_mark_and_windows_line_ends_reads_as_without(tmp_path):
    """As Notepad and other Windows editors save it: UTF-8 with a BOM, CRLF line ends."""
    path = tmp_path / "r.toml"
    path.write_text(RECIPE, encoding="utf-8")
    plain = recipe.load(path)
    path.write_bytes(codecs.BOM_UTF8 + RECIPE.replace("\n", "\r\n").encode())
    assert recipe.load(path) == plain


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1"])
def test_a_recipe_that_is_not_utf8_is_one_line_saying_to_save_it_so(tmp_path, encoding):
    path = tmp_path / "r.toml"
    path.write_bytes(RECIPE.replace("text", "Bücher").encode(encoding))
    with pytest.raises(TokshardError) as exc:
        recipe.load(path)
    assert str(exc.value).startswith(f"recipe {path} is not UTF-8 text (byte ")
    assert str(exc.value).endswith(
        "; save it as UTF-8 (a UTF-16 file, as PowerShell's `>` writes, is the usual cause)"
    )
