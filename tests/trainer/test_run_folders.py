"""What `tokshard train` writes into (issue 29, item 1): a fresh run only into an empty folder
or one it makes, a resume only into its own; anything else is one line saying what is there
and what to do, and nothing there is touched. Each run is a real `tokshard train` process."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support import SMALL, cached_manifest, cli, launch, metrics, one_error_line, rank_killed

from trainer.checkpoint.state import saved_tags
from trainer.metrics import line_kind


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


@pytest.fixture(scope="module")
def halfway(manifest, tmp_path_factory) -> dict[str, Path]:
    """A run of 4 steps stopped at step 2: checkpoints in ``save``, its record in ``run``."""
    root = tmp_path_factory.mktemp("folders")
    save, run = root / "ck", root / "run"
    launch(*train_args(manifest), "--stop-at", "2", "--save", str(save), "--run-dir", str(run))
    return {"save": save, "run": run}


def halfway_copy(halfway: dict[str, Path], save: Path) -> Path:
    """A copy of ``halfway``'s checkpoints as the fixture made them, at step 2 (another test here
    resumes the fixture's own to step 4, in some orders before the copy is taken)."""
    shutil.copytree(halfway["save"], save)
    for later in save.glob("step*"):
        if later.name > "step00000002":
            shutil.rmtree(later)
    (save / "latest").write_text("step00000002")
    return save


