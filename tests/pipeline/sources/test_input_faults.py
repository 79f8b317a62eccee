"""Inputs that would vanish or be half read without a word, and the same inputs named another way.

Each case is what a user's disk holds: a link into a filesystem that is not mounted, a file or
folder nobody may read, a FIFO, a Spark-style ``part.parquet/`` folder, UTF-16 text from a
Windows tool, a parquet column of pandas categories, a web server's page of links, a web server
without byte ranges; and a rerun that names the same files by an absolute path. Each refusal is one line naming the input, exit 1 (a fault of the data, not
of the command), with nothing published."""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import functools
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from faulty_store import faulty_store
from support import REPO, cli, one_error_line, plain_encode, run_prepare, stream_of, write_jsonl

from pipeline.format import manifest
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.files import iter_texts
from pipeline.sources.files.fingerprints import SMALL_FILE, fingerprints, needs_read
from pipeline.sources.files.formats import bomless_wide
from pipeline.sources.files.listing import expand, list_files
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
        [sys.executable, "-m", "tokshard", *args],
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


def refused(proc, says: str, out) -> None:
    """The run stopped with one line saying ``says``, exit 1 (a fault of the data), and nothing
    published: no manifest, no shard."""
    line = one_error_line(proc)
    assert proc.returncode == 1, proc.stderr
    assert says in line, line
    assert not out.exists() or not [*out.rglob("manifest.json"), *out.rglob("*.bin")]


def test_a_dangling_symlink_matched_by_a_glob_is_named(folder, tokenizer_path):
    """A link into a filesystem that is not mounted: its target is missing, the glob still
    matches the link, and the run stops naming it instead of training on less."""
    (folder / "data" / "c.jsonl").symlink_to("/mnt/unmounted-disk/c.jsonl")
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    says = f"{folder / 'data' / 'c.jsonl'} (matched by 'data/*.jsonl') is a broken symbolic link"
    refused(proc, says + " to /mnt/unmounted-disk/c.jsonl", folder / "out")


def test_a_dangling_symlink_named_itself_is_named(folder, tokenizer_path):
    (folder / "gone.jsonl").symlink_to(folder / "nowhere.jsonl")
    proc = prepare_cli(folder, "gone.jsonl", tokenizer=tokenizer_path)
    refused(proc, "gone.jsonl (matched by 'gone.jsonl') is a broken symbolic link", folder / "out")


@pytest.mark.parametrize(
    ("link", "target", "pattern", "says"),
    [
        ("2024/feb.jsonl", "/mnt/archive/feb.jsonl", "data/**/*.jsonl", "is a broken symbolic link"),
        ("c.jsonl", "{folder}/data/c.jsonl", "data/*.jsonl", "its symbolic links loop"),
        ("c.jsonl", "{folder}/elsewhere", "data/*.jsonl", "is a directory, not a file"),
    ],
    ids=["dangling-under-double-star", "loop", "to-a-folder"],
)
def test_a_link_that_leads_to_no_file_is_named(folder, tokenizer_path, docs, link, target, pattern, says):
    """A link deep in a ``**`` glob into an archive not mounted, a link to itself, a link to a
    folder named like an input: each is named with what is wrong with it."""
    write_jsonl(folder / "data" / "2024" / "jan.jsonl", docs[6:8])
    write_jsonl(folder / "elsewhere" / "d.jsonl", docs[8:10])
    (folder / "data" / link).symlink_to(target.format(folder=folder))
    proc = prepare_cli(folder, pattern, tokenizer=tokenizer_path)
    refused(proc, says, folder / "out")
    assert str(folder / "data" / link) in one_error_line(proc)


def test_symbolic_link_loops_under_a_double_star_glob_are_gone_into_once(folder, docs, monkeypatch):
    """Two links back up a corpus folder (``self1 -> .``, ``self2 -> .``) and one back from a
    subfolder: glob followed every path through them to the system's limit of 40 links, 2 ** 40
    of them, and planning never ended. Each real folder is listed once; each file is read once,
    and a link to itself is still named."""
    write_jsonl(folder / "data" / "2024" / "jan.jsonl", docs[6:8])
    (folder / "data" / "self1").symlink_to(".")
    (folder / "data" / "self2").symlink_to(".")
    (folder / "data" / "2024" / "up").symlink_to("..")
    listings = 0
    scandir = os.scandir

    def counted(path="."):
        nonlocal listings
        listings += 1
        assert listings < 200, "the glob lists the same folders again and again"
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    found = [f.path for f in list_files([str(folder / "data" / "**" / "*.jsonl")], ".")]
    assert found == [os.path.realpath(folder / "data" / n) for n in ("2024/jan.jsonl", "a.jsonl", "b.jsonl")]
    (folder / "data" / "c.jsonl").symlink_to("c.jsonl")
    with pytest.raises(DataError, match=r"c\.jsonl: its symbolic links loop"):
        list_files([str(folder / "data" / "**" / "*.jsonl")], ".")


def test_a_link_is_read_as_its_own_name_says_not_as_its_target_s(tmp_path, docs, tokenizer_path):
    """A Hugging Face hub cache names its files by links (``snapshots/REV/data/train-00000.jsonl
    -> ../../../blobs/<hash>``, a target without an ending): each is read as the link's name
    says, as any file is read by the name it is given, by `prepare` and by tokenizer training;
    ``train.jsonl -> export.txt`` is JSON Lines, not one .txt document of raw JSON; and a link
    whose own name says no input is refused by that name, whatever its target's."""
    big = docs * (1 + SMALL_FILE // len("".join(docs)))  # its ends are checked as planned
    write_jsonl(tmp_path / "hub" / "blobs" / "4f1c9e7a0b", big)
    snapshot = tmp_path / "hub" / "snapshots" / "rev1" / "data"
    snapshot.mkdir(parents=True)
    (snapshot / "train-00000.jsonl").symlink_to("../../../blobs/4f1c9e7a0b")
    write_jsonl(tmp_path / "lk" / "export.txt", docs[:2])
    (tmp_path / "lk" / "train.jsonl").symlink_to("export.txt")
    globs = ["hub/snapshots/rev1/data/*.jsonl", "lk/train.jsonl"]
    proc = prepare_cli(tmp_path, *globs, tokenizer=tokenizer_path)
    assert proc.returncode == 0, proc.stderr
    expected = big + docs[:2]
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tokenizer_path, expected)
    )
    assert list(iter_texts(list_files(globs, str(tmp_path)))) == expected
    (tmp_path / "lk" / "saved.txt").write_text("<!DOCTYPE html>\n<html><body>a page</body></html>\n")
    (tmp_path / "lk" / "page.jsonl").symlink_to("saved.txt")  # its first bytes checked as JSON Lines
    with pytest.raises(DataError, match=r"saved\.txt is an HTML page, not JSON Lines"):
        list(iter_texts(list_files(["lk/page.jsonl"], str(tmp_path))))
    (tmp_path / "lk" / "notes.csv").symlink_to("export.txt")
    with pytest.raises(
        TokshardError, match=f"^{re.escape(str(tmp_path / 'lk' / 'notes.csv'))}: unsupported file type"
    ):
        list_files(["lk/*"], str(tmp_path))


