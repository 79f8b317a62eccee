"""A recipe as a user's editor saves it: a byte-order mark, Windows line ends, or not UTF-8."""

from __future__ import annotations

import codecs
import re

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


@pytest.mark.parametrize(
    ("name", "content"),
    [("a.jsonl", b'{"text": "hello"}\n'), ("a.parquet", b"PAR1\x00\xff\x15"), ("a.json", b'{"text": "hi"}')],
    ids=["json-lines", "binary", "json-data"],
)
def test_data_given_where_the_recipe_goes_says_to_give_it_with_input(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TokshardError) as exc:
        recipe.load(path)
    assert str(exc.value) == (
        f"{path} is not a recipe (a .toml file); to tokenize it, give it with --input: "
        f"tokshard prepare --input {path} --tokenizer TOKENIZER --out DIR"
    )


@pytest.mark.parametrize(
    ("name", "content", "written"),
    [
        (
            "r.json",
            '{"tokenizer": "gpt2", "sources": {"a": {"type": "files", "paths": ["x.jsonl"]}}}',
            "JSON",
        ),
        ("r.yaml", "tokenizer: gpt2\nsources:\n  a:\n    type: files\n", "YAML"),
        ("r.yml", "sources:\n  a: {type: files}\n", "YAML"),
    ],
)
def test_a_recipe_written_as_json_or_yaml_is_told_to_be_written_as_toml(tmp_path, name, content, written):
    """It was told to go with --input, where its records lack 'text' (JSON) or its ending is
    refused (YAML): a recipe in another format is a recipe to write again as TOML."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TokshardError) as exc:
        recipe.load(path)
    assert str(exc.value) == (
        f"{path} is a recipe written as {written}, which tokshard does not read; write it as TOML "
        f"({tmp_path / 'r.toml'}: top-level settings, then a [sources.NAME] table per source, as the recipes tokshard ships are written)"
    )


@pytest.mark.parametrize(("below", "files"), [("", "*.jsonl"), ("a/b", "**/*.jsonl")], ids=["flat", "nested"])
def test_a_folder_given_where_the_recipe_goes_is_named_by_a_glob_input_takes(tmp_path, below, files):
    """It was told --input FOLDER, which --input refuses: the line names the folder's files."""
    from pipeline.sources.files.listing import expand

    folder = tmp_path / "corpus"
    (folder / below).mkdir(parents=True)
    (folder / below / "1.jsonl").write_text('{"text": "hi"}\n')
    with pytest.raises(TokshardError) as exc:
        recipe.load(folder)
    assert str(exc.value) == (
        f"{folder} is a folder, not a recipe (a .toml file); to tokenize its files, give them with --input: "
        f"tokshard prepare --input '{folder}/{files}' --tokenizer TOKENIZER --out DIR"
    )
    assert expand([f"{folder}/{files}"], ".") == [str(folder / below / "1.jsonl")]


@pytest.mark.parametrize("name", ["d.csv", "notes.yaml"])
def test_a_file_of_no_input_kind_given_where_the_recipe_goes_is_not_sent_to_input(tmp_path, name):
    """--input refuses the file's ending: the line says so instead of sending it there."""
    path = tmp_path / name
    path.write_text("a,b\n1,2\n")
    with pytest.raises(
        TokshardError, match=r"is not a recipe \(a \.toml file\), nor a file tokshard tokenizes \(\.jsonl, "
    ):
        recipe.load(path)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("tokenizer = 5", 'tokenizer must be a path or name in quotes (tokenizer = "..."), got 5'),
        ('out = ["a", "b"]', "out must be a path or name in quotes (out = \"...\"), got ['a', 'b']"),
        ('workers = "abc"', "workers must be a positive integer, got 'abc'"),
        ("workers = 0", "workers must be a positive integer, got 0"),
        ("workers = 2.5", "workers must be a positive integer, got 2.5"),
        ("workers = true", "workers must be a positive integer, got True"),
        ("threads = false", "threads must be a positive integer, got False"),
    ],
)
def test_a_setting_of_the_wrong_type_is_one_line_naming_it(tmp_path, line, says):
    """Each top-level setting is checked for its type before it is used (``tokenizer = 5`` was a
    traceback where a path was opened; ``workers`` was taken and never looked at)."""
    path = tmp_path / "r.toml"
    rest = RECIPE.split("\n", 1)[1] if line.startswith("tokenizer") else RECIPE  # one tokenizer line
    path.write_text(line + "\n" + rest)
    with pytest.raises(TokshardError) as exc:
        recipe.load(path)
    assert str(exc.value) == f"{path}: {says}"


