"""`tokshard status DIR` on an interrupted folder: per split done/partial/pending, tokens
committed, whether a run holds the lock (with its rate and ETA), and what a rerun would do."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from support import as_an_older_tokshard_left_it, cli, corpus, files_recipe, start_prepare

from pipeline import recipe
from pipeline.format.errors import TokshardError
from pipeline.run.driver import RunOptions, prepare
from pipeline.run.folder_layout import run_lock


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, docs, tokenizer_path):
    """A real run stopped by a bad record: other partitions done (or never started), the bad
    one committed up to the record."""
    d = tmp_path_factory.mktemp("status")
    lines = [json.dumps({"text": t}) for t in docs[:60]]
    lines[30] = '{"text": "broken'
    (d / "in.jsonl").write_text("\n".join(lines) + "\n")
    r = recipe.from_dict(
        {
            "tokenizer": str(tokenizer_path),
            "sources": {"d": {"type": "files", "paths": [str(d / "in.jsonl")], "partition_bytes": 30_000}},
        },
        "test",
    )
    with pytest.raises(TokshardError, match="bad record"):
        prepare(r, d / "out", RunOptions(workers=1), log=lambda m: None)
    return d / "out"


def test_status_counts_partitions_and_says_what_a_rerun_does(interrupted):
    s = json.loads(cli("status", str(interrupted), "--json", check=True).stdout)
    row = s["splits"]["d/train"]
    planned = len(json.loads((interrupted / ".tokshard" / "run.json").read_text())["partitions"])
    assert row["partial"] == 1 and row["done"] >= 1 and row["done"] + 1 + row["pending"] == planned
    assert row["tokens"] > 0 and s["running"] is None and not s["complete"]
    start = f", start {row['pending']} pending partitions" if row["pending"] else ""
    assert (
        s["rerun"]
        == f"resume 1 partial partitions from their last commit points{start}, then write the manifest"
    )
    text = cli("status", str(interrupted), check=True).stdout
    assert f"d/train: {row['done']} done, 1 partial, {row['pending']} pending partitions; " in text
    assert f"{row['tokens']:,} tokens" in text and "running: no" in text


def test_status_says_a_rerun_redoes_a_partial_an_older_tokshard_began_without_provenance(
    interrupted, tmp_path
):
    old = tmp_path / "old"
    shutil.copytree(interrupted, old)
    as_an_older_tokshard_left_it(old)
    s = json.loads(cli("status", str(old), "--json", check=True).stdout)
    assert s["splits"]["d/train"]["partial"] == 1
    assert s["rerun"].startswith(
        "redo 1 partial partitions whose committed work has no provenance from their start"
    )
    assert "resume" not in s["rerun"]


def test_status_of_an_unfinished_runs_manifest_path_reads_its_folder(interrupted):
    """Its manifest.json is not written yet: it said the path does not exist."""
    by_manifest = cli("status", str(interrupted / "manifest.json"), "--json", check=True).stdout
    assert by_manifest == cli("status", str(interrupted), "--json", check=True).stdout


def test_status_names_the_run_holding_the_lock_with_rate_and_eta(interrupted):
    with run_lock(interrupted, "test-run"):  # this process plays a running prepare
        text = cli("status", str(interrupted), check=True).stdout
    assert f"running: pid {os.getpid()} on " in text
    assert re.search(r"running: .*; [\d.]+[kMGT]? tok/s, ETA \d+:\d\d:\d\d", text), text
    assert f"a rerun would: be refused while pid {os.getpid()}" in text


def running_rates(proc, where: str) -> list[float]:
    """What `tokshard status` reports, read over and over while ``proc`` runs (in this process:
    the same function the command prints, without a fresh interpreter per look): the rates it
    showed while a run held the output and its input was not all done. A short pause between
    looks: a busy loop took a core from the run it watched (more CPU than the run itself)."""
    from pipeline.run.status import status

    rates = []
    while proc.poll() is None:
        time.sleep(0.05)
        try:
            s = status(where)
        except TokshardError:  # no plan yet
            continue
        if s["running"] and s["progress"] < 1:
            rates.append(s["tokens_per_s"])
    return rates


@pytest.fixture(scope="module")
def long_input(tmp_path_factory, docs) -> Path:
    """7 MB of real text: seconds of encoding for one worker with the reference encoder."""
    return corpus(tmp_path_factory.mktemp("long") / "in.jsonl", docs, copies=10)


@pytest.mark.parametrize(
    ("store", "partition_bytes"), [(False, 50_000), (True, 500_000)], ids=["folder", "store"]
)
def test_status_shows_the_rate_of_a_run_that_progresses(
    long_input, tokenizer_path, tmp_path, s3_server, store, partition_bytes
):
    """Small partitions, each done long before its first commit point: a running prepare has
    no partial checkpoint most of the time, so the rate `status` shows must be the driver's own,
    recorded with its lock or lease (partitions' commits alone would show 0 tok/s)."""
    recipe = files_recipe(tmp_path / "r.toml", tokenizer_path, long_input, partition_bytes=partition_bytes)
    where = f"s3://{s3_server.new_bucket()}/run" if store else str(tmp_path / "out")
    proc = start_prepare(recipe, where, "--workers", "1", "--encoder", "tokenizers")  # the slowest
    rates = running_rates(proc, where)
    _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    shown = [r for r in rates if r > 0]
    assert shown and rates[-1] > 0, rates  # once the first partitions are done, always


@pytest.mark.parametrize(
    ("file", "field", "value", "says"),
    [
        ("run.json", "index", None, "unreadable run plan (Partition field 'index' is None, not int)"),
        ("run.json", "size", "7", "unreadable run plan (Partition field 'size' is '7', not int)"),
        ("part", "tokens", "x", "unreadable checkpoint (Checkpoint field 'tokens' is 'x', not int)"),
        (
            "part",
            "skipped",
            ["x"],
            "unreadable checkpoint (Checkpoint field 'skipped' is ['x'], not dict[str, int])",
        ),
    ],
)
def test_run_state_of_the_wrong_types_is_one_line_naming_the_field(
    interrupted, tmp_path, file, field, value, says
):
    """Taken as it came, a hand edit or a cut file was a traceback in status's sums."""
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    state = out / ".tokshard"
    path = state / "run.json" if file == "run.json" else sorted((state / "parts").rglob("*.json"))[0]
    data = json.loads(path.read_text())
    (data["partitions"][0] if file == "run.json" else data)[field] = value
    path.write_text(json.dumps(data))
    proc = cli("status", str(out))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    assert says in proc.stderr


@pytest.mark.parametrize("change", ["grown", "gone"])
def test_status_says_a_rerun_would_refuse_an_input_changed_since(tmp_path, docs, tokenizer_path, change):
    """It said "nothing: the run is complete" where the rerun refused the changed input."""
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:5]))
    out = tmp_path / "out"
    cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out), "--workers", "1",
        check=True)  # fmt: skip
    if change == "grown":
        with data.open("a") as f:
            f.write(json.dumps({"text": "one more"}) + "\n")
    else:
        data.unlink()
    said = json.loads(cli("status", str(out), "--json", check=True).stdout)["rerun"]
    rerun = cli(
        "prepare", "--input", str(tmp_path / "*.jsonl"), "--tokenizer", str(tokenizer_path), "--out", str(out)
    )
    assert (
        rerun.returncode == 1 and said == "refuse: " + rerun.stderr.removeprefix("tokshard: error: ").strip()
    )


@pytest.mark.parametrize("change", ["edited", "gone"])
def test_status_says_a_rerun_would_refuse_the_tokenizer_changed_since(tmp_path, docs, tokenizer_path, change):
    """It said "nothing: the run is complete" where the rerun refused it as a different recipe."""
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:3]))
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    tok.write_bytes(tokenizer_path.read_bytes())
    out = tmp_path / "out"
    cli(
        "prepare",
        "--input",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(out),
        "--workers",
        "1",
        check=True,
    )
    if change == "edited":
        tok.write_text(json.dumps({**json.loads(tok.read_text()), "truncation": None}, indent=1))
    else:
        tok.unlink()
    said = json.loads(cli("status", str(out), "--json", check=True).stdout)["rerun"]
    rerun = cli("prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(out))
    assert rerun.returncode == 2, rerun.stderr
    if change == "edited":
        assert "different recipe (tokenizer_sha256: " in rerun.stderr
        assert (
            said
            == f"refuse: {tok} is not the tokenizer this run was planned with (its content changed since); "
            "restore it, or start over with a new --out"
        )
    else:
        assert said == "refuse: " + rerun.stderr.removeprefix("tokshard: error: ").strip()