def test_a_folder_with_an_input_suffix_matched_by_a_glob_is_named(folder, tokenizer_path, docs):
    """Spark writes ``part.parquet/`` folders: ``*.parquet`` matches the folder, whose files
    would otherwise be left out silently."""
    pq.write_table(pa.table({"text": docs[:3]}), folder / "data" / "x.parquet")
    (folder / "data" / "y.parquet").mkdir()
    pq.write_table(pa.table({"text": docs[3:6]}), folder / "data" / "y.parquet" / "part-0.parquet")
    proc = prepare_cli(folder, "data/*.parquet", tokenizer=tokenizer_path)
    says = f"input {folder / 'data' / 'y.parquet'} (matched by 'data/*.parquet') is a directory, not a file"
    refused(proc, says, folder / "out")


def test_a_deep_glob_reads_a_folder_named_as_a_file_whose_parts_it_all_names(folder):
    """``data/**/*.parquet`` over a Spark-style ``y.parquet/`` folder matches its parts too:
    they are read (it was refused, advising the ``**`` glob it was); an empty such folder
    leaves nothing out; one part the glob misses (``chunk-1.snappy`` under ``**/*.parquet``, or
    ``chunk-1.parquet`` under ``**/*t*.parquet``) is named, where it was left out without a word."""
    (folder / "data" / "y.parquet").mkdir()
    pq.write_table(pa.table({"text": ["a part"]}), folder / "data" / "y.parquet" / "part-0.parquet")
    (folder / "data" / "y.parquet" / "_SUCCESS").write_bytes(b"")
    (folder / "data" / "y.parquet" / ".spark-staging-1").mkdir()  # hidden, as '**' leaves it
    pq.write_table(
        pa.table({"text": ["staged"]}), folder / "data" / "y.parquet" / ".spark-staging-1" / "p.parquet"
    )
    (folder / "data" / "empty.parquet").mkdir()
    found = [f.path for f in list_files(["data/**/*.parquet"], str(folder))]
    assert found == [os.path.realpath(folder / "data" / "y.parquet" / "part-0.parquet")]
    (folder / "data" / "text.parquet").mkdir()
    for name in ("part-0.parquet", "chunk-1.parquet"):
        pq.write_table(pa.table({"text": [name]}), folder / "data" / "text.parquet" / name)
    with pytest.raises(DataError) as refused_:
        list_files(["data/**/*t*.parquet"], str(folder))
    spark = folder / "data" / "text.parquet"
    assert str(refused_.value) == (
        f"input {spark} (matched by 'data/**/*t*.parquet') is a directory named as a file, and its part "
        f"{spark / 'chunk-1.parquet'} is not matched by the glob, so it would be left out; name the "
        f"folder's parts (e.g. '{spark}/*'), or narrow the glob to files"
    )


def test_a_folder_matched_by_a_star_glob_is_named_not_skipped(folder, tokenizer_path, docs):
    """``data/*`` over a folder of files and a subfolder (an older export kept beside them):
    the subfolder's files are not matched, so the run names it instead of leaving them out;
    a ``**`` glob reaches into it and reads them."""
    write_jsonl(folder / "data" / "2023" / "old.jsonl", docs[6:8])
    proc = prepare_cli(folder, "data/*", tokenizer=tokenizer_path)
    says = f"input {folder / 'data' / '2023'} (matched by 'data/*') is a directory, not a file, and its files"
    refused(proc, says, folder / "out")
    done = prepare_cli(folder, "data/**/*.jsonl", tokenizer=tokenizer_path)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(
        stream_of(folder / "out" / "manifest.json"), plain_encode(tokenizer_path, docs[6:8] + docs[:6])
    )


def test_a_star_glob_passes_by_an_empty_folder_and_the_run_s_own_output(folder, tokenizer_path, docs):
    """``data/*`` with ``--out data/tok``: the output folder (and an empty one) hold no input
    to leave out, so the rerun finds the same inputs and the run is complete."""
    (folder / "data" / "empty").mkdir()
    for _ in range(2):
        proc = cli("prepare", "--input", "data/*", "--tokenizer", str(tokenizer_path), "--out", "data/tok",
                   "--workers", "1", cwd=folder)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert "already complete" in proc.stderr, proc.stderr
    assert np.array_equal(
        stream_of(folder / "data" / "tok" / "manifest.json"), plain_encode(tokenizer_path, docs[:6])
    )


def test_a_folder_of_objects_matched_by_a_star_glob_is_named(s3_server, docs):
    """In a bucket too: ``in/*`` over objects and an ``in/2023/`` prefix names the prefix; a
    ``**`` glob reads every object under it."""
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for key in ("in/a.jsonl", "in/b.jsonl", "in/2023/old.jsonl"):
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({"text": docs[0]}).encode() + b"\n")
    with pytest.raises(
        DataError, match=rf"input s3://{bucket}/in/2023 \(matched by 's3://{bucket}/in/\*'\) is a directory"
    ):
        list_files([f"s3://{bucket}/in/*"], ".")
    found = [f.path for f in list_files([f"s3://{bucket}/in/**/*.jsonl"], ".")]
    assert found == [f"s3://{bucket}/in/{k}" for k in ("2023/old.jsonl", "a.jsonl", "b.jsonl")]


def test_a_deep_glob_reads_a_prefix_named_as_a_file_whose_parts_it_all_names(s3_server, docs):
    bucket = s3_server.new_bucket()
    for key in ("in/y.jsonl/part-0.jsonl", "in/data.jsonl/part-0.jsonl", "in/data.jsonl/other.jsonl"):
        s3_server.client().put_object(
            Bucket=bucket, Key=key, Body=json.dumps({"text": docs[0]}).encode() + b"\n"
        )
    s3_server.client().put_object(Bucket=bucket, Key="in/y.jsonl/", Body=b"")  # the console's folder marker
    found = [f.path for f in list_files([f"s3://{bucket}/in/y.jsonl/**/*.jsonl"], ".")]
    assert found == [f"s3://{bucket}/in/y.jsonl/part-0.jsonl"]
    found = [f.path for f in list_files([f"s3://{bucket}/in/**/*.jsonl"], ".")]
    assert len(found) == 3
    with pytest.raises(
        DataError, match=rf"its part s3://{bucket}/in/data\.jsonl/other\.jsonl is not matched"
    ):
        list_files([f"s3://{bucket}/in/**/*a*.jsonl"], ".")


