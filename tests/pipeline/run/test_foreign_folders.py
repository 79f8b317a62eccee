"""`prepare`, `demo` and `tokenizer train` write only into a new or empty folder or one holding
their own state: a folder with files tokshard did not write is refused in one line naming what
is there, and nothing in it is touched (a local folder and an s3:// prefix alike)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support import cli, write_jsonl


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_dataset(tmp_path_factory, docs, tokenizer_path) -> Path:
    """A prepared folder as `prepare` left it (run state included)."""
    d = tmp_path_factory.mktemp("foreign")
    data = write_jsonl(d / "in.jsonl", docs[:30])
    out = d / "done"
    cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out),
        "--workers", "1", check=True)  # fmt: skip
    return out


def prepare_into(out: Path | str, data: Path, tokenizer_path: Path):
    """`tokshard prepare --input DATA --out OUT` as a user types it."""
    return cli(
        "prepare",
        "--input",
        str(data),
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(out),
        "--workers",
        "1",
    )


def foreign_folder(kind: str, where: Path, finished: Path) -> Path:
    where.mkdir()
    if kind == "another tool's manifest.json":
        (where / "manifest.json").write_text(json.dumps({"tool": "other", "files": ["a.parquet"]}))
        (where / "a.parquet").write_bytes(b"PAR1 not ours")
    elif kind == "a model's tokenizer.json":
        (where / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
        (where / "config.json").write_text('{"model_type": "gpt2"}')
    else:  # a finished dataset whose run state was removed
        where.rmdir()
        shutil.copytree(finished, where)
        shutil.rmtree(where / ".tokshard")
    return where


@pytest.mark.parametrize(
    "kind",
    ["another tool's manifest.json", "a model's tokenizer.json", "a dataset whose run state was removed"],
)
def test_prepare_refuses_a_folder_holding_files_it_did_not_write(
    tmp_path, tokenizer_path, finished_dataset, kind
):
    data = write_jsonl(tmp_path / "in.jsonl", ["some text"] * 20)
    out = foreign_folder(kind, tmp_path / "out", finished_dataset)
    before = snapshot(out)
    proc = prepare_into(out, data, tokenizer_path)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    first = sorted(before)[0].split("/")[0]
    assert re.fullmatch(
        rf"tokshard: error: --out {re.escape(str(out))} holds .*{re.escape(first)}.* but no \.tokshard/: prepare did "
        r"not write it .*: choose another --out, or empty that one",
        line,
    ), line
    assert snapshot(out) == before, "a refused prepare touched the folder"


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        (
            "empty",
            r"holds data/, manifest\.json.* beside an empty \.tokshard/, which prepare does not leave so",
        ),
        ("a link", r": its \.tokshard/ is a symbolic link to .*mine; prepare keeps its own state there"),
        ("a link to nothing", r": its \.tokshard/ is a symbolic link to .*nowhere; prepare keeps its own"),
        ("someone else's", r"beside a \.tokshard/ that prepare did not make \(it holds cache/ but no lock, "),
        ("a file of that name", r"holds \.tokshard, data/.* but no \.tokshard/: prepare did not write it"),
    ],
)
def test_a_tokshard_folder_prepare_did_not_fill_does_not_make_the_folder_its_own(
    tmp_path, tokenizer_path, finished_dataset, marker, said
):
    """An empty .tokshard/ beside a dataset (or one linking to a folder of the user's) was taken
    for prepare's own: the user's manifest.json and shards were replaced, or the run state was
    written into the linked folder. Both are refused; nothing of the user's is touched."""
    data = write_jsonl(tmp_path / "in.jsonl", ["some text"] * 20)
    out = foreign_folder("a dataset whose run state was removed", tmp_path / "out", finished_dataset)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    if marker == "empty":
        (out / ".tokshard").mkdir()
    elif marker == "a link":
        (out / ".tokshard").symlink_to(mine)
    elif marker == "a link to nothing":
        (out / ".tokshard").symlink_to(tmp_path / "nowhere")
    elif marker == "a file of that name":
        (out / ".tokshard").write_text("theirs")
    else:  # a tool's own folder of that name, holding files
        (out / ".tokshard" / "cache").mkdir(parents=True)
        (out / ".tokshard" / "cache" / "x").write_text("theirs")
    before, before_mine = snapshot(out), snapshot(mine)
    proc = prepare_into(out, data, tokenizer_path)
    assert proc.returncode == 2, proc.stderr
    assert re.search(said, proc.stderr.strip()), proc.stderr
    assert "\n" not in proc.stderr.strip()
    assert snapshot(out) == before and snapshot(mine) == before_mine


def test_a_run_stopped_just_after_making_its_state_folder_is_taken_up_by_the_rerun(tmp_path, tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", ["some text", "more text"] * 10)
    out = tmp_path / "out"
    (out / ".tokshard").mkdir(parents=True)  # all the first run left
    cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out),
        "--workers", "1", check=True)  # fmt: skip
    assert (out / "manifest.json").is_file()


