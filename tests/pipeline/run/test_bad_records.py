"""Bad records: stop naming file and line (default), or skip and count them per reason."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import cli, one_error_line, plain_encode, run_prepare, stream_of, unchecked_strings

from pipeline import recipe
from pipeline.format import manifest
from pipeline.format.errors import TokshardError
from pipeline.run.driver import RunOptions, prepare
from pipeline.sources.files import iter_texts
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.base import Place
from pipeline.sources.files.readers.jsonl import json_text
from pipeline.sources.files.readers.parquet import ParquetReader
from pipeline.sources.files.readers.txt import STREAM_TXT_BYTES

GOOD = ["first good document", "second good document", "third good document"]
BAD_LINES = {
    "malformed JSON": b'{"text": "unterminated\n',
    "invalid UTF-8": b'{"text": "caf\xe9"}\n',
    "missing field 'text'": b'{"body": "wrong field"}\n',
    "null field 'text'": b'{"text": null}\n',
    "non-string field 'text'": b'{"text": 42}\n',
    "invalid unicode (lone surrogate)": b'{"text": "half \\ud800 pair"}\n',
    "JSON nested too deeply": b'{"text": "deep", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
}


def jsonl_with(tmp_path, bad: bytes):
    path = tmp_path / "in.jsonl"
    good = [json.dumps({"text": d}).encode() + b"\n" for d in GOOD]
    path.write_bytes(good[0] + bad + good[1] + good[2])
    return path


def recipe_for(tokenizer_path, path, **settings):
    return {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(path)]}},
        **settings,
    }


@pytest.mark.parametrize("reason", list(BAD_LINES))
def test_bad_record_stops_with_file_line_and_reason(tmp_path, tokenizer_path, dask_client, reason):
    path = jsonl_with(tmp_path, BAD_LINES[reason])
    with pytest.raises(TokshardError) as err:
        run_prepare(recipe_for(tokenizer_path, path), tmp_path / "out", dask_client)
    assert f"in.jsonl:2: bad record ({reason})" in str(err.value)
    assert "--on-bad-record skip" in str(err.value)


def test_a_text_file_that_is_not_utf8_is_named_with_the_byte_where_it_parts(
    tmp_path, tokenizer_path, dask_client
):
    """A .txt file is one document, so its line says where in it: a Latin-1 file shows its
    first byte outside UTF-8, counted from the file's start (a byte-order mark included)."""
    text = "The crème brûlée was good.\n".encode("latin-1") * 3
    for name, data, at in [("book.txt", text, 6), ("bom.txt", b"\xef\xbb\xbf" + text, 9)]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TokshardError) as err:
            run_prepare(recipe_for(tokenizer_path, tmp_path / name), tmp_path / f"out-{name}", dask_client)
        assert f"{name} (byte {at}): bad record (invalid UTF-8)" in str(err.value)