def test_a_prefix_named_as_a_file_given_whole_is_advised_by_its_own_ending(s3_server, docs):
    """``--input s3://b/sp/x.parquet``, a prefix of parquet parts, was advised '.../x.parquet/*.jsonl'."""
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="sp/x.parquet/part-0.parquet", Body=b"PAR1")
    with pytest.raises(
        TokshardError, match=rf"name the files in it, e\.g\. 's3://{bucket}/sp/x\.parquet/\*\.parquet'"
    ):
        list_files([f"s3://{bucket}/sp/x.parquet"], ".")


def test_an_object_whose_key_holds_brackets_is_read_by_its_key(s3_server, docs):
    """``[2024] part.jsonl``: a local path that exists is taken as it is, and so is such an
    object (only ``[[]2024]`` named it), even where the glob matches another key (it read
    ``2 part.jsonl`` instead); a glob whose key is no object is still a glob."""
    bucket = s3_server.new_bucket()
    for key in ("odd/[2024] part.jsonl", "odd/2 part.jsonl"):
        s3_server.client().put_object(
            Bucket=bucket, Key=key, Body=json.dumps({"text": docs[0]}).encode() + b"\n"
        )
    found = [f.path for f in list_files([f"s3://{bucket}/odd/[2024] part.jsonl"], ".")]
    assert found == [f"s3://{bucket}/odd/[2024] part.jsonl"]
    found = [f.path for f in list_files([f"s3://{bucket}/odd/[12] part.jsonl"], ".")]
    assert found == [f"s3://{bucket}/odd/2 part.jsonl"]


def test_a_folder_marker_object_is_passed_by_as_a_local_folder_is(s3_server, docs):
    """An empty object whose key ends in ``/`` (the S3 console's "Create folder", rclone, Hadoop):
    ``corpus/**`` refused it as a file of unsupported type; ``**`` passes a local folder by."""
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for key in ("corpus/", "corpus/sub/", "empty/"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
    for key in ("corpus/a.jsonl", "corpus/sub/b.jsonl"):
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({"text": docs[0]}).encode() + b"\n")
    found = [f.path for f in list_files([f"s3://{bucket}/corpus/**"], ".")]
    assert found == [f"s3://{bucket}/corpus/a.jsonl", f"s3://{bucket}/corpus/sub/b.jsonl"]
    with pytest.raises(TokshardError, match="matches only directories"):
        list_files([f"s3://{bucket}/empty/**"], ".")


def test_a_glob_in_a_bucket_that_does_not_exist_names_the_bucket(s3_server):
    """It said "no files match", as for an empty folder of an existing bucket."""
    with pytest.raises(
        TokshardError, match=r"^the bucket of s3://tokshard-no-such-bucket/\*\.jsonl does not exist"
    ):
        list_files(["s3://tokshard-no-such-bucket/*.jsonl"], ".")


def test_an_object_in_a_bucket_that_does_not_exist_names_the_bucket(s3_server):
    """The glob's line, not "no files match ... (no such file)"."""
    with pytest.raises(
        TokshardError, match=r"^the bucket of s3://tokshard-no-such-bucket/x/a\.jsonl does not exist"
    ):
        list_files(["s3://tokshard-no-such-bucket/x/a.jsonl"], ".")


def test_a_fifo_matched_by_a_glob_is_named_and_never_opened(folder, tokenizer_path):
    """Opening a FIFO would block until someone writes to it; its bytes could not be read
    again on a resume either."""
    os.mkfifo(folder / "data" / "pipe.jsonl")
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    refused(proc, "pipe.jsonl (matched by 'data/*.jsonl') is a FIFO (named pipe)", folder / "out")


def test_standard_input_named_as_dash_is_refused_saying_why(folder, tokenizer_path):
    proc = prepare_cli(folder, "-", tokenizer=tokenizer_path)
    refused(
        proc,
        "input '-': standard input cannot be an input, since a rerun must read the same bytes",
        folder / "out",
    )


LATIN1_NAME = os.fsdecode(b"caf\xe9")  # "café" as a Latin-1 system names it: not UTF-8
LATIN1_SHOWN = "caf\\xe9"  # as the error line shows its bytes


@pytest.mark.parametrize(
    ("where", "says"),
    [
        (f"data/{LATIN1_NAME}.jsonl", "(file name 'caf\\xe9.jsonl')"),
        (f"data/{LATIN1_NAME}/c.jsonl", "(folder name 'caf\\xe9')"),
    ],
    ids=["file", "folder"],
)
def test_an_input_whose_path_is_not_utf8_is_named_before_any_work(folder, tokenizer_path, docs, where, says):
    """A file or folder named on a Latin-1 system: its path is kept as UTF-8 in run.json and the
    shards' provenance, so it is refused at planning, not by a worker's traceback half-way."""
    write_jsonl(folder / where, docs[6:8])
    proc = prepare_cli(folder, "data/**/*.jsonl", tokenizer=tokenizer_path)
    shown = f"{folder}/{where.replace(LATIN1_NAME, LATIN1_SHOWN)}"
    refused(proc, f"input {shown}: its path is not UTF-8 text {says}", folder / "out")
    assert "rename the" in one_error_line(proc)


