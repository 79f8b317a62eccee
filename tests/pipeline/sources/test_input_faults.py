"""Inputs that would vanish or be half read without a word, and the same inputs named another way.

Each case is what a user's disk holds: a link into a filesystem that is not mounted, a file or
folder nobody may read, a FIFO, a Spark-style ``part.parquet/`` folder, UTF-16 text from a
Windows tool, a parquet column of pandas categories; and a rerun that names the same files
by an absolute path. Each refusal is one line naming the input, before any work is done."""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import REPO, cli, one_error_line, plain_encode, run_prepare, stream_of, write_jsonl

from pipeline.format.errors import DataError
from pipeline.sources.files import iter_texts
from pipeline.sources.files.readers.jsonl import json_text


def prepare_cli(cwd, *inputs: str, tokenizer, extra: tuple[str, ...] = (), as_user: bool = False):
    args = [
        "prepare",
        *(a for i in inputs for a in ("--input", i)),
        "--tokenizer",
        str(tokenizer),
        "--out",
        "out",
    ]
    if not as_user:
        return cli(*args, "--workers", "1", *extra, cwd=cwd)
    return cli_as_a_user(*args, "--workers", "1", *extra, cwd=cwd)


def cli_as_a_user(*args: str, cwd):
    """`tokshard ARGS` with file permissions enforced: as root, with the capabilities that let
    root read and list anything dropped from the process (as a user's shell runs it)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def drop_file_capabilities() -> None:
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return subprocess.run(
        [sys.executable, "-m", "tokshard.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=cwd,
        preexec_fn=drop_file_capabilities if os.geteuid() == 0 else None,
    )


@pytest.fixture
def folder(tmp_path, docs):
    """data/a.jsonl and data/b.jsonl of real text."""
    write_jsonl(tmp_path / "data" / "a.jsonl", docs[:3])
    write_jsonl(tmp_path / "data" / "b.jsonl", docs[3:6])
    return tmp_path


# --- #29.4: inputs that vanish without a word ------------------------------------------------------


def test_a_dangling_symlink_matched_by_a_glob_is_named(folder, tokenizer_path):
    """A link into a filesystem that is not mounted: its target is missing, the glob still
    matches the link, and the run stops naming it instead of training on less."""
    (folder / "data" / "c.jsonl").symlink_to("/mnt/unmounted-disk/c.jsonl")
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert f"{folder / 'data' / 'c.jsonl'} (matched by 'data/*.jsonl') is a broken symbolic link" in line
    assert "/mnt/unmounted-disk/c.jsonl" in line
    assert not (folder / "out").exists() or not list((folder / "out").rglob("*.bin*"))


def test_a_dangling_symlink_named_itself_is_named(folder, tokenizer_path):
    (folder / "gone.jsonl").symlink_to(folder / "nowhere.jsonl")
    proc = prepare_cli(folder, "gone.jsonl", tokenizer=tokenizer_path)
    assert (
        proc.returncode == 2
        and "gone.jsonl (matched by 'gone.jsonl') is a broken symbolic link" in one_error_line(proc)
    )


def test_a_folder_with_an_input_suffix_matched_by_a_glob_is_named(folder, tokenizer_path, docs):
    """Spark writes ``part.parquet/`` folders: ``*.parquet`` matches the folder, whose files
    would otherwise be left out silently."""
    pq.write_table(pa.table({"text": docs[:3]}), folder / "data" / "x.parquet")
    (folder / "data" / "y.parquet").mkdir()
    pq.write_table(pa.table({"text": docs[3:6]}), folder / "data" / "y.parquet" / "part-0.parquet")
    proc = prepare_cli(folder, "data/*.parquet", tokenizer=tokenizer_path)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert (
        f"input {folder / 'data' / 'y.parquet'} (matched by 'data/*.parquet') is a directory, not a file"
        in line
    )


def test_a_fifo_matched_by_a_glob_is_named_and_never_opened(folder, tokenizer_path):
    """Opening a FIFO would block until someone writes to it; its bytes could not be read
    again on a resume either."""
    os.mkfifo(folder / "data" / "pipe.jsonl")
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    assert (
        proc.returncode == 2
        and "pipe.jsonl (matched by 'data/*.jsonl') is a FIFO (named pipe)" in one_error_line(proc)
    )


def test_an_unreadable_file_is_named(folder, tokenizer_path):
    (folder / "data" / "b.jsonl").chmod(0)
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert f"cannot read input {folder / 'data' / 'b.jsonl'}: permission denied" in line


def test_an_unlistable_folder_a_double_star_glob_reaches_into_is_named(folder, tokenizer_path, docs):
    """glob skips a folder it may not list without a word: its files would be left out."""
    write_jsonl(folder / "data" / "locked" / "c.jsonl", docs[6:8])
    (folder / "data" / "locked").chmod(0o300)  # may enter, may not list
    try:
        proc = prepare_cli(folder, "data/**/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    finally:
        (folder / "data" / "locked").chmod(0o755)
    line = one_error_line(proc)
    assert proc.returncode == 2
    assert f"cannot list folder {folder / 'data' / 'locked'} that 'data/**/*.jsonl' reaches into" in line


def test_a_file_in_an_unlistable_folder_named_by_a_glob_is_not_called_missing(folder, tokenizer_path):
    (folder / "data").chmod(0o300)
    try:
        proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    finally:
        (folder / "data").chmod(0o755)
    assert (
        proc.returncode == 2
        and f"cannot list folder {folder / 'data'} that 'data/*.jsonl'" in one_error_line(proc)
    )


def test_an_input_gone_since_planning_is_named_on_resume(folder, tokenizer_path, dask_client, docs):
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(folder / "data" / "*.jsonl")]}},
    }
    (folder / "data" / "z.jsonl").write_text('{"text": "broken\n')
    with pytest.raises(DataError, match="bad record"):
        run_prepare(recipe, folder / "out", dask_client)
    (folder / "data" / "a.jsonl").unlink()
    with pytest.raises(DataError, match=r"input .*a\.jsonl is gone since this run started"):
        run_prepare(recipe, folder / "out", dask_client)


def test_a_file_the_glob_matches_since_planning_is_refused_on_resume(
    folder, tokenizer_path, dask_client, docs
):
    """A rerun reads exactly the files it planned: a new file in the folder is named, not left
    out of a dataset that claims the glob."""
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(folder / "data" / "*.jsonl")]}},
    }
    path = run_prepare(recipe, folder / "out", dask_client)
    path.unlink()
    write_jsonl(folder / "data" / "c.jsonl", docs[6:8])
    with pytest.raises(DataError, match=r"input .*c\.jsonl \(train\) is new since this run started"):
        run_prepare(recipe, folder / "out", dask_client)


# --- #29.8: UTF-16 text, categories, the same files named by another path ---------------------------


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize(
    ("name", "encoding"),
    [("a.jsonl", "utf-16"), ("a.txt", "utf-16"), ("a.json.gz", "utf-16"), ("a.jsonl", "utf-32")],
)
def test_utf16_and_utf32_input_is_named_and_never_half_kept(
    tmp_path, docs, tokenizer_path, name, encoding, policy
):
    """Windows tools write UTF-16 with a byte-order mark; read as UTF-8 some lines parsed and
    some did not. Now the file is refused before any work, under either bad-record policy."""
    text = docs[0] if name.endswith(".txt") else "".join(json.dumps({"text": d}) + "\n" for d in docs[:4])
    data = text.encode(encoding)
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    proc = prepare_cli(tmp_path, name, tokenizer=tokenizer_path, extra=("--on-bad-record", policy))
    line = one_error_line(proc)
    label = encoding.upper()
    assert proc.returncode == 1
    assert f"{tmp_path / name} is {label} text (it starts with a {label} byte-order mark), not UTF-8" in line
    assert f"iconv -f {label} -t UTF-8" in line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.bin*"))


def test_utf16_is_refused_by_the_reader_too(tmp_path, docs):
    """Where no planning read the file's bytes (a bucket's listing, tokenizer training), the
    first line read says it."""
    path = tmp_path / "a.jsonl"
    path.write_bytes("".join(json.dumps({"text": d}) + "\n" for d in docs[:2]).encode("utf-16"))
    with pytest.raises(DataError, match=r"a\.jsonl is UTF-16 text"):
        list(iter_texts([str(path)]))


def test_a_line_of_utf16_is_a_bad_record_not_text():
    """`json` takes bytes it guesses to be UTF-16 or UTF-32 for that text; JSON Lines are UTF-8,
    so such a line is a bad record (a UTF-8 byte-order mark is still no text)."""
    line = json.dumps({"text": "hello"})
    assert json_text(line.encode("utf-16"), "text") == (None, "invalid UTF-8")
    assert json_text(line.encode("utf-32"), "text") == (None, "invalid UTF-8")
    assert json_text(line.encode("utf-16-le"), "text") == (None, "malformed JSON")
    assert json_text(b"\xef\xbb\xbf" + line.encode(), "text") == ("hello", None)


def test_a_parquet_column_of_categories_is_read_as_text(tmp_path, docs, tokenizer_path, dask_client):
    """pandas writes a category column as ``dictionary<values=string>``: its values are text."""
    texts = [docs[i % 5] for i in range(40)]
    pd.DataFrame({"text": pd.Categorical(texts)}).to_parquet(tmp_path / "cats.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "cats.parquet").field("text").type)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(tmp_path / "*.parquet")]}},
    }
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, texts))


def test_the_same_files_named_by_an_absolute_path_are_the_same_run(folder, tokenizer_path, docs):
    """``--input data/*.jsonl`` and then ``--input /abs/data/*.jsonl`` (or the files one by
    one) name the same files: the rerun continues the run instead of calling it another recipe;
    a glob that now leaves one of its files out is refused, naming that file."""
    first = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    assert first.returncode == 0, first.stderr
    (folder / "out" / "manifest.json").unlink()
    again = prepare_cli(folder, str(folder / "data" / "*.jsonl"), tokenizer=tokenizer_path)
    assert again.returncode == 0, again.stderr
    done = prepare_cli(folder, "data/a.jsonl", "./data/b.jsonl", tokenizer=tokenizer_path)
    assert done.returncode == 0 and "already complete" in done.stderr, done.stderr
    assert np.array_equal(stream_of(folder / "out" / "manifest.json"), plain_encode(tokenizer_path, docs[:6]))
    fewer = prepare_cli(folder, "data/a.jsonl", tokenizer=tokenizer_path)
    line = one_error_line(fewer)
    assert fewer.returncode == 2
    assert (
        f"input {folder / 'data' / 'b.jsonl'} (train) is part of this run, but the recipe's globs no longer name it"
        in line
    )


def test_a_small_file_changed_after_planning_is_refused_by_its_reader(tmp_path, docs):
    """A small file is fingerprinted by its size and time; its worker checks both on the file it
    opens, so text written after planning never joins the planned run."""
    from pipeline.sources.files import FilesSource

    for i in range(3):
        write_jsonl(tmp_path / f"d{i}.jsonl", docs[i : i + 2])
    source = FilesSource("d", FilesSource.normalize("d", {"paths": [str(tmp_path / "*.jsonl")]}, "test"))
    (part,) = source.partitions()
    with open(tmp_path / "d1.jsonl", "a") as f:
        f.write(json.dumps({"text": "written after planning"}) + "\n")
    with pytest.raises(
        DataError, match=r"input .*d1\.jsonl changed since this run started \(size or modification time\)"
    ):
        list(source.read(part, None))
