"""`tokshard samples` shows only what the run trained on (issue 29, item 3): manifests holding
other data under the run's source names, a folder prepared again, or manifests without the
run's sources are one line, as `train --resume` refuses the same change; steps after the
checkpoint are said to be untrained; a reader that quits early ends it quietly (item 6).
Each command is a real `tokshard` process against a real checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, SMALL, cached_manifest, cli, launch, make_manifest

EXTRA = {"extra": ("collections", "ctypes", "idlelib", "pydoc_data", "wsgiref")}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """A 6-step run stopped at step 4, trained on a copy of the test manifest."""
    root = tmp_path_factory.mktemp("samples")
    data = root / "data"
    shutil.copytree(cached_manifest(tmp_path_factory).parent, data)
    save = root / "ck"
    launch("--manifest", str(data), *SMALL, "--micro-batch", "2", "--steps", "6", "--stop-at", "4",
           "--save", str(save))  # fmt: skip
    return {"root": root, "data": data, "save": save}


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr.strip()


def test_other_data_under_the_runs_source_names_is_refused(run, tmp_path):
    tokenizer = run["data"] / "manifest.json"
    other = make_manifest(tmp_path / "other", shard_tokens=30_000, tokenizer_of=tokenizer)  # other shards
    line = one_line(cli("samples", str(run["save"]), "--steps", "1", "--manifest", str(other)), 1)
    assert (
        "samples: the manifests hold other data than the run trained on (source 'stdlib': its shards" in line
    )
    assert "as `train --resume` refuses too; pass --manifest with the manifests the run trained on" in line


def test_a_folder_prepared_again_is_refused_and_the_data_where_it_is_now_is_shown(run, tmp_path):
    kept = tmp_path / "kept"
    shutil.move(run["data"], kept)
    try:
        make_manifest(run["data"], shard_tokens=30_000, tokenizer_of=kept / "manifest.json")  # prepared again
        line = one_line(cli("samples", str(run["save"]), "--steps", "1"), 1)
        assert "the manifests hold other data than the run trained on" in line
        moved = cli("samples", str(run["save"]), "--steps", "1", "--manifest", str(kept))
        assert moved.returncode == 0 and moved.stderr == "" and moved.stdout.startswith("step 1 |")
    finally:
        shutil.rmtree(run["data"])
        shutil.move(kept, run["data"])


@pytest.fixture(scope="module")
def changed(run, tmp_path_factory) -> Path:
    """The run resumed at step 4 on other windows of its data (--seq-len 24, where it had 32,
    accepted by --allow-data-change), its manifest named relative to the folder it ran in."""
    save = tmp_path_factory.mktemp("changed") / "ck"
    shutil.copytree(run["save"], save)
    relative = os.path.relpath(run["data"], REPO)  # `launch` runs in the repository's folder
    launch("--manifest", relative, *SMALL, "--seq-len", "24", "--micro-batch", "2", "--steps", "6",
           "--save", str(save), "--resume", "--allow-data-change")  # fmt: skip
    return save


def test_steps_trained_before_a_data_change_are_refused_not_shown_on_the_new_data(changed):
    line = one_line(cli("samples", str(changed), "--steps", "3-5"), 1)
    assert line == (
        "tokshard: error: samples: step 3 trained on data the run replaced after step 4 (`train --resume "
        "--allow-data-change`); the checkpoint fixes the samples of steps 5 on, so ask for those"
    )


def test_a_manifest_named_relative_to_the_runs_folder_is_found_from_any_folder(changed, tmp_path):
    proc = cli("samples", str(changed), "--steps", "5", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert records and all(r["trained"] and r["tokens"][1] - r["tokens"][0] == 25 for r in records)  # 24 + 1


def test_manifests_without_the_runs_sources_are_one_line(run, tmp_path):
    other = make_manifest(tmp_path / "extra", packages=EXTRA, tokenizer_of=run["data"] / "manifest.json")
    line = one_line(cli("samples", str(run["save"]), "--steps", "1", "--manifest", str(other)), 1)
    assert f"samples: the run trained on 'stdlib', 'asyncio', which {other} holds no 'train' split of" in line
    assert "(its sources: extra); pass --manifest with the manifests the run trained on" in line


def test_steps_after_the_checkpoint_are_said_to_be_untrained(run):
    proc = cli("samples", str(run["save"]), "--steps", "3-6", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "steps 5-6 come after the checkpoint (step00000004, step 4): not trained" in proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {(r["step"], r["trained"]) for r in records} == {(3, True), (4, True), (5, False), (6, False)}
    text = cli("samples", str(run["save"]), "--steps", "4-5").stdout
    assert "step 4 |" in text and "step 5 (not trained) |" in text


def test_steps_past_the_runs_steps_say_which_resume_would_train_them(run):
    """The run ends at --steps 6: a resume with the same settings trains nothing after it."""
    proc = cli("samples", str(run["save"]), "--steps", "7")
    assert proc.returncode == 0, proc.stderr
    assert (
        "shown as a --resume with --steps 7 or more would train them (the run's --steps is 6)" in proc.stderr
    )


@pytest.mark.parametrize("reads", [0, 1], ids=["reader-gone-at-once", "head-1"])
def test_a_reader_that_quits_early_ends_samples_quietly(run, reads):
    cmd = [sys.executable, "-m", "tokshard", "samples", str(run["save"]), "--steps", "1-3000", "--decode"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(reads):
        assert proc.stdout.readline().startswith(b"step 1 |")
    proc.stdout.close()  # as `head` does once it has its lines, or a pager on q
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_decode_without_the_manifests_tokenizer_is_one_line(run, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(run["data"], copy)
    (copy / "tokenizer.json").unlink()
    line = one_line(cli("samples", str(run["save"]), "--steps", "1", "--decode", "--manifest", str(copy)), 1)
    assert f"samples --decode: cannot read the manifest's tokenizer {copy / 'tokenizer.json'}" in line


def test_a_run_folder_that_does_not_exist_is_named_so(tmp_path):
    line = one_line(cli("samples", str(tmp_path / "nowhere"), "--steps", "1"), 2)
    assert line == (
        f"tokshard: error: samples: {tmp_path / 'nowhere'} is not a folder; pass the run's --save folder "
        "(or its run dir)"
    )


def as_older_tokshards(save: Path) -> None:
    """``save``'s checkpoints as a tokshard that recorded no layout in them wrote them."""
    for path in save.glob("step*/tokshard.json"):
        state = json.loads(path.read_text())
        state["batches"] = [{k: b[k] for k in ("step", "samples", "global_batch")} for b in state["batches"]]
        path.write_text(json.dumps(state))