def test_a_utf8_input_path_a_glob_finds_under_an_ascii_locale_is_one_line_naming_the_locale(
    folder, tokenizer_path, docs
):
    """Under LC_ALL=C with PYTHONUTF8=0, Python holds a UTF-8 name's bytes as lone surrogates:
    the check for names that are not UTF-8 found none, and ended in a StopIteration traceback."""
    write_jsonl(folder / "dätä" / "c.jsonl", docs[6:8])
    proc = cli("prepare", "--input", "d*/c.jsonl", "--tokenizer", str(tokenizer_path), "--out", "out",
               "--workers", "1", cwd=folder, env={"LC_ALL": "C", "PYTHONUTF8": "0"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).startswith(
        f"tokshard: error: input '{folder}/d\\xe4t\\xe4/c.jsonl' holds characters "
    )
    assert "run under a UTF-8 locale (e.g. LC_ALL=C.UTF-8) or with PYTHONUTF8=1" in proc.stderr
    assert not (folder / "out").exists()


def test_tokenizer_training_reads_an_input_whose_path_is_not_utf8(tmp_path, docs):
    """`tokenizer train` keeps no input's path, so it reads such a file as any other."""
    write_jsonl(tmp_path / f"{LATIN1_NAME}.jsonl", docs[:20])
    proc = cli(
        "tokenizer", "train", "--input", "*.jsonl", "--vocab-size", "300", "--out", "tok", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "tok" / "tokenizer.json").exists()


def test_a_spark_output_folder_matched_whole_names_its_marker_and_says_to_narrow_the_glob(
    tmp_path, docs, tokenizer_path
):
    """Spark writes ``_SUCCESS`` (and hidden ``.crc`` files) beside its part files: ``out/*``
    matches the marker, which is named with what to do; ``out/*.parquet`` reads the parts."""
    spark = tmp_path / "spark-out"
    spark.mkdir()
    pq.write_table(pa.table({"text": docs[:5]}), spark / "part-00000-1f2e.snappy.parquet")
    (spark / "_SUCCESS").touch()
    (spark / ".part-00000-1f2e.snappy.parquet.crc").write_bytes(b"crc")
    proc = prepare_cli(tmp_path, "spark-out/*", tokenizer=tokenizer_path)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert f"{spark / '_SUCCESS'}: unsupported file type" in line and "narrow the glob" in line
    assert prepare_cli(tmp_path, "spark-out/*.parquet", tokenizer=tokenizer_path).returncode == 0


def test_a_socket_matched_by_a_glob_is_named(folder, tokenizer_path):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "data" / "s.jsonl"))
        proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path)
    refused(proc, "s.jsonl (matched by 'data/*.jsonl') is a socket, not a regular file", folder / "out")


def test_an_unreadable_file_is_named_before_any_work(folder, tokenizer_path):
    """A file this user may not read is refused at planning: no partition is encoded first."""
    (folder / "data" / "b.jsonl").chmod(0)
    proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    refused(proc, f"cannot read input {folder / 'data' / 'b.jsonl'}: permission denied", folder / "out")
    assert not list((folder / "out").rglob("*.json")), "a run was planned"