def test_workers_in_a_recipe_is_the_run_s_unless_the_command_line_gives_it(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("workers = 3\n" + RECIPE)
    assert recipe.load(path).settings.workers == 3
    assert recipe.load(path, overrides={"workers": 1}).settings.workers == 1


@pytest.mark.parametrize(("value", "size"), [('"16MiB"', 16 << 20), ('"20kb"', 20_000), ("65536", 65536)])
def test_partition_bytes_takes_a_size_as_the_command_line_does(tmp_path, value, size):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE + f"partition_bytes = {value}\n")
    assert recipe.load(path).sources["text"]["partition_bytes"] == size


@pytest.mark.parametrize("value", ['"lots"', '"1KiB"', "true", "-5"])
def test_partition_bytes_that_is_no_size_of_4096_or_more_is_one_line(tmp_path, value):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE + f"partition_bytes = {value}\n")
    with pytest.raises(
        TokshardError,
        match=r'\[sources\.text\] partition_bytes \("auto" or a size\) must be a size of at least 4096 bytes',
    ):
        recipe.load(path)


def test_a_source_added_or_removed_is_named_as_such_not_as_its_settings_unset():
    old = {"tokenizer": "t", "sources": {"a": {"type": "files", "split": "train"}, "b": {"type": "cc_news"}}}
    new = {"tokenizer": "t", "sources": {"a": {"type": "files", "split": "dev"}, "c": {"type": "wikitext"}}}
    assert recipe.describe_changes(old, new) == [
        "source 'b' removed",
        "source 'c' added",
        "sources.a.split: 'train' -> 'dev'",
    ]


@pytest.mark.parametrize(
    ("mirror", "says"),
    [
        (
            "file:///data/cc",
            "mirror: file:///data/cc is a file:// URL; give the local path itself (/data/cc)",
        ),
        (
            "s3:/bucket/cc",
            "mirror: s3:/bucket/cc looks like a URL with a slash missing; write s3://bucket/cc",
        ),
        ("  ", "mirror must be a non-empty string"),
    ],
)
def test_a_mirror_in_a_recipe_is_checked_as_the_mirror_option_is(tmp_path, mirror, says):
    """`--mirror` refused these, a recipe's mirror = took them as local folders."""
    path = tmp_path / "r.toml"
    path.write_text(f'tokenizer = "t"\n[sources.c]\ntype = "cc_news"\nmirror = "{mirror}"\n')
    with pytest.raises(TokshardError, match=re.escape(f"[sources.c] {says}")):
        recipe.load(path)


@pytest.mark.parametrize(
    ("what", "name"),
    [("source", "é" * 61), ("split", "a" * 121)],
    ids=["source-accented", "split-ascii"],
)
def test_a_name_too_long_for_a_file_name_is_refused_by_the_recipe_check(tmp_path, what, name):
    """Before, a source or split name over 255 bytes (130 accented letters) passed the check,
    and the run stopped at its first checkpoint ("File name too long") with --out half-made.
    The spool file of a long document is named by a source and a split name together, so each
    holds at most 120 bytes."""
    text = RECIPE.replace("train", name) if what == "split" else RECIPE.replace("text]", f'"{name}"]')
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TokshardError) as exc:
        recipe.load(path)
    line = str(exc.value)
    assert f"{what} name {name[:40]!r}... is {len(name.encode())} bytes long" in line
    assert "NAME_MAX = 255 bytes" in line and "at most 120 bytes: shorten it" in line
    path.write_text(text.replace(name, name[: 120 // len(name[0].encode())]), encoding="utf-8")
    recipe.load(path)  # the longest name allowed