def test_micro_batch_without_world_is_refused_not_ignored(run, tmp_path):
    """Where nothing records the run's ranks; where something does, they are its (below)."""
    save = tmp_path / "ck"
    shutil.copytree(run["save"], save)
    (save / "run.json").unlink()
    as_older_tokshards(save)
    line = one_line(cli("samples", str(save), "--steps", "1", "--micro-batch", "2"), 2)
    assert line.endswith("pass --world N (the run's ranks) with it")
    shown = cli("samples", str(save), "--steps", "1", "--micro-batch", "2", "--world", "1", "--json")
    assert shown.returncode == 0 and '"rank": 0' in shown.stdout, shown.stderr


@pytest.fixture(scope="module")
def accumulated(run, tmp_path_factory) -> Path:
    """A one-step run of global batch 8 in micro-batches of 2: 4 micro-steps on its one rank."""
    save = tmp_path_factory.mktemp("accumulated") / "ck"
    launch("--manifest", str(run["data"]), *SMALL, "--global-batch", "8", "--micro-batch", "2",
           "--steps", "1", "--save", str(save))  # fmt: skip
    return save


def micro_steps(proc: subprocess.CompletedProcess) -> list[tuple[int, int]]:
    assert proc.returncode == 0, proc.stderr
    return [(r["rank"], r["micro"]) for r in map(json.loads, proc.stdout.splitlines())]