def test_an_unlistable_folder_a_double_star_glob_reaches_into_is_named(folder, tokenizer_path, docs):
    """glob skips a folder it may not list without a word: its files would be left out."""
    write_jsonl(folder / "data" / "locked" / "c.jsonl", docs[6:8])
    (folder / "data" / "locked").chmod(0o300)  # may enter, may not list
    try:
        proc = prepare_cli(folder, "data/**/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    finally:
        (folder / "data" / "locked").chmod(0o755)
    says = f"cannot list folder {folder / 'data' / 'locked'} that 'data/**/*.jsonl' reaches into"
    refused(proc, says, folder / "out")


def test_a_file_in_an_unlistable_folder_named_by_a_glob_is_not_called_missing(folder, tokenizer_path):
    (folder / "data").chmod(0o300)
    try:
        proc = prepare_cli(folder, "data/*.jsonl", tokenizer=tokenizer_path, as_user=True)
    finally:
        (folder / "data").chmod(0o755)
    refused(proc, f"cannot list folder {folder / 'data'} that 'data/*.jsonl'", folder / "out")


def test_a_file_in_a_folder_this_user_may_not_enter_is_named(folder, tokenizer_path):
    (folder / "data").chmod(0o600)  # may list, may not enter
    try:
        proc = prepare_cli(folder, "data/a.jsonl", tokenizer=tokenizer_path, as_user=True)
    finally:
        (folder / "data").chmod(0o755)
    refused(proc, f"cannot read input {folder / 'data' / 'a.jsonl'}: permission denied", folder / "out")


def files_source(pattern: str):
    from pipeline.sources.files import FilesSource

    return FilesSource("d", FilesSource.normalize("d", {"paths": [pattern]}, "test"))


@pytest.mark.parametrize("texts", [slice(0, 3), slice(0, 60)], ids=["small", "large"])
def test_a_file_gone_between_planning_and_reading_is_named(tmp_path, docs, texts):
    """A worker opening a planned file that was deleted (or whose disk went away) names it,
    whether planning read it (a large file's ends) or only listed it (a small file)."""
    for name in ("a.jsonl", "b.jsonl"):
        write_jsonl(tmp_path / name, docs[texts])
    source = files_source(str(tmp_path / "*.jsonl"))
    parts = source.partitions()
    (tmp_path / "b.jsonl").unlink()
    with pytest.raises(DataError, match=rf"input {tmp_path / 'b.jsonl'} is gone; restore it and rerun"):
        [r for p in parts for r in source.read(p, None)]


def test_a_large_file_gone_between_listing_and_its_fingerprint_is_named(tmp_path, docs):
    (listed,) = list_files([str(write_jsonl(tmp_path / "a.jsonl", docs[:60]))], str(tmp_path))
    assert needs_read(listed)
    (tmp_path / "a.jsonl").unlink()
    with pytest.raises(DataError, match=rf"input {tmp_path / 'a.jsonl'} is gone; restore it and rerun"):
        fingerprints([listed])


def test_an_object_deleted_between_planning_and_reading_is_named(s3_server, docs):
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for i in range(3):
        s3.put_object(
            Bucket=bucket, Key=f"in/d{i}.jsonl", Body=json.dumps({"text": docs[i]}).encode() + b"\n"
        )
    source = files_source(f"s3://{bucket}/in/*.jsonl")
    (part,) = source.partitions()
    s3.delete_object(Bucket=bucket, Key="in/d1.jsonl")
    with pytest.raises(DataError, match=rf"input s3://{bucket}/in/d1\.jsonl is gone; restore it and rerun"):
        list(source.read(part, None))


@pytest.mark.timeout(60)
def test_a_fifo_put_where_a_planned_file_was_is_refused_without_waiting(tmp_path, docs):
    """Opening a FIFO for reading waits for a writer; the reader opens without waiting and
    finds the file is not the one planned."""
    write_jsonl(tmp_path / "a.jsonl", docs[:3])
    source = files_source(str(tmp_path / "*.jsonl"))
    (part,) = source.partitions()
    (tmp_path / "a.jsonl").unlink()
    os.mkfifo(tmp_path / "a.jsonl")
    with pytest.raises(DataError, match=r"a\.jsonl changed since this run started"):
        list(source.read(part, None))


@pytest.mark.parametrize("texts", [slice(0, 3), slice(0, 60)], ids=["small", "large"])
def test_a_folder_put_where_a_planned_file_was_is_named_as_a_folder(tmp_path, docs, texts):
    """A worker never reads a folder as the planned file, whether the file was small (read on
    one descriptor) or large (read through a file object)."""
    write_jsonl(tmp_path / "a.jsonl", docs[texts])
    source = files_source(str(tmp_path / "*.jsonl"))
    (part,) = source.partitions()
    (tmp_path / "a.jsonl").unlink()
    (tmp_path / "a.jsonl").mkdir()
    with pytest.raises(DataError, match=rf"cannot read input {tmp_path / 'a.jsonl'}: it is a directory"):
        list(source.read(part, None))


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


def encoded(text: str, codec: str) -> bytes:
    """``text`` in ``codec``: Python's "utf-16" and "utf-32" write a byte-order mark in the
    machine's order, as Windows tools do; "utf-16-be+bom" puts one before big-endian text."""
    codec, _, mark = codec.partition("+")
    bom = {"utf-16-be": codecs.BOM_UTF16_BE, "utf-32-be": codecs.BOM_UTF32_BE}[codec] if mark else b""
    return bom + text.encode(codec)


def write_foreign(path, docs: list[str], codec: str) -> None:
    """``docs`` in the format ``path``'s name says (a .txt file: the first one), in ``codec``."""
    text = docs[0] if path.name.endswith(".txt") else "".join(json.dumps({"text": d}) + "\n" for d in docs)
    data = encoded(text, codec)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.mark.parametrize(
    ("name", "codec", "policy"),
    [
        ("a.jsonl", "utf-16", "error"),
        ("a.jsonl", "utf-16", "skip"),
        ("a.jsonl", "utf-16-be+bom", "skip"),
        ("a.jsonl", "utf-32", "skip"),
        ("a.txt", "utf-16", "skip"),
        ("a.txt", "utf-32-be+bom", "error"),
        ("a.json.gz", "utf-16", "skip"),
        ("a.jsonl.zst", "utf-32", "skip"),
        ("big.jsonl", "utf-16", "skip"),  # large: its ends are read, and refused, at planning
    ],
)
def test_utf16_and_utf32_input_is_named_and_never_half_kept(
    tmp_path, docs, tokenizer_path, name, codec, policy
):
    """Windows tools write UTF-16 with a byte-order mark; read as UTF-8 some lines parsed and
    some did not. Now the file is refused, beside good files of its partition and under
    either bad-record policy, and nothing is published."""
    write_jsonl(tmp_path / "in" / "0-good.jsonl", docs[:2])
    write_foreign(tmp_path / "in" / name, docs[2:40] if name.startswith("big") else docs[2:6], codec)
    assert name.startswith("a") or (tmp_path / "in" / name).stat().st_size > SMALL_FILE
    proc = prepare_cli(tmp_path, "in/*", tokenizer=tokenizer_path, extra=("--on-bad-record", policy))
    label = codec[:6].upper()
    says = f"{tmp_path / 'in' / name} is {label} text (it starts with a {label} byte-order mark), not UTF-8"
    refused(proc, says, tmp_path / "out")
    assert f"iconv -f {label} -t UTF-8" in one_error_line(proc)


@pytest.mark.parametrize(
    ("name", "codec"),
    [("a.jsonl", "utf-16"), ("a.txt", "utf-32"), ("a.json.gz", "utf-16-be+bom"), ("a.jsonl.zst", "utf-16")],
)
def test_utf16_is_refused_by_every_reader_too(tmp_path, docs, name, codec):
    """Where no planning read the file's bytes (a bucket's listing, tokenizer training), the
    reader of each format says it at its first line."""
    write_foreign(tmp_path / name, docs[:2], codec)
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')} is {codec[:6].upper()} text"):
        list(iter_texts([str(tmp_path / name)]))


@pytest.mark.parametrize(("name", "codec"), [("a.txt", "utf-16-le"), ("a.jsonl", "utf-16-be")])
def test_utf16_without_a_byte_order_mark_is_named(tmp_path, docs, tokenizer_path, name, codec):
    """Without a byte-order mark, mostly-ASCII UTF-16 is valid UTF-8 with a NUL in every other
    byte: a .txt file would become one document of NULs. It is named by its NULs' places."""
    write_jsonl(tmp_path / "in" / "0-good.jsonl", docs[:2])
    write_foreign(tmp_path / "in" / name, docs[2:6], codec)
    proc = prepare_cli(tmp_path, "in/*", tokenizer=tokenizer_path, extra=("--on-bad-record", "skip"))
    label = codec.upper().replace("-LE", "LE").replace("-BE", "BE")
    says = f"{tmp_path / 'in' / name} looks like {label} text without a byte-order mark"
    refused(proc, says, tmp_path / "out")
    assert f"iconv -f {label} -t UTF-8" in one_error_line(proc)


@pytest.mark.parametrize("name", ["a.txt", "a.jsonl"])
def test_a_file_of_nul_bytes_is_refused_as_no_text(tmp_path, docs, tokenizer_path, name):
    """A preallocated or sparse file (`truncate -s 1G`): a .txt of them was one document of
    NULs, a million tokens a MiB (a GiB ran for an hour at 0% with no line)."""
    write_jsonl(tmp_path / "in" / "0-good.jsonl", docs[:2])
    with open(tmp_path / "in" / name, "wb") as f:
        f.truncate(1 << 20)
    proc = prepare_cli(tmp_path, "in/*", tokenizer=tokenizer_path)
    refused(proc, f"{tmp_path / 'in' / name} is mostly NUL bytes at its start", tmp_path / "out")
    assert "leave it out of the inputs" in one_error_line(proc)


@pytest.mark.parametrize("zeros", [2 << 20, 17 << 20], ids=["read-whole", "streamed"])
def test_a_txt_of_text_then_nul_bytes_is_refused_naming_where_they_start(
    tmp_path, docs, tokenizer_path, zeros
):
    """A .txt cut by a crash: its text, then zeros where its last blocks were never written.
    Its start passed the head check, and its NULs became that many tokens, exit 0."""
    text = ("\n".join(docs) * 40).encode()[: 600 << 10]
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "cut.txt", "wb") as f:
        f.write(text)
        f.truncate(len(text) + zeros)  # (a .txt over 16 MiB is streamed)
    proc = prepare_cli(tmp_path, "in/cut.txt", tokenizer=tokenizer_path)
    refused(
        proc,
        f"{tmp_path / 'in' / 'cut.txt'} holds a run of NUL bytes from byte {len(text):,} on",
        tmp_path / "out",
    )