def streamed_latin1_book(path) -> int:
    """A .txt too large to read as one string (`txt.STREAM_TXT_BYTES`), UTF-8 up to one Latin-1
    é past its first 4 MiB read, a two-byte character cut by that read; the é's byte."""
    words = b"the cat sat on the mat and read a book. "
    head = b"\xef\xbb\xbf" + words * ((4 << 20) // len(words) + 1)
    head = head[: (4 << 20) - 1] + "é".encode()  # its second byte starts the second read
    book = head + b" the cr\xe8me " + words * ((STREAM_TXT_BYTES - (4 << 20)) // len(words) + 1000)
    path.write_bytes(book)
    return len(head) + len(b" the cr")


def test_a_streamed_text_file_that_is_not_utf8_is_named_with_the_byte_where_it_parts(
    tmp_path, tokenizer_path, dask_client
):
    """A .txt read as a stream names its byte as a small one does, counted across its reads."""
    at = streamed_latin1_book(tmp_path / "book.txt")
    with pytest.raises(TokshardError) as err:
        run_prepare(recipe_for(tokenizer_path, tmp_path / "book.txt"), tmp_path / "out", dask_client)
    assert f"book.txt (byte {at:,}): bad record (invalid UTF-8)" in str(err.value)


def test_a_streamed_text_file_that_is_not_utf8_stops_tokenizer_training_in_one_line(tmp_path):
    """Training reads the same files: its line names the byte too, with no traceback."""
    at = streamed_latin1_book(tmp_path / "book.txt")
    proc = cli(
        "tokenizer", "train", "--input", "book.txt", "--out", "tok", "--vocab-size", "300", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    assert f"book.txt (byte {at:,}): bad record (invalid UTF-8)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_record_is_a_data_error_exit_1_in_one_line(tmp_path, tokenizer_path):
    """Like a corrupt gzip or parquet file: the data is at fault, not the command line."""
    jsonl_with(tmp_path, BAD_LINES["malformed JSON"])
    proc = cli(
        "prepare", "--input", "in.jsonl", "--tokenizer", str(tokenizer_path), "--out", "out", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert (
        lines[-1].startswith("tokshard: error: ") and "in.jsonl:2: bad record (malformed JSON)" in lines[-1]
    )


def test_skip_counts_each_reason_in_the_manifest(tmp_path, tokenizer_path, dask_client):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": d}).encode() + b"\n" for d in GOOD]
    path.write_bytes(
        lines[0] + b"".join(BAD_LINES.values()) + BAD_LINES["malformed JSON"] + lines[1] + lines[2]
    )
    out = run_prepare(recipe_for(tokenizer_path, path, on_bad_record="skip"), tmp_path / "out", dask_client)
    skipped = manifest.load(out).data["sources"]["d"]["splits"]["train"]["skipped"]
    assert skipped == {**dict.fromkeys(BAD_LINES, 1), "malformed JSON": 2}
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, GOOD))


def test_null_text_in_parquet_is_a_bad_record(tmp_path, tokenizer_path, dask_client):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", None, "b"]}), path)
    out = run_prepare(recipe_for(tokenizer_path, path, on_bad_record="skip"), tmp_path / "out", dask_client)
    assert manifest.load(out).data["sources"]["d"]["splits"]["train"]["skipped"] == {"null field 'text'": 1}


def test_a_bad_parquet_row_is_named_by_its_row_of_the_file_counted_from_1(tmp_path):
    """A piece of the file's second row group on: its null is the file's 4th row, named so
    ("row group 1+, row 2" mixed a group counted from 0 with a row counted from 1 within the
    piece), as an Arrow file's rows are; its provenance still counts from 0."""
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c", None, "e"]}), path, row_group_size=2)
    piece = Piece(str(path), ".parquet", path.stat().st_size, row_groups=(1, 2))
    bad = [r for r in ParquetReader("text").read(piece, Place(0, 0), None) if r.bad]
    assert [(r.where, r.bad, r.place) for r in bad] == [(f"{path} row 4 of the file", "null field 'text'", 3)]


def columns_file(tmp_path, kind: str, column: pa.Array):
    path = tmp_path / f"in.{kind}"
    table = pa.table({"text": column})
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return path


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_string_column_value_that_is_not_utf8_is_a_bad_record(tmp_path, tokenizer_path, dask_client, kind):
    """One undecodable value spoils no other row: it stops the run naming its row, or is
    skipped and counted as an undecodable JSON line is."""
    values = [GOOD[0].encode(), b"caf\xe9 in Latin-1", GOOD[1].encode(), GOOD[2].encode()]
    path = columns_file(tmp_path, kind, unchecked_strings(values))
    with pytest.raises(TokshardError, match=r"row 2 of the file: bad record \(invalid UTF-8\)"):
        run_prepare(recipe_for(tokenizer_path, path), tmp_path / "stopped", dask_client)
    out = run_prepare(recipe_for(tokenizer_path, path, on_bad_record="skip"), tmp_path / "out", dask_client)
    assert manifest.load(out).data["sources"]["d"]["splits"]["train"]["skipped"] == {"invalid UTF-8": 1}
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, GOOD))


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
@pytest.mark.parametrize("binary", [pa.binary(), pa.large_binary(), pa.dictionary(pa.int32(), pa.binary())])
def test_a_column_of_bytes_is_read_as_utf8_text(tmp_path, tokenizer_path, dask_client, kind, binary):
    """Hive and Impala write text as parquet BINARY without its UTF8 annotation: its values are
    the documents, as from a string column, and one that is not UTF-8 is a bad record."""
    values = [GOOD[0].encode(), "naïve café 東京".encode(), b"caf\xe9 in Latin-1", GOOD[1].encode()]
    column = pa.array(values, pa.binary()).cast(binary)
    path = columns_file(tmp_path, kind, column)
    with pytest.raises(TokshardError, match=r"row 3 of the file: bad record \(invalid UTF-8\)"):
        run_prepare(recipe_for(tokenizer_path, path), tmp_path / "stopped", dask_client)
    out = run_prepare(recipe_for(tokenizer_path, path, on_bad_record="skip"), tmp_path / "out", dask_client)
    assert manifest.load(out).data["sources"]["d"]["splits"]["train"]["skipped"] == {"invalid UTF-8": 1}
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, [GOOD[0], "naïve café 東京", GOOD[1]]))