def test_the_micro_steps_shown_are_the_ones_the_run_records(accumulated):
    """`--world` without `--micro-batch` took accumulation 1: every sample showed as micro 0."""
    proc = cli("samples", str(accumulated), "--steps", "1", "--world", "1", "--json")
    assert micro_steps(proc) == [(0, m) for m in (0, 0, 1, 1, 2, 2, 3, 3)] and proc.stderr == ""
    alone = cli("samples", str(accumulated), "--steps", "1", "--micro-batch", "2", "--json")
    assert micro_steps(alone) == micro_steps(proc) and alone.stderr == ""  # the ranks: the record's


def test_a_flag_that_differs_from_the_record_wins_and_is_said(accumulated):
    proc = cli("samples", str(accumulated), "--steps", "1", "--world", "1", "--micro-batch", "4", "--json")
    assert micro_steps(proc) == [(0, m) for m in (0, 0, 0, 0, 1, 1, 1, 1)]
    assert (
        proc.stderr.count("\n") == 1
        and "shown as the flags ask (--micro-batch 4 (the record's: 2)), not as the run trained"
        in proc.stderr
    )
    record = accumulated / "step00000001" / "tokshard.json"
    assert f"which {record} records (--world 1 --micro-batch 2)" in proc.stderr


def test_a_layout_that_does_not_split_a_step_is_one_line_with_no_note_before_it(accumulated):
    """--world 3 differs from the record (a note) and does not split the batch of 8: the note
    was said, then the refusal (two lines); the refusal is now the one line."""
    line = one_line(cli("samples", str(accumulated), "--steps", "1", "--world", "3"), 2)
    assert line.endswith("a global batch of 8 does not split into --world 3 ranks of --micro-batch 2; give "
                         "sizes whose product divides it")  # fmt: skip


def test_a_checkpoint_without_a_layout_takes_the_run_json_s(accumulated, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(accumulated, save)
    as_older_tokshards(save)
    record = json.loads((save / "run.json").read_text())
    record["settings"]["checkpoint"]["save"] = str(save)  # the run.json of the run saved there
    (save / "run.json").write_text(json.dumps(record))
    proc = cli("samples", str(save), "--steps", "1", "--world", "1", "--micro-batch", "4", "--json")
    assert f"which {save / 'run.json'} records (--world 1 --micro-batch 2)" in proc.stderr


def test_a_layout_nothing_records_is_said_to_be_assumed(accumulated, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(accumulated, save)
    (save / "run.json").unlink()
    as_older_tokshards(save)
    proc = cli("samples", str(save), "--steps", "1", "--world", "1", "--json")
    assert micro_steps(proc) == [(0, 0)] * 8
    assert proc.stderr == (
        "tokshard: samples: neither the checkpoint nor a run.json records the run's layout: step 1 and any other "
        "step it does not record are shown assuming --micro-batch 8; pass the values the run trained with if "
        "those differ\n"
    )


def test_each_steps_layout_is_the_checkpoints_after_a_resume_changed_it(run, accumulated, tmp_path):
    """A resume rewrites run.json: the layout of the steps before it was shown "assumed" (the
    new micro-batch), though the checkpoint knows it. Step 1 trained in micro-batches of 2, step
    2 (resumed) in micro-batches of 4; --world alone shows each as it trained, saying nothing."""
    save = tmp_path / "ck"
    shutil.copytree(accumulated, save)
    launch("--manifest", str(run["data"]), *SMALL, "--global-batch", "8", "--micro-batch", "4",
           "--steps", "2", "--resume", "--save", str(save))  # fmt: skip
    proc = cli("samples", str(save), "--steps", "1-2", "--world", "1", "--json")
    assert micro_steps(proc) == [(0, m) for m in (0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1)]
    assert proc.stderr == ""


@pytest.mark.parametrize("damage", ["cut", "gone"])
def test_a_shard_cut_or_gone_is_one_line_naming_it_as_train_resume_says(run, tmp_path, damage):
    """`samples --decode` was an IndexError or FileNotFoundError traceback, and `samples`
    without it showed windows of a shard that is no longer what the run read."""
    copy = tmp_path / "data"
    shutil.copytree(run["data"], copy)
    shard = sorted(copy.rglob("*.bin"))[-1]
    if damage == "cut":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        shard.unlink()
    for extra in ([], ["--decode"]):
        line = one_line(
            cli("samples", str(run["save"]), "--steps", "1-4", "--manifest", str(copy), *extra), 1
        )
        assert str(shard) in line