@pytest.mark.parametrize(
    ("codec", "found"),
    [
        ("utf-16-le", "UTF-16LE"),
        ("utf-16-be", "UTF-16BE"),
        ("utf-32-le", "UTF-32LE"),
        ("utf-32-be", "UTF-32BE"),
    ],
)
def test_each_wide_encoding_without_a_mark_is_told_apart(docs, codec, found):
    assert bomless_wide(docs[0][:2000].encode(codec)) == found


@pytest.mark.parametrize(
    "head",
    [
        "日本語のテキスト".encode("utf-16-le"),  # not mostly ASCII: read as invalid UTF-8 instead
        bytes(4096),  # a zeroed file is no text in any encoding
        bytes(range(256)) * 16,  # binary
        b"text with a NUL\0 in it, once" * 10,
    ],
    ids=["cjk-utf16", "zeros", "binary", "one-nul"],
)
def test_other_bytes_with_nuls_are_not_called_utf16(head):
    assert bomless_wide(head) is None


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


def test_a_file_written_to_while_it_is_read_stops_the_run_before_its_new_text_is_committed(
    tmp_path, docs, tokenizer_path, monkeypatch
):
    """A 2 MB .jsonl rewritten in place while its partition is read (same size, a new time):
    the task stops at its next commit naming the file, so no checkpoint holds text of the new
    version and no manifest is written; a rerun refuses the file as it is now, and once the file
    is restored (bytes and time) resumes from the last commit to the planned version's shards."""
    from distributed import Client, LocalCluster

    from pipeline.run import worker_task

    texts = docs * 3  # several encoder items, a commit after each
    path = write_jsonl(tmp_path / "in" / "big.jsonl", texts)
    planned, st = path.read_bytes(), path.stat()
    saved: list[int] = []
    save = worker_task.save_checkpoint

    def edit_after_the_first_commit(out, part, ckpt):
        save(out, part, ckpt)
        saved.append(ckpt.progress)
        if len(saved) == 1:  # the reader is inside the file: old text before its place, new after
            path.write_bytes(planned.replace(b"the", b"THE"))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    monkeypatch.setattr(worker_task, "save_checkpoint", edit_after_the_first_commit)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "commit_seconds": 0.001,
        "sources": {"d": {"type": "files", "paths": [str(path)], "partition_bytes": 1 << 30}},
    }
    out = tmp_path / "out"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c,
        Client(c) as client,
    ):
        says = rf"input {re.escape(str(path))} changed since this run started \(written to while it was read"
        with pytest.raises(DataError, match=says):
            run_prepare(recipe, out, client)
        assert len(saved) == 1 and 0 < saved[0] < len(planned), saved
        assert not (out / "manifest.json").exists()
        monkeypatch.undo()
        with pytest.raises(DataError, match=r"big\.jsonl \(train\) changed since this run started"):
            run_prepare(recipe, out, client)
        path.write_bytes(planned)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        logged: list[str] = []
        run_prepare(recipe, out, client, log=logged.append)
    assert any("1 to resume" in line for line in logged), logged
    assert np.array_equal(stream_of(out / "manifest.json"), plain_encode(tokenizer_path, texts))


# --- a clone made without git-lfs -----------------------------------------------------------------

#: a Git LFS pointer as `git lfs` writes one (its spec's example), and as a Windows checkout
#: with autocrlf leaves it
LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345\n"
)


@pytest.mark.parametrize("name", ["c.txt", "c.parquet"])
def test_a_git_lfs_pointer_among_the_inputs_is_named_and_never_read_as_text(folder, tokenizer_path, name):
    """A dataset repo cloned without git-lfs holds pointers in place of its files: a .txt one
    would have become a document of its three lines, and a parquet one was called corrupt.
    Under either bad-record policy the run stops naming the file and the fix."""
    (folder / "data" / name).write_bytes(LFS_POINTER)
    proc = prepare_cli(folder, "data/*", tokenizer=tokenizer_path, extra=("--on-bad-record", "skip"))
    says = f"{folder / 'data' / name} is a Git LFS pointer, not the file it stands for (12,345 bytes"
    refused(proc, says, folder / "out")
    assert "git lfs pull" in one_error_line(proc)


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.jsonl.gz", "a.jsonl.zst", "a.txt", "a.parquet"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
def test_every_reader_refuses_a_git_lfs_pointer(tmp_path, name, line_end):
    path = tmp_path / name
    path.write_bytes(LFS_POINTER.replace(b"\n", line_end))
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')} is a Git LFS pointer"):
        list(iter_texts([str(path)]))


def test_an_object_that_is_a_git_lfs_pointer_is_refused(s3_server, docs):
    """A clone copied into a bucket as it is (`aws s3 sync`): the object's reader says it."""
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    s3.put_object(Bucket=bucket, Key="in/a.jsonl", Body=json.dumps({"text": docs[0]}).encode() + b"\n")
    s3.put_object(Bucket=bucket, Key="in/b.txt", Body=LFS_POINTER)
    assert list(iter_texts([f"s3://{bucket}/in/a.jsonl"])) == [docs[0]]
    with pytest.raises(DataError, match=rf"s3://{bucket}/in/b\.txt is a Git LFS pointer"):
        list(iter_texts([f"s3://{bucket}/in/b.txt"]))


def test_a_document_that_only_starts_like_a_pointer_is_text(tmp_path):
    """Only the whole of a small file is a pointer: a longer text that quotes one is read."""
    text = (LFS_POINTER + b"and a page of prose about it. " * 40).decode()
    (tmp_path / "a.txt").write_text(text)
    assert list(iter_texts([str(tmp_path / "a.txt")])) == [text]


# --- a web page where a file was meant ------------------------------------------------------------

PAGE = b'<!DOCTYPE html>\n<html lang="en">\n<head><title>in.jsonl</title></head>\n<body><pre>{"text": "a"}</pre></body>\n</html>\n'


class _Quiet(SimpleHTTPRequestHandler):
    """Python's own file server: a page of links for a folder, and no byte ranges."""

    def log_message(self, *args) -> None:
        pass