def test_parquet_without_the_text_column_is_a_clear_error_and_leaves_no_out(
    tmp_path, tokenizer_path, dask_client
):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"body": ["a"]}), path)
    with pytest.raises(
        TokshardError,
        match=r"no column 'text' \(columns: body\); name the text.s field with --text-field \(text_field in a recipe\)",
    ):
        run_prepare(recipe_for(tokenizer_path, path), tmp_path / "out", dask_client)
    assert not (tmp_path / "out").exists(), "the refused run on a new --out left its plan behind"


@pytest.mark.parametrize(
    "line",
    [
        b'\xef\xbb\xbf{"text": "after a byte order mark"}\n',
        b'{"text": "after a byte order mark", "score": NaN}\n',
        b'{"text": "after a byte order mark", "score": 1e400}\n',
        # more digits than Python converts from text (`json` raised, a traceback even with skip)
        b'{"id": ' + b"9" * 5000 + b', "text": "after a byte order mark"}\n',
    ],
)
def test_lines_the_fast_parser_refuses_but_json_accepts_are_documents(line):
    assert json_text(line, "text") == ("after a byte order mark", None)


def test_a_dotted_text_field_into_an_object_the_records_have_is_named_as_nested_not_read(tmp_path):
    """``--text-field meta.text`` over ``{"meta": {"text": ...}}``: "missing field" sent the
    user to skip bad records, which skipped them all. The stop says nested fields are not read
    and how to flatten them (exit 2: the command is at fault); a dotted name the record has no
    part of is still missing."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"meta": {"text": "x"}}\n')
    with pytest.raises(TokshardError) as err:
        list(iter_texts([str(path)], "meta.text"))
    assert err.value.exit_code == 2
    assert (
        f"{path}:1: bad record (nested field 'meta.text'): nested fields are not read, --text-field "
        in str(err.value)
    )
    assert "jq -c '{text: .meta.text}'" in str(err.value)
    assert json_text(b'{"body": "x"}', "meta.text") == (None, "missing field 'meta.text'")


def test_a_text_field_holding_a_number_too_long_to_convert_is_a_non_string_field():
    assert json_text(b'{"text": ' + b"9" * 5000 + b"}\n", "text") == (None, "non-string field 'text'")


@pytest.mark.parametrize("found", ["new", "empty"])
def test_a_wrong_text_field_leaves_the_out_as_it_found_it_and_says_the_same_out_will_do(
    tmp_path, tokenizer_path, found
):
    """The refusal came from the run's tasks (a record without the field), after the plan, the
    tokenizer and the first shard's .tmp files were written: all of that stayed in the --out,
    and the line sent the user to a new --out, though the same one replans. Two inputs, two
    workers: the other task's files go too."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in GOOD))
    if found == "empty":
        (tmp_path / "out").mkdir()
    args = ["prepare", "--input", "a.jsonl", "--input", "b.jsonl", "--tokenizer", str(tokenizer_path),
            "--out", "out", "--workers", "2"]  # fmt: skip
    wrong = cli(*args, cwd=tmp_path)
    assert wrong.returncode == 1
    assert one_error_line(wrong).endswith(
        ".jsonl:1: bad record (missing field 'text'); fix it (or name the right field with --text-field), or "
        "rerun with --on-bad-record skip (nothing was committed: a rerun on the same --out plans afresh)"
    )
    if found == "new":
        assert not (tmp_path / "out").exists()
    else:
        assert list((tmp_path / "out").iterdir()) == []
    fixed = cli(*args, "--text-field", "body", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tokenizer_path, GOOD * 2)
    )