def test_prepare_into_an_empty_folder_and_a_rerun_into_its_own_are_accepted(tmp_path, tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", ["some text", "more text"] * 10)
    out = tmp_path / "empty"
    out.mkdir()
    common = ["--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out), "--workers", "1"]
    cli("prepare", *common, check=True)
    again = cli("prepare", *common, check=True)
    assert "is already complete" in again.stderr


def test_prepare_refuses_a_store_prefix_holding_objects_it_did_not_write(s3_server, tmp_path, tokenizer_path):
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    s3.put_object(Bucket=bucket, Key="run/manifest.json", Body=b'{"tool": "other"}')
    s3.put_object(Bucket=bucket, Key="run/data/part-0.parquet", Body=b"PAR1")
    before = s3_server.objects(bucket)
    data = write_jsonl(tmp_path / "in.jsonl", ["some text"] * 20)
    url = f"s3://{bucket}/run"
    proc = prepare_into(url, data, tokenizer_path)
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: --out {url} holds data/ and manifest\.json but no \.tokshard/: prepare did not write it .*",
        proc.stderr.strip(),
    ), proc.stderr
    assert s3_server.objects(bucket) == before, "a refused prepare wrote to the store"


def test_demo_refuses_a_folder_holding_other_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    proc = cli("demo", "--out", str(out), "--size", "quick")
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: --out {re.escape(str(out))} holds notes\.txt but no demo\.json: the demo did not "
        r"write it .*",
        proc.stderr.strip(),
    ), proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_tokenizer_train_refuses_a_folder_that_already_holds_files(tmp_path, docs):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text('{"model": "someone else\'s"}')
    before = snapshot(model)
    proc = cli("tokenizer", "train", "--input", str(data), "--vocab-size", "300", "--out", str(model))
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: --out {re.escape(str(model))} already holds tokenizer\.json; tokenizer train writes "
        r"only into a new or empty folder: choose another --out, or empty that one",
        proc.stderr.strip(),
    ), proc.stderr
    assert snapshot(model) == before


def test_a_refusal_names_two_entries_joined_by_and(tmp_path, docs):
    """It read "already holds tokenizer.json, tokenizer_config.json", a list cut short."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "tokenizer_config.json").write_text("{}")
    proc = cli("tokenizer", "train", "--input", str(data), "--vocab-size", "300", "--out", str(model))
    assert proc.returncode == 2, proc.stderr
    assert f"--out {model} already holds tokenizer.json and tokenizer_config.json; " in proc.stderr


def test_a_run_refused_before_its_plan_leaves_no_folder_or_state_behind(tmp_path, tokenizer_path):
    """A mistyped glob on a new --out made the folder and left its lock and run id there; in an
    empty folder of the user's, the run state stayed. Neither is left now."""
    missing = str(tmp_path / "nothing-*.jsonl")
    new = tmp_path / "new"
    proc = cli("prepare", "--input", missing, "--tokenizer", str(tokenizer_path), "--out", str(new))
    assert proc.returncode == 2 and "no files match" in proc.stderr, proc.stderr
    assert not new.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli("prepare", "--input", missing, "--tokenizer", str(tokenizer_path), "--out", str(empty))
    assert proc.returncode == 2 and list(empty.iterdir()) == []


def test_a_fresh_run_refused_leaves_none_of_the_parent_folders_it_made(tmp_path, tokenizer_path):
    """--out deep/nested/x refused (a bad first record, after planning) took back x but left
    deep/nested behind; a parent that was there stays."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"meta": {"text": "hi"}}\n')
    kept = tmp_path / "kept"
    kept.mkdir()
    for out in (tmp_path / "deep" / "nested" / "x", kept / "a" / "b"):
        proc = cli("prepare", "--input", str(bad), "--tokenizer", str(tokenizer_path), "--out", str(out))
        assert proc.returncode == 1 and "bad record" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "kept"]
    assert list(kept.iterdir()) == []