class _Ranged(_Quiet):
    """A file server that also answers ``Range: bytes=A-B``, as most web servers do."""

    def do_GET(self) -> None:
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if not asked or not path.is_file():
            return super().do_GET()
        data = path.read_bytes()
        start, end = int(asked[1]), int(asked[2]) if asked[2] else len(data) - 1
        part = data[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{start + len(part) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)


@contextlib.contextmanager
def _serving(folder: Path, handler: type) -> Iterator[str]:
    folder.mkdir(exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def web_folder(tmp_path):
    """A real HTTP server on 127.0.0.1 serving ``tmp_path / "web"`` (Python's own)."""
    with _serving(tmp_path / "web", _Quiet) as url:
        yield tmp_path / "web", url


def _big_and_small_files(web: Path, docs: list[str]) -> None:
    """A file larger than fsspec's HTTP read block (5 MiB), read in several ranges, and two small."""
    web.mkdir(exist_ok=True)
    write_jsonl(web / "big.jsonl", docs * (6 * 2**20 // sum(len(d) for d in docs) + 1))
    write_jsonl(web / "c.jsonl", docs[:3])
    write_jsonl(web / "d.jsonl", docs[3:6])


def test_files_behind_a_web_servers_page_of_links_read_as_the_same_local_files(
    tmp_path, docs, tokenizer_path
):
    """A glob over an HTTP folder: its page of links names the files without their sizes, which a
    HEAD of each then gives (before: a traceback); the shards are those of the same files on disk."""
    _big_and_small_files(tmp_path / "web", docs)
    for run in "ab":
        (tmp_path / run).mkdir()
    with _serving(tmp_path / "web", _Ranged) as url:
        from_web = prepare_cli(tmp_path / "a", f"{url}/*.jsonl", tokenizer=tokenizer_path)
    from_disk = prepare_cli(tmp_path / "b", str(tmp_path / "web" / "*.jsonl"), tokenizer=tokenizer_path)
    assert from_web.returncode == from_disk.returncode == 0, from_web.stderr + from_disk.stderr
    hashes = [[s.hash for s in manifest.load(tmp_path / d / "out" / "manifest.json").shards] for d in "ab"]
    assert hashes[0] == hashes[1]


@pytest.mark.parametrize(
    ("named", "extra"),
    [("big.jsonl", ()), ("mid.jsonl", ("--partition-bytes", "1MiB"))],
    ids=["big", "ranges"],
)
def test_a_web_server_without_byte_ranges_is_one_line_before_anything_is_read(
    tmp_path, docs, tokenizer_path, named, extra
):
    """Python's own file server answers every request with the whole file: a file larger than
    one read is then named in one line, not a traceback half-way through it. A smaller file in
    several byte ranges was a traceback from the planner's read of a range's ends."""
    _big_and_small_files(tmp_path / "web", docs)
    write_jsonl(tmp_path / "web" / "mid.jsonl", docs * (3 * 2**20 // sum(len(d) for d in docs) + 1))
    with _serving(tmp_path / "web", _Quiet) as url:
        proc = prepare_cli(tmp_path, f"{url}/{named}", tokenizer=tokenizer_path, extra=extra)
    line = one_error_line(proc)
    assert proc.returncode == 2, proc.stderr
    assert f"{url}/{named}: its server does not answer byte-range requests" in line, line
    assert "download the file" in line


def test_an_html_page_given_as_json_lines_is_named_even_when_skipping_bad_records(
    folder, tokenizer_path, web_folder
):
    """A hub or GitHub "blob" address gives the page about a file: each of its lines was a
    skipped bad record and the run went on without the file."""
    web, url = web_folder
    (web / "train.jsonl").write_bytes(PAGE)
    proc = prepare_cli(
        folder,
        f"{url}/train.jsonl",
        "data/*.jsonl",
        tokenizer=tokenizer_path,
        extra=("--on-bad-record", "skip"),
    )
    refused(proc, f"{url}/train.jsonl is an HTML page, not JSON Lines", folder / "out")
    assert "resolve" in one_error_line(proc)


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.jsonl.gz", "a.jsonl.zst"])
def test_every_json_lines_reader_names_an_html_page(tmp_path, name):
    body = codecs.BOM_UTF8 + b"  " + PAGE.replace(b"DOCTYPE html", b"doctype HTML")
    if name.endswith(".gz"):
        body = gzip.compress(body)
    elif name.endswith(".zst"):
        body = zstandard.ZstdCompressor().compress(body)
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')} is an HTML page, not JSON Lines"):
        list(iter_texts([str(tmp_path / name)]))


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_saved_as_json_lines_is_named_even_when_skipping_bad_records(tmp_path, name, indent):
    """``json.dump(records, f)`` under a ``.jsonl`` name: its first line was a "not a JSON
    object" record, and skipping it left no text at all. A line that is an array of other
    values stays a bad record of its own."""
    body = json.dumps([{"text": "a"}, {"text": "b"}], indent=indent).encode()
    (tmp_path / name).write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')} holds one JSON array, not JSON Lines"):
        list(iter_texts([str(tmp_path / name)], skipped={}))
    (tmp_path / "b.jsonl").write_bytes(b'["a", "b"]\n{"text": "c"}\n')
    skipped: dict[str, int] = {}
    assert list(iter_texts([str(tmp_path / "b.jsonl")], skipped=skipped)) == ["c"]
    assert skipped == {"not a JSON object": 1}


def test_a_txt_file_of_html_is_text(tmp_path):
    """Text files may hold HTML on purpose (a corpus of web pages): only JSON Lines cannot."""
    (tmp_path / "page.txt").write_bytes(PAGE)
    assert list(iter_texts([str(tmp_path / "page.txt")])) == [PAGE.decode()]


# --- a file compressed otherwise than its name says ---


def compressed(body: bytes, how: str) -> bytes:
    import bz2
    import io
    import lzma
    import zipfile

    if how == "zip":
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("in.jsonl", body)
        return out.getvalue()
    return {
        "gzip": gzip.compress,
        "zstd": zstandard.ZstdCompressor().compress,
        "xz": lzma.compress,
        "bzip2": bz2.compress,
        "none": bytes,
    }[how](body)


@pytest.mark.parametrize(
    ("name", "how", "says"),
    [
        # a download saved without its ending
        ("a.jsonl", "gzip", "a.jsonl is gzip-compressed, though its name says plain JSON Lines: rename it to {in}/a.jsonl.gz"),
        ("a.json", "zstd", "a.json is zstd-compressed, though its name says plain JSON Lines: rename it to {in}/a.json.zst"),
        ("big.jsonl", "gzip", "big.jsonl is gzip-compressed, though its name says plain JSON Lines: rename it to {in}/big.jsonl.gz"),
        ("a.txt", "xz", "a.txt is xz-compressed, though its name says plain text: decompress it"),
        # another compression's ending
        ("a.jsonl.gz", "zstd", "a.jsonl.gz is zstd-compressed, not gzip: rename it to {in}/a.jsonl.zst"),
        ("a.jsonl.zst", "bzip2", "a.jsonl.zst is bzip2-compressed, not zstd: rename it to {in}/a.jsonl.bz2"),
        # a download a client decompressed under its compressed name
        ("a.jsonl.gz", "none", "a.jsonl.gz is not gzip-compressed (it starts as JSON text"),
        ("a.json.XZ", "none", "a.json.XZ is not xz-compressed (it starts as JSON text"),
        ("a.jsonl", "zip", "a.jsonl is a zip archive: unzip it and name the files inside"),
    ],
)  # fmt: skip
def test_a_file_compressed_otherwise_than_its_name_says_is_named_with_the_name_it_needs(
    tmp_path, docs, tokenizer_path, name, how, says
):
    """Read by its name, such a file was that many bad records (skipped, under skip: the run
    went on without it) or "corrupt"; a big one is refused at planning, the rest by their reader."""
    write_jsonl(tmp_path / "in" / "0-good.jsonl", docs[:2])
    body = "".join(
        json.dumps({"text": d}) + "\n" for d in (docs * 40 if name.startswith("big") else docs[2:6])
    )
    (tmp_path / "in" / name).write_bytes(compressed(body.encode(), how))
    assert not name.startswith("big") or (tmp_path / "in" / name).stat().st_size > SMALL_FILE
    proc = prepare_cli(tmp_path, "in/*", tokenizer=tokenizer_path, extra=("--on-bad-record", "skip"))
    refused(proc, f"{tmp_path / 'in'}/{says.format(**{'in': tmp_path / 'in'})}", tmp_path / "out")


def test_text_that_starts_like_a_compressed_stream_is_still_text(tmp_path):
    """bzip2's "BZh" is told by the block that follows it, not by those three letters."""
    (tmp_path / "a.txt").write_text("BZh9 is a bzip2 header's start, and this is a sentence about it.")
    assert list(iter_texts([str(tmp_path / "a.txt")])) == [(tmp_path / "a.txt").read_text()]


@pytest.mark.parametrize("pattern", ["corp/f[1-9]*.txt", "corp/none.txt"], ids=["glob", "path"])
def test_a_relative_pattern_that_matches_nothing_is_quoted_before_the_folder_it_is_in(tmp_path, pattern):
    (tmp_path / "corp").mkdir()
    with pytest.raises(TokshardError) as exc:
        expand([pattern], str(tmp_path))
    assert str(exc.value).startswith(f"no files match '{pattern}' (in {tmp_path})")


# --- a store whose answers are not the bytes asked for ---------------------------------------------


def _uploaded(s3_server, path: Path) -> str:
    bucket = s3_server.new_bucket()
    s3_server.client().upload_file(str(path), bucket, f"in/{path.name}")
    return f"s3://{bucket}/in/{path.name}"


def test_an_input_store_that_ignores_byte_ranges_is_one_line_and_no_wrong_text_is_published(
    s3_server, tmp_path, docs, tokenizer_path
):
    """A store (or caching gateway) that answers a Range with the whole object: each partition
    after the first held the file's first documents again, recorded complete, and with
    ``--on-bad-record skip`` the run published them under a manifest that verify calls OK."""
    url = _uploaded(
        s3_server, write_jsonl(tmp_path / "big.jsonl", docs * (3 * 2**20 // sum(map(len, docs)) + 1))
    )
    args = ("--partition-bytes", "1MiB", "--on-bad-record", "skip")
    with faulty_store(s3_server.endpoint, every=0, ignore_ranges=True) as endpoint:
        proc = cli(
            *("prepare", "--input", url, "--tokenizer", str(tokenizer_path), "--out", "out", *args),
            cwd=tmp_path,
            env={"AWS_ENDPOINT_URL": endpoint},
        )
    line = one_error_line(proc)
    assert proc.returncode == 2, proc.stderr
    assert re.search(rf"{url}: the store answered a read of bytes \d+-\d+ with [\d,]+ bytes, not ", line), (
        line
    )
    assert "ignores byte ranges (HTTP Range)" in line, line
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("command", ["prepare", "tokenizer"])
def test_an_input_whose_answers_fail_their_checksum_is_one_line(
    s3_server, tmp_path, docs, tokenizer_path, command
):
    """A body cut short whose Content-Length says so, sent with the whole object's checksum:
    botocore's FlexibleChecksumError was a traceback from prepare and from tokenizer training."""
    url = _uploaded(s3_server, write_jsonl(tmp_path / "small.jsonl", docs[:40]))
    args = {
        "prepare": ("prepare", "--input", url, "--tokenizer", str(tokenizer_path), "--out", "out"),
        "tokenizer": ("tokenizer", "train", "--input", url, "--vocab-size", "500", "--out", "tok"),
    }[command]
    with faulty_store(s3_server.endpoint, every=0, cut_answers=True) as endpoint:
        proc = cli(*args, cwd=tmp_path, env={"AWS_ENDPOINT_URL": endpoint})
    line = one_error_line(proc)
    assert proc.returncode == 2, proc.stderr
    assert f"the store's answers for {url} kept failing the checksum it sent with them" in line, line
    assert not [*tmp_path.rglob("manifest.json"), *tmp_path.rglob("tokenizer.json")]


def test_a_folder_of_folders_of_inputs_is_answered_with_a_glob_that_reaches_them(tmp_path, docs):
    """``--input many``, its files two folders down: the line advised 'many/*.jsonl', which
    matches nothing there."""
    for rel in ("a00/b/x.jsonl", "a00/b/y.jsonl", "a01/z.jsonl"):
        write_jsonl(tmp_path / "many" / rel, docs[:1])
    (tmp_path / "many" / ".cache").mkdir()  # a hidden folder, which ** passes over, is not asked
    (tmp_path / "many" / ".cache" / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(TokshardError) as refused_with:
        list_files([str(tmp_path / "many")], ".")
    advised = re.search(r"e\.g\. '([^']+)' \(quoted\)", str(refused_with.value)).group(1)
    assert advised == f"{tmp_path / 'many'}/**/*.jsonl", str(refused_with.value)
    assert len(list_files([advised], ".")) == 3


@pytest.mark.parametrize("written", ["$RTDATA/x.jsonl", "${RTDATA}/*.jsonl"])
def test_a_path_with_an_environment_variable_says_it_is_not_expanded(tmp_path, monkeypatch, written):
    """paths = ["$RTDATA/x.jsonl"] said only "no files match", though the file is there: ~ is
    expanded, $VARS are not, and the line says so."""
    monkeypatch.setenv("RTDATA", str(tmp_path))
    (tmp_path / "x.jsonl").write_text('{"text": "hi"}\n')
    with pytest.raises(TokshardError) as err:
        list_files([written], str(tmp_path))
    variable = written.split("/")[0]
    assert str(err.value).endswith(
        f"{variable} is not expanded (tokshard reads the path as written, ~ aside): write the path out"
    )