def test_a_rerun_with_the_right_text_field_after_nothing_was_committed_plans_again(
    tmp_path, tokenizer_path, dask_client
):
    """A run stopped once planned (Ctrl-C here; a refusal while a shared scheduler's tasks still
    ran is the same) committed nothing: the fixed command was refused as "a different recipe",
    and the user told to delete the folder."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"body": d}) + "\n" for d in GOOD))

    def stop_once_planned(line: str) -> None:
        if "to start" in line:
            raise KeyboardInterrupt

    r = recipe.from_dict(recipe_for(tokenizer_path, path), "test")
    with pytest.raises(KeyboardInterrupt):
        prepare(r, tmp_path / "out", RunOptions(client=dask_client), log=stop_once_planned)
    assert (tmp_path / "out" / ".tokshard" / "run.json").is_file()
    args = ["prepare", "--input", "in.jsonl", "--tokenizer", str(tokenizer_path), "--out", "out"]
    fixed = cli(*args, "--text-field", "body", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert (
        "out: planned again, since its earlier run committed nothing (holds a run of a different recipe ("
        in (fixed.stderr)
    )
    assert np.array_equal(stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tokenizer_path, GOOD))
    again = cli(*args, "--text-field", "text", cwd=tmp_path)  # now it holds work: kept, refused
    assert again.returncode == 2 and "out holds a run of a different recipe" in again.stderr


def test_a_bad_records_line_leads_to_a_rerun_that_works(tmp_path, tokenizer_path):
    """It said "fix it", and the rerun on the fixed file was refused: the input changed since the
    run planned it. The fix's rerun is a new --out; skipping keeps the work done."""
    path = jsonl_with(tmp_path, BAD_LINES["malformed JSON"])
    argv = ["prepare", "--input", "in.jsonl", "--tokenizer", str(tokenizer_path), "--workers", "1"]
    proc = cli(*argv, "--out", "out", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        "in.jsonl:2: bad record (malformed JSON); rerun with --on-bad-record skip to pass over it (work done "
        "so far is kept), or fix it and rerun with a new --out (a run's inputs stay as it planned them)"
    )
    assert cli(*argv, "--out", "out", "--on-bad-record", "skip", cwd=tmp_path).returncode == 0
    path.write_bytes(b"".join(json.dumps({"text": d}).encode() + b"\n" for d in GOOD))  # fixed
    fixed = cli(*argv, "--out", "fixed", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr


def test_a_recipe_runs_bad_record_names_the_recipes_settings_not_the_options_it_refuses(
    tmp_path, tokenizer_path, dask_client
):
    """A recipe's source whose records lack the field said "name the right field with
    --text-field", which a recipe refuses: the line names text_field in that source's table of
    that recipe file (and on_bad_record at its top), and doing so makes the rerun work."""
    (tmp_path / "x.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in GOOD))
    path = tmp_path / "r.toml"
    table = f'tokenizer = "{tokenizer_path}"\n[sources.web]\ntype = "files"\npaths = ["x.jsonl"]\n'
    path.write_text(table)
    with pytest.raises(TokshardError) as err:
        prepare(recipe.load(path), tmp_path / "out", RunOptions(client=dask_client), log=lambda msg: None)
    assert str(err.value) == (
        f"{tmp_path / 'x.jsonl'}:1: bad record (missing field 'text'); fix it (or name the right field with "
        f'text_field = "..." in [sources.web] of {path}), or rerun with --on-bad-record skip (or '
        f'on_bad_record = "skip" at the top of {path}) (nothing was committed: a rerun on the same --out '
        "plans afresh)"
    )
    path.write_text(table + 'text_field = "body"\n')
    out = prepare(recipe.load(path), tmp_path / "out", RunOptions(client=dask_client), log=lambda msg: None)
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, GOOD))