def train_args(manifest: Path) -> list[str]:
    return ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4"]


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(*args: str) -> str:
    """`tokshard train ARGS` ends in exactly one error line, exit 2, no traceback."""
    proc = cli("train", *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokshard: error: "), proc.stderr
    return lines[0]


def test_a_fresh_run_into_another_runs_folder_is_refused_and_its_record_kept(manifest, halfway, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(halfway["run"], run)
    before = contents(run)
    line = refused(*train_args(manifest), "--run-dir", str(run))
    assert f"--run-dir {run} holds the record of another run (metrics.jsonl and run.json)" in line
    assert line.endswith("choose another --run-dir, or pass --resume with the --save of that run")
    assert contents(run) == before


def test_a_fresh_run_into_a_folder_of_other_files_is_refused(manifest, tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    (save / "notes.txt").write_text("mine")
    line = refused(*train_args(manifest), "--save", str(save))
    assert f"--save {save} is not empty (it holds notes.txt)" in line
    assert contents(save) == {"notes.txt": b"mine"}


def test_a_save_folder_of_a_run_that_saved_no_checkpoint_says_there_is_nothing_to_resume(
    manifest, halfway, tmp_path
):
    save = tmp_path / "ck"
    shutil.copytree(halfway["run"], save)  # a run's record, killed before its first save
    line = refused(*train_args(manifest), "--save", str(save))
    assert "holds the record of a run that saved no checkpoint (metrics.jsonl and run.json)" in line
    assert "nothing to resume" in line
    # with --resume, the same folder says the same (it said to drop --resume, which said this)
    line = refused(*train_args(manifest), "--save", str(save), "--resume")
    assert (
        "holds the record of a run that stopped before its first checkpoint (metrics.jsonl and run.json)"
        in line
    )
    assert "remove those files and run without --resume to start again there" in line


def test_the_same_command_after_a_stop_before_the_first_checkpoint_starts_over(manifest, tmp_path):
    """A run killed before its first checkpoint (SIGKILL, an OOM, a cut shard) left its record
    in --save, and the same command again was refused for it: a record of these very settings
    is replaced, with nothing else in the folder; another run's is still refused, untouched."""
    from pipeline.format.errors import TokshardError
    from tokshard.commands.train import parse
    from trainer.run_folders import check_outputs, run_record

    save = tmp_path / "ck"
    save.mkdir()
    args = [*train_args(manifest), "--save", str(save)]
    settings = parse(args)
    (save / "run.json").write_text(json.dumps(run_record(settings, start_step=0)))
    (save / "metrics.jsonl").write_text('{"step": 1}\n')
    (save / "samples-rank0.jsonl").write_text('{"step": 1}\n')
    check_outputs(settings)  # the same command: not refused
    another = parse([*args, "--lr", "1e-3"])
    with pytest.raises(TokshardError, match="holds the record of a run that saved no checkpoint"):
        check_outputs(another)
    from trainer.run_folders import start_over

    assert start_over(save, another) == []
    assert start_over(save, settings) == ["metrics.jsonl", "run.json", "samples-rank0.jsonl"]
    assert list(save.iterdir()) == []


def test_the_same_command_after_a_kill_during_the_first_save_starts_over(manifest, tmp_path):
    """A kill -9 while the first checkpoint was written left its unfinished ``.partial`` beside
    the run's record, and the same command was refused for it ("choose another --save, or
    remove those files ... the command that run was started with starts it over"): that folder
    is the run's own unfinished save, taken back with the rest."""
    save = tmp_path / "ck"
    args = [*train_args(manifest), "--save", str(save), "--save-every", "2"]
    killed = cli("train", *args, env=rank_killed(tmp_path / "hook", 0, "save"))
    assert killed.returncode == -9, killed.stderr[-3000:]
    left = ["metrics.jsonl", "run.json", "step00000002.partial"]
    assert sorted(p.name for p in save.iterdir() if not p.name.startswith(".")) == left
    done = cli("train", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{save} held the record ({', '.join(left)}) of a start of this same run" in done.stdout
    assert saved_tags(save) == ["step00000002", "step00000004"]
    assert not list(save.glob("*.partial"))


def test_a_first_saves_unfinished_folder_in_a_save_apart_from_the_record_is_taken_back_too(
    manifest, tmp_path
):
    """With --run-dir apart from --save, the record is in one and the unfinished save in the
    other: the same command starts over on both; another run is still refused both."""
    from pipeline.format.errors import TokshardError
    from tokshard.commands.train import parse
    from trainer.run_folders import check_outputs, run_record, start_over

    save, run = tmp_path / "ck", tmp_path / "run"
    args = [*train_args(manifest), "--save", str(save), "--run-dir", str(run)]
    settings = parse(args)
    run.mkdir()
    (run / "run.json").write_text(json.dumps(run_record(settings, start_step=0)))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (save / "step00000002.partial").mkdir(parents=True)
    check_outputs(settings)
    with pytest.raises(TokshardError, match=f"--save {save} is not empty"):
        check_outputs(parse([*args, "--lr", "1e-3"]))
    assert start_over(run, settings) == ["metrics.jsonl", "run.json", str(save / "step00000002.partial")]
    assert list(run.iterdir()) == list(save.iterdir()) == []


def test_a_resume_logs_into_its_own_run_folder_and_refuses_another_runs(manifest, halfway, tmp_path):
    other = tmp_path / "other"
    launch(*train_args(manifest), "--steps", "1", "--run-dir", str(other))
    before = contents(other)
    resume = [*train_args(manifest), "--save", str(halfway["save"]), "--resume"]
    line = refused(*resume, "--run-dir", str(other))
    assert f"--run-dir {other} holds the record of another run" in line and "not this run's" in line
    assert contents(other) == before
    launch(*resume, "--run-dir", str(halfway["run"]))
    assert [t["step"] for t in metrics(halfway["run"])[0]] == [1, 2, 3, 4]
    assert json.loads((halfway["run"] / "run.json").read_text())["start_step"] == 2


def test_a_run_started_where_its_runs_folder_cannot_be_made_is_one_line(manifest):
    """No --run-dir and a working folder this user cannot write (``cd /proc``): three chained
    tracebacks came after the engine was built."""
    proc = cli("train", *train_args(manifest), "--steps", "1", cwd="/proc")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert one_error_line(proc).startswith("tokshard: error: cannot make the run's folder /proc/runs/")
    assert "pass --run-dir DIR (or --save DIR) in a place this user can write" in proc.stderr


def test_a_resume_under_another_zero_stage_is_refused_and_the_checkpoint_kept(manifest, halfway, tmp_path):
    """Saved under ZeRO 0, resumed with a ZeRO 3 config: an AssertionError deep in DeepSpeed's
    loader, 40 lines of traceback."""
    save = tmp_path / "ck"
    shutil.copytree(halfway["save"], save)
    before = contents(save)
    config = Path(__file__).parents[2] / "trainer" / "configs" / "zero3-opt.json"
    line = refused(
        *train_args(manifest), "--resume", "--save", str(save), "--run-dir", str(tmp_path / "r"),
        "--deepspeed", str(config),
    )  # fmt: skip
    assert line == (
        "tokshard: error: --resume: the checkpoint was saved under ZeRO stage 0, this run's --deepspeed "
        "config asks for stage 3, and one stage cannot load another's files; resume with the --deepspeed "
        "config it was saved with (stage 0), or start a new run in another --save"
    )
    lock = ".tokshard-train.lock"  # the lock file names whoever took it last
    assert {k: v for k, v in contents(save).items() if k != lock} == {
        k: v for k, v in before.items() if k != lock
    }


def test_a_resume_with_nothing_left_to_train_writes_no_run_record(manifest, halfway, tmp_path):
    """Its checkpoint at step 2 or later, asked to train to step 1 (as a finished job requeued
    is): nothing to do, exit 0, and no run.json for the no-op (one was written over the record
    of the run that trained, its steps and start step the no-op's)."""
    save, run = tmp_path / "ck", tmp_path / "run"
    shutil.copytree(halfway["save"], save)  # (other tests here resume it further)
    args = [a if a != "4" else "1" for a in train_args(manifest)]  # --steps 1
    proc = cli("train", *args, "--resume", "--save", str(save), "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"the checkpoint is at step \d+; nothing to do up to step 1", proc.stdout), proc.stdout
    assert "the learning rate follows" not in proc.stdout  # no step trains by any schedule
    assert not (run / "run.json").exists()


def test_a_resume_with_nothing_to_do_into_a_new_run_dir_leaves_it_open_to_the_next_resume(
    manifest, halfway, tmp_path
):
    """A no-op resume (checkpoint at step 2, --steps 1) into a new --run-dir records nothing
    there: it left an empty metrics.jsonl, and the resume that then trains on (--steps 4) into
    the same --run-dir was refused for it, as another run's folder."""
    save, run = halfway_copy(halfway, tmp_path / "ck"), tmp_path / "run"
    args = [a if a != "4" else "1" for a in train_args(manifest)]  # --steps 1
    proc = cli("train", *args, "--resume", "--save", str(save), "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (run / "metrics.jsonl").exists()
    launch(*train_args(manifest), "--resume", "--save", str(save), "--run-dir", str(run))
    assert [t["step"] for t in metrics(run)[0]] == [3, 4]


def test_a_resume_into_an_earlier_run_dir_says_where_the_steps_before_it_were_logged(manifest, tmp_path):
    """Steps 1-2 logged in r1, 3-4 in r2, then resumed into r1 again: r1's record had a gap
    (steps 3-4); a resume line between its step 2 and step 5 now says they are in r2's."""
    save, r1, r2 = tmp_path / "ck", tmp_path / "r1", tmp_path / "r2"
    args = [a if a != "4" else "6" for a in train_args(manifest)]  # --steps 6
    launch(*args, "--stop-at", "2", "--save", str(save), "--run-dir", str(r1))
    launch(*args, "--stop-at", "4", "--resume", "--save", str(save), "--run-dir", str(r2))
    out = launch(*args, "--resume", "--save", str(save), "--run-dir", str(r1))
    lines = [json.loads(x) for x in (r1 / "metrics.jsonl").read_text().splitlines()]
    resumes = [x for x in lines if line_kind(x) == "resume"]
    assert resumes == [
        {"step": 4, "resumed": str(save / "step00000004"), "logged_in": str(r2), "last_here": 2}
    ]
    assert [x["step"] for x in lines if line_kind(x) != "eval"] == [1, 2, 4, 5, 6]
    assert f"whose steps {r2} logged; its steps after 2 are there" in out.stdout


def test_a_run_stopped_before_writing_anything_is_told_to_rerun_the_same_command(tmp_path):
    """A SIGTERM before the first step leaves only the writer's lock in --save: a rerun there works."""
    from trainer.run_folders import WRITER_LOCK, how_to_continue

    save = tmp_path / "ck"
    save.mkdir()
    (save / WRITER_LOCK).write_text("{}")
    assert how_to_continue(save, resumed=False) == (
        f"it stopped before writing anything into {save}: rerun the same command to start again"
    )
    (save / "run.json").write_text("{}")
    assert how_to_continue(save, resumed=False).startswith(f"no checkpoint was saved in {save}, so")


def test_a_refused_run_takes_back_the_folders_it_made_and_keeps_those_it_found(manifest, tmp_path):
    """Refused after taking its writer's lock (a --seq-len past the model's positions), a run
    left --save (and its parents) made, holding only the lock file."""
    kept = tmp_path / "kept"
    kept.mkdir()
    refused(*train_args(manifest), "--seq-len", "100000", "--save", str(tmp_path / "a" / "b" / "ck"))
    refused(
        *train_args(manifest), "--seq-len", "100000", "--save", str(kept), "--run-dir", str(tmp_path / "run")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert list(kept.iterdir()) == []


def test_a_resume_stopped_before_its_record_leaves_no_metrics_in_the_run_dir_it_made(
    manifest, halfway, tmp_path
):
    """A resume whose checkpoint cannot be loaded stops after opening metrics.jsonl (its start
    notes) in a new --run-dir and before its run.json: that folder went on holding it, and the
    same resume, from a whole copy of the checkpoint, was refused for it ("holds metrics.jsonl,
    not this run's")."""
    save, run = tmp_path / "ck", tmp_path / "run"
    shutil.copytree(halfway["save"], save)  # at step 2, or 4 where another test resumed it first
    states = save / (save / "latest").read_text().strip() / "mp_rank_00_model_states.pt"
    whole = states.read_bytes()
    states.write_bytes(whole[: len(whole) // 2])
    args = [*train_args(manifest), "--steps", "6", "--resume", "--save", str(save), "--run-dir", str(run)]
    proc = cli("train", *args)
    assert proc.returncode != 0 and "cannot be loaded" in one_error_line(proc)
    assert not run.exists()
    states.write_bytes(whole)
    done = cli("train", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "run.json").is_file()


def test_a_refused_resume_into_a_folder_of_the_users_files_leaves_no_lock_file(manifest, tmp_path):
    """ "--resume: no checkpoint in ..." left .tokshard-train.lock beside the user's notes."""
    save = tmp_path / "mine"
    save.mkdir()
    (save / "notes.txt").write_text("mine")
    line = refused(*train_args(manifest), "--resume", "--save", str(save), "--run-dir", str(tmp_path / "r"))
    assert sorted(p.name for p in save.iterdir()) == ["notes.txt"]
    # it said "drop --resume to start fresh", which a folder holding files refuses: say what works
    assert line == (
        f"tokshard: error: --resume: --save {save} holds no checkpoint (it holds notes.txt), so there is "
        "nothing to resume; pass the --save of the run to continue, or, to start a new run, an empty or "
        "new --save without --resume"
    )


def test_a_users_own_metrics_jsonl_is_not_called_a_runs_record(manifest, tmp_path):
    """Only tokshard's run.json makes a folder a run's record; a file of the user's named
    metrics.jsonl is a folder holding other files, and the line says to remove none of it."""
    save = tmp_path / "mine"
    save.mkdir()
    (save / "metrics.jsonl").write_text("hi\n")
    line = refused(*train_args(manifest), "--save", str(save))
    assert line == (
        f"tokshard: error: --save {save} is not empty (it holds metrics.jsonl); a new run writes only into "
        "an empty folder or one it makes: choose another --save"
    )
    assert contents(save) == {"metrics.jsonl": b"hi\n"}


def test_a_resume_that_leaves_out_the_runs_run_dir_is_refused_naming_it(manifest, halfway, tmp_path):
    """The first part logged into --run-dir; a resume without it would have begun a second
    metrics.jsonl in --save, splitting the run's record in two."""
    save = tmp_path / "ck"
    shutil.copytree(halfway["save"], save)
    before = contents(save)
    line = refused(*train_args(manifest), "--save", str(save), "--resume")
    assert line == (
        f"tokshard: error: --resume: the run saved in --save {save} keeps its record in --run-dir "
        f"{halfway['run'].resolve()}; pass that --run-dir to continue its metrics.jsonl there, or another "
        "--run-dir to start a new record"
    )
    assert contents(save) == before


@pytest.mark.parametrize("saved_in", ["fp32", "bf16"])
def test_a_resume_under_another_precision_is_refused(manifest, halfway, tmp_path, saved_in):
    """fp32 resumed as bf16 was a KeyError 'dynamic_loss_scale' deep in DeepSpeed's loader, bf16
    resumed as fp32 a KeyError 'param_groups'. The fp32 checkpoint's record is edited to read as
    a bf16 one (a real bf16 checkpoint takes another run)."""
    save = tmp_path / "ck"
    shutil.copytree(halfway["save"], save)
    config = json.loads((Path(__file__).parents[2] / "trainer" / "configs" / "zero0-fp32.json").read_text())
    if saved_in == "fp32":
        config["bf16"] = {"enabled": True}
    else:  # the checkpoint a resume reads (other tests here resume `halfway` further)
        state_file = save / (save / "latest").read_text().strip() / "tokshard.json"
        state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "precision": "bf16"}))
    (tmp_path / "ds.json").write_text(json.dumps(config))
    now = "bf16" if saved_in == "fp32" else "fp32"
    line = refused(
        *train_args(manifest), "--resume", "--save", str(save), "--run-dir", str(tmp_path / "r"),
        "--deepspeed", str(tmp_path / "ds.json"),
    )  # fmt: skip
    assert line == (
        f"tokshard: error: --resume: the checkpoint was saved in {saved_in}, this run's --deepspeed config "
        f"asks for {now}, and DeepSpeed cannot load one precision's optimizer state into another; resume "
        f"with the --deepspeed config it was saved with ({saved_in}), or start a new run in another --save"
    )


def test_a_resume_of_a_checkpoint_without_a_recorded_precision_is_not_refused(manifest, halfway, tmp_path):
    """An older checkpoint (no precision field) is read as before: the check does not refuse it."""
    from trainer.checkpoint import resume, state

    saved = state.read_tag(halfway["save"], "step00000002")
    assert saved.precision == "fp32"
    resume.check_precision(saved, "fp32")
    older = json.loads((halfway["save"] / "step00000002" / "tokshard.json").read_text())
    del older["precision"]
    resume.check_precision(state.TrainerState.from_json(older), "bf16")


def test_a_failed_first_save_says_which_files_to_remove_and_then_the_rerun_is_not_refused(tmp_path):
    """A full disk at the first checkpoint said "free space there, then run again", and running
    again was refused for the failed run's record in --save."""
    import errno

    from trainer.checkpoint.save import save_error
    from trainer.run_folders import refuse_unless_empty

    save = tmp_path / "ck"
    (save / "step00000002.partial").mkdir(parents=True)  # removed after the line is made
    for name in ("metrics.jsonl", "run.json", ".tokshard-train.lock"):
        (save / name).write_text("{}\n")
    error = save_error(OSError(errno.ENOSPC, "No space left on device"), save, "step00000002", save)
    assert str(error).endswith(
        "no earlier checkpoint exists; free space there, then run the same command again (it starts over, "
        f"replacing metrics.jsonl, run.json in {save})"
    )
    shutil.rmtree(save / "step00000002.partial")
    for name in ("metrics.jsonl", "run.json"):
        (save / name).unlink()
    refuse_unless_empty(save, "--save")  # what the rerun checks: nothing left in the way
    run_elsewhere = save_error(OSError(errno.ENOSPC, "No space left on device"), save, "step00000002", None)
    assert str(run_elsewhere).endswith("free space there, then run the same command again")


@pytest.mark.parametrize("damage", ["empty", "folder", "outside"])
def test_a_damaged_latest_is_one_line_naming_it_and_the_checkpoints_there(
    manifest, halfway, tmp_path, damage
):
    """An empty `latest` was said to be a missing DIR/tokshard.json; a folder `latest` was taken
    for a run with no checkpoint, told to remove the files beside its checkpoints; a path in
    `latest` resumed another run's checkpoint from outside --save."""
    save = tmp_path / "ck"
    shutil.copytree(halfway["save"], save)
    (tmp_path / "base").mkdir()
    shutil.copytree(halfway["save"] / "step00000002", tmp_path / "base" / "step00000012")
    latest = save / "latest"
    latest.unlink()
    if damage == "folder":
        latest.mkdir()
    else:
        latest.write_text("" if damage == "empty" else "../base/step00000012\n")
    before = contents(save)
    proc = cli(
        "train", *train_args(manifest), "--resume", "--save", str(save), "--run-dir", str(tmp_path / "r")
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_error_line(proc)
    said = {
        "empty": f"{latest} is empty",
        "folder": f"{latest} is a folder, not the file naming the last checkpoint",
        "outside": f"{latest} names '../base/step00000012', which is not a folder name inside {save}",
    }[damage]
    assert line.startswith(f"tokshard: error: {said}"), line
    tags = ", ".join(saved_tags(save)[-3:])  # (other tests here resume `halfway` further)
    assert line.endswith(
        f"put a file {latest} holding the name of one of its checkpoints ({tags}; the last is the newest)"
    )
    assert contents(save) == before
