"""Resume and save under real faults: kill -9 mid-run, a full disk during a checkpoint, a
changed batch or model, damaged data mid-run (issue 15). Real DeepSpeed engines on CPU (gloo,
fp32, torch's AdamW via the default config), each a `python -m tokshard train` process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from support import (
    AS_AT_A_TERMINAL,
    REPO,
    cached_manifest,
    corpus,
    files_recipe,
    free_port,
    make_manifest,
    metrics,
    rank_killed,
    samples_by_step,
)
from support import cli as prepare_cli

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import lock_file, try_exclusive
from pipeline.format.errors import TokshardError
from tokshard.commands import train as cli
from trainer.api import TrainingSamples
from trainer.checkpoint.save import clear_interrupted_saves
from trainer.run_folders import WRITER_LOCK

ROOT = REPO
SMALL = ["--model", "tiny", "--seq-len", "32", "--log-every", "1", "--micro-batch", "2"]


def trainer_cmd(*args: str) -> tuple[list[str], dict[str, str]]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return [sys.executable, "-m", "tokshard", "train", *args], env


def train(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    """Run the trainer as a user does; it must exit with ``code``."""
    cmd, env = trainer_cmd(*args)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """A failure's stderr ends in exactly one error line and holds no traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("tokshard: error: ")]
    assert len(errors) == 1 and done.stderr.strip().splitlines()[-1] == errors[0], done.stderr[-3000:]
    return errors[0]


def steps_in(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if '"loss"' in x or '"micro"' in x]


def latest(save: Path) -> str | None:
    return (save / "latest").read_text().strip() if (save / "latest").is_file() else None


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


# --- item 11 (and the config without an optimizer of item 15), on a tokenizer larger than tiny's 2048 ---


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("wide")
    m = make_manifest(root / "data", vocab_size=3000)
    ds = root / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}))
    run = root / "run"
    done = train("--manifest", str(m), *SMALL, "--deepspeed", str(ds), "--steps", "2", "--run-dir", str(run))
    return run, done


def test_a_tiny_model_trains_on_a_tokenizer_larger_than_its_default_vocabulary(wide_run):
    run, done = wide_run
    assert (
        "model tiny: embedding of 3008 rows (the tokenizer's 3000 ids, padded to a multiple of 64)"
        in done.stdout
    )
    assert steps_in(run / "metrics.jsonl") == [1, 2]


def test_a_deepspeed_config_without_an_optimizer_gets_adamw(wide_run):
    run, done = wide_run
    assert (
        "has no 'optimizer' or 'scheduler' block: using tokshard's default (AdamW, warmup + cosine)"
        in done.stdout
    )
    config = json.loads((run / "run.json").read_text())["deepspeed_config"]
    assert config["optimizer"]["type"] == "AdamW" and config["optimizer"]["params"]["torch_adam"] is True
    assert config["scheduler"]["type"] == "WarmupCosineLR"


# --- item 13: kill -9, then --resume: the logs read as one run ---


def endless(manifest: Path, save: Path) -> list[str]:
    """A small run too long to end by itself (the test stops it), saving to ``save``."""
    return ["--manifest", str(manifest), *SMALL, "--steps", "100000", "--save", str(save)]


@pytest.mark.parametrize("packing", ["none", "best-fit"])
def test_after_kill_9_and_resume_the_logs_hold_each_step_once(manifest, tmp_path, packing):
    """...and the resumed run trains the very samples an uninterrupted one would (the public
    API's, which draws them the same way), with plain windows and with packed ones."""
    save = tmp_path / "ck"
    args = [*endless(manifest, save), "--packing", packing]
    # kill a few steps after a checkpoint and well before the next one: with a short interval,
    # a loaded machine let the next save land between the look and the kill (nothing replayed)
    cmd, env = trainer_cmd(*args, "--save-every", "20", "--log-samples")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tag = latest(save)
            logged = steps_in(save / "metrics.jsonl") if (save / "metrics.jsonl").is_file() else []
            if tag and logged and 2 <= logged[-1] - int(tag.removeprefix("step")) <= 10:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # the training process itself: no launcher in between
    finally:
        proc.kill()
        proc.wait()
    checkpoint_step = int(latest(save).removeprefix("step"))
    killed_at = steps_in(save / "metrics.jsonl")[-1]
    assert killed_at > checkpoint_step  # steps the resume will train again were logged
    stop = killed_at + 2
    done = train(*args, "--resume", "--stop-at", str(stop), "--log-samples")
    assert f"written after step {checkpoint_step} (the checkpoint's)" in done.stdout
    assert_trained_as_uninterrupted(manifest, save, stop, packing)


def assert_trained_as_uninterrupted(manifest: Path, save: Path, stop: int, packing: str = "none") -> None:
    """Steps 1..``stop`` of the run logged in ``save``, once each, trained the very samples an
    uninterrupted run would (the public API's, which draws them the same way)."""
    assert steps_in(save / "metrics.jsonl") == list(range(1, stop + 1))
    assert steps_in(save / "samples-rank0.jsonl") == list(range(1, stop + 1))
    samples = [json.loads(x)["samples"] for x in (save / "metrics.jsonl").read_text().splitlines()]
    assert samples == [2 * s for s in range(1, stop + 1)]
    straight = TrainingSamples(manifest, seq_len=32, global_batch=2, micro_batch=2, packing=packing)
    it = iter(straight)
    for step, fed in samples_by_step(save).items():
        b = next(it)
        src = np.array([straight.dataset.sources.index(s) for s in b["sources"]])
        rows = straight.dataset.batch(src, b["windows"])
        crc = [zlib.crc32(row.tobytes()) for row in rows]
        want = zip(b["positions"].tolist(), b["sources"], b["windows"].tolist(), crc, strict=True)
        assert fed == sorted(want), f"step {step}"


def test_the_same_run_started_again_while_it_trains_is_refused_and_the_first_goes_on(manifest, tmp_path):
    """A second ``--resume`` into the ``--save`` of a run still training (a requeued job, a
    second terminal) is one line naming the first; the first trains on, and lets the folder
    go when it stops."""
    save = tmp_path / "ck"
    args = [*endless(manifest, save), "--save-every", "5"]
    cmd, env = trainer_cmd(*args)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and latest(save) is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        stop = int(latest(save).removeprefix("step")) + 1  # where the second would stop, were it let in
        line = one_error_line(train(*args, "--resume", "--stop-at", str(stop), code=2))
        assert f"another `tokshard train` (pid {proc.pid} on " in line, line
        assert line.endswith(f"is writing into --save {save}; wait for it to end or stop it, then rerun"), (
            line
        )
        # started again without --resume: the live run is the reason, not the checkpoints it
        # wrote so far (the line said to pass --resume, or to remove the live run's files)
        fresh = one_error_line(train(*args, code=2))
        assert f"another `tokshard train` (pid {proc.pid} on " in fresh, fresh
        logged = steps_in(save / "metrics.jsonl")
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and len(steps_in(save / "metrics.jsonl")) <= len(logged) + 2
        ):
            time.sleep(0.05)
        steps = steps_in(save / "metrics.jsonl")
        assert (
            proc.poll() is None and steps == list(range(1, len(steps) + 1)) and len(steps) > len(logged) + 2
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, proc.stderr.read().decode()[-3000:]
    finally:
        proc.kill()
        proc.wait()
    fd = lock_file(save / WRITER_LOCK)
    try:
        assert try_exclusive(fd, save / WRITER_LOCK), "the stopped run still holds its --save"
    finally:
        os.close(fd)


# --- issue 29, item 8: Ctrl-C, SIGTERM and SIGHUP say how to continue ---


@pytest.mark.parametrize(("signum", "said", "code"), [(signal.SIGINT, "interrupted", 130),
                                                      (signal.SIGHUP, "stopped by SIGHUP (its terminal closed)", 129)])  # fmt: skip
def test_a_stopped_run_says_to_resume_from_its_last_checkpoint(manifest, tmp_path, signum, said, code):
    """Ctrl-C and a closed terminal stop at once (SIGTERM saves first: the tests below)."""
    save = tmp_path / "ck"
    args = [*endless(manifest, save), "--save-every", "2"]
    cmd, env = trainer_cmd(*args)
    proc = subprocess.Popen(
        [*AS_AT_A_TERMINAL, *cmd],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while latest(save) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signum)  # Ctrl-C at a terminal sends SIGINT; a job's time limit SIGTERM;
        # a closed terminal (a lost ssh session) SIGHUP
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == code and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tokshard: train {said}; the last checkpoint is {save}/step")
    assert last.endswith(": rerun it with --resume to continue from there")


def until_logged(proc: subprocess.Popen, save: Path, steps: int = 3) -> None:
    """Wait until ``steps`` steps of the run training into ``save`` are in its log."""
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if (save / "metrics.jsonl").is_file() and len(steps_in(save / "metrics.jsonl")) >= steps:
            return
        time.sleep(0.05)


def stopped_by_sigterm(proc: subprocess.Popen, save: Path) -> tuple[int, str]:
    """SIGTERM to ``proc`` once a few steps are in the log; its exit status and stderr."""
    try:
        until_logged(proc, save)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGTERM)  # a job's time limit, a preemption
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    return proc.returncode, err


def test_sigterm_saves_the_step_in_progress_and_the_resume_trains_the_uninterrupted_samples(
    manifest, tmp_path
):
    """With no --save-every (a checkpoint only at the end), a job's time limit would have lost
    the whole run: SIGTERM saves the step in progress, and --resume goes on from it."""
    save = tmp_path / "ck"
    cmd, env = trainer_cmd(*endless(manifest, save), "--log-samples")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    code, err = stopped_by_sigterm(proc, save)
    assert code == 143 and "Traceback" not in err, err[-3000:]
    step = steps_in(save / "metrics.jsonl")[-1]
    assert latest(save) == f"step{step:08d}"
    assert err.strip().splitlines()[-1] == (
        f"tokshard: train stopped by SIGTERM after saving step {step}; the last checkpoint is "
        f"{save}/step{step:08d}: rerun it with --resume to continue from there"
    )
    train(*endless(manifest, save), "--resume", "--stop-at", str(step + 2), "--log-samples")
    assert_trained_as_uninterrupted(manifest, save, step + 2)


def test_sigterm_during_an_evaluation_abandons_it_and_the_resume_runs_it_first(manifest, tmp_path):
    """A SIGTERM waited for the whole evaluation under way (minutes, with many --eval-samples),
    silent, then trained a step more: the evaluation is abandoned unlogged, the step before it
    saved, and the resume runs it before its first step, so the log reads as one run's."""
    save = tmp_path / "ck"
    args = [*endless(manifest, save), "--eval-every", "1", "--eval-samples", "100000"]  # each step's
    cmd, env = trainer_cmd(*args)
    with open(tmp_path / "out", "w") as out:  # the run's notes
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        code, err = stopped_by_sigterm(proc, save)
    assert code == 143 and "Traceback" not in err, err[-3000:]
    step = steps_in(save / "metrics.jsonl")[-1]
    said = (tmp_path / "out").read_text()
    assert f"tokshard: SIGTERM: its evaluation left for the resume to run; saving step {step}, " in said
    assert [e["step"] for e in metrics(save)[1]] == list(range(step))  # none of step `step`
    assert json.loads((save / f"step{step:08d}" / "tokshard.json").read_text())["eval_pending"]
    for _ in range(2):  # a resume killed after the evaluation it ran again leaves no second line
        train(*args, "--resume", "--stop-at", str(step + 1))
        assert [e["step"] for e in metrics(save)[1]] == list(range(step + 2))
        assert steps_in(save / "metrics.jsonl") == list(range(1, step + 2))
        (save / "latest").write_text(f"step{step:08d}")


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_saved_step(manifest, tmp_path):
    """The ranks agree where to stop: a signal that reaches one rank alone (as a launcher or a
    scheduler may deliver it a step apart) still gives one whole checkpoint of two ranks,
    where a rank saving alone would wait for the other forever; in an evaluation too, which
    they abandon between the same two forward passes."""
    save = tmp_path / "ck"
    cmd, env = trainer_cmd(*endless(manifest, save), "--eval-every", "2")
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    env = {**env, "TMPDIR": str(tmp_path)}  # torchrun leaves a torchelastic_* folder there
    proc = subprocess.Popen(
        [*launcher, *cmd[1:]], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ranks: dict[str, int] = {}
    try:
        until_logged(proc, save)
        ranks = rank_pids(proc.pid)
        assert proc.poll() is None and len(ranks) == 2, proc.stderr.read()[-3000:]
        os.kill(ranks["1"], signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]  # ranks that disagree wait in the save forever
    finally:
        for pid in [proc.pid, *ranks.values()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    step = steps_in(save / "metrics.jsonl")[-1]
    assert f"tokshard: train stopped by SIGTERM after saving step {step}; " in err, err[-3000:]
    assert latest(save) == f"step{step:08d}"
    state = json.loads((save / latest(save) / "tokshard.json").read_text())
    assert (state["step"], state["world_size"]) == (step, 2)
    train(
        *endless(manifest, save), "--resume", "--stop-at", str(step + 1), "--global-batch", "4"
    )  # one rank now
    assert steps_in(save / "metrics.jsonl") == list(range(1, step + 2))


def two_ranks(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`tokshard train ARGS` under torchrun with two ranks (``env`` added to the trainer's)."""
    cmd, base = trainer_cmd(*args)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launcher += ["--master_port", str(free_port())]
    env = {**base, **env, "TMPDIR": str(tmp_path)}  # torchrun leaves a torchelastic_* folder there
    return subprocess.run(
        [*launcher, *cmd[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def survivors_line(done: subprocess.CompletedProcess) -> str:
    """The surviving rank's one error line (torchrun's own report of the killed rank follows)."""
    assert "[rank0]: Traceback" not in done.stderr and "[rank1]: Traceback" not in done.stderr, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("tokshard: error: ")]
    assert len(errors) == 1, done.stderr[-5000:]
    return errors[0]


def test_a_rank_lost_during_the_first_save_is_said_as_such_and_the_same_command_starts_over(
    manifest, tmp_path
):
    """Rank 0 killed (-9) while it writes the first checkpoint: rank 1 said "cannot write ...
    (gloo: Connection closed by peer; N MiB free); nothing of it was kept ...; free space
    there", where neither space nor the cleanup was the matter (rank 1 removes nothing)."""
    save = tmp_path / "ck"
    args = ["--manifest", str(manifest), *SMALL, "--steps", "4", "--save", str(save), "--save-every", "2"]
    line = survivors_line(two_ranks(args, rank_killed(tmp_path / "hook", 0, "save"), tmp_path))
    partial = save / "step00000002.partial"
    assert line.startswith(
        f"tokshard: error: checkpoint not saved: another rank of the run was lost during the save of "
        f"{save / 'step00000002'} (gloo: "
    ), line
    assert line.endswith(
        f"its unfinished {partial} is left (the next save or start removes it) and no earlier checkpoint "
        f"exists; run the same command again (it starts over, replacing metrics.jsonl, run.json, "
        f"step00000002.partial in {save})"
    ), line
    assert "free" not in line and partial.is_dir()
    train(*args)  # as the line says (here on one rank)
    assert latest(save) == "step00000004" and not partial.exists()


def test_a_rank_lost_between_saves_is_one_line_naming_the_step_and_the_checkpoint(manifest, tmp_path):
    """Rank 1 killed (-9) in step 5's backward pass: rank 0 printed gloo's "Connection reset by
    peer" under a 45-line traceback through DeepSpeed's all_reduce."""
    save = tmp_path / "ck"
    args = ["--manifest", str(manifest), *SMALL, "--steps", "8", "--save", str(save), "--save-every", "2"]
    done = two_ranks(args, rank_killed(tmp_path / "hook", 1, "backward:5"), tmp_path)
    line = survivors_line(done)
    assert line.startswith("tokshard: error: another rank of the run was lost after step 4 (gloo: "), line
    assert line.endswith(
        f"so this one stops too; the last checkpoint is {save / 'step00000004'}: rerun it with --resume "
        "to continue from there"
    ), line
    assert "exitcode  : 1 " in done.stderr  # torchrun's report of rank 0: a failed run, not a usage error


def rank_pids(launcher_pid: int) -> dict[str, int]:
    """The launcher's worker processes, by their RANK."""
    found = {}
    for child in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        rank = next((v[5:].decode() for v in env if v.startswith(b"RANK=")), None)
        if rank is not None:
            found[rank] = int(child)
    return found


# --- item 14 and the model half of item 15: what a resume must keep ---


@pytest.fixture(scope="module")
def halfway(manifest, tmp_path_factory) -> Path:
    """A checkpoint at step 2 of 4, global batch 2."""
    save = tmp_path_factory.mktemp("halfway") / "ck"
    train("--manifest", str(manifest), *SMALL, "--steps", "4", "--stop-at", "2", "--save", str(save))
    return save


def resume_args(manifest: Path, save: Path) -> list[str]:
    return ["--manifest", str(manifest), *SMALL, "--steps", "4", "--save", str(save), "--resume"]


def test_resume_with_another_global_batch_is_refused(manifest, halfway):
    with pytest.raises(
        TokshardError,
        match=r"global batch would be 4 \(micro-batch 2 x accumulation 2 x 1 ranks\), the checkpoint's is 2.*"
        r"pass --global-batch 2 to keep it, or --allow-batch-change",
    ):
        cli.main([*resume_args(manifest, halfway), "--global-batch", "4"])


def test_resume_with_another_global_batch_runs_when_allowed(manifest, halfway, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(halfway, save)
    done = train(*resume_args(manifest, save), "--global-batch", "4", "--allow-batch-change")
    assert "global batch is 4, the checkpoint's was 2" in done.stdout
    state = json.loads((save / "step00000004" / "tokshard.json").read_text())
    assert state["samples"] == 2 * 2 + 2 * 4 and state["train_batch_size"] == 4


def test_resume_with_another_vocabulary_or_model_is_refused(manifest, halfway):
    with pytest.raises(TokshardError, match=r"checkpoint holds model tiny with 1024 embedding rows, this run builds "
                       r"tiny with 2048; resume with --model tiny --vocab-size 1024"):  # fmt: skip
        cli.main([*resume_args(manifest, halfway), "--vocab-size", "2048"])
    with pytest.raises(TokshardError, match=r"holds model tiny .* this run builds gpt2-124m"):
        cli.main([*resume_args(manifest, halfway), "--model", "gpt2-124m"])


def test_resume_on_a_larger_tokenizers_shards_names_the_tokenizer_first(manifest, halfway, tmp_path):
    """Its ids outnumber the checkpoint's embedding rows: the refusal names the tokenizer, not
    a --vocab-size whose use is then refused for the ids beyond it."""
    wider = make_manifest(tmp_path / "wider", vocab_size=3000)
    was, now = (json.loads(m.read_text())["tokenizer"]["sha256"] for m in (manifest, wider))
    for extra in ([], ["--vocab-size", "1024"], ["--allow-data-change"]):
        args = [*resume_args(wider, halfway), *extra]
        with pytest.raises(TokshardError) as refused:
            cli.main(args)
        assert str(refused.value) == (
            f"--resume: the checkpoint was trained on another tokenizer's ids (tokenizer: checkpoint "
            f"sha256 {was[:16]}..., now sha256 {now[:16]}...), and its model embeds 1024 rows where this "
            "tokenizer has 3000 ids; resume on shards prepared with the checkpoint's tokenizer, or start "
            "a new run in another --save"
        )


def prepared_as(dtype: str, tokenizer: Path, data: Path, out: Path) -> Path:
    """``data`` prepared into ``out`` with token type ``dtype``, from a recipe as a user writes
    it (beside ``out``); the manifest."""
    recipe = files_recipe(out.with_suffix(".toml"), tokenizer, data, 1 << 20, out=str(out), dtype=dtype)
    prepare_cli("prepare", str(recipe), check=True)
    return out / "manifest.json"


def assert_names_the_dtype(line: str) -> None:
    """``line`` is the refusal of a resume on the checkpoint's shards, re-prepared as uint32."""
    assert line.startswith(
        "--resume: the checkpoint's shards were re-prepared with another token type (source "
    )
    assert (
        "'text': its shards are uint32, the checkpoint's uint16, with the same token and document counts"
        in line
    )
    assert line.endswith("pass --allow-data-change to continue the same sample sequence on them")


def test_resume_on_its_shards_prepared_again_as_uint32_names_the_dtype(tokenizer_path, docs, tmp_path):
    """The same documents and tokenizer prepared as uint16, then uint32 into another folder: the
    shards' hashes (over their bytes) differ, and the refusal says it is their token type, which
    --allow-data-change continues the same sample sequence on. A checkpoint from before the
    shards' facts were recorded finds them in its manifest, still there."""
    data = corpus(tmp_path / "docs.jsonl", docs, copies=2)
    made = {
        dtype: prepared_as(dtype, tokenizer_path, data, tmp_path / dtype) for dtype in ("uint16", "uint32")
    }
    save = tmp_path / "ck"
    train("--manifest", str(made["uint16"]), *SMALL, "--steps", "4", "--stop-at", "2", "--save", str(save))
    with pytest.raises(TokshardError) as refused:
        cli.main(resume_args(made["uint32"], save))
    assert_names_the_dtype(str(refused.value))
    state_file = save / "step00000002" / "tokshard.json"
    state = json.loads(state_file.read_text())
    del state["data"]["train_shards"]  # as an older tokshard wrote it
    state_file.write_text(json.dumps(state))
    with pytest.raises(TokshardError) as refused:
        cli.main(resume_args(made["uint32"], save))
    assert_names_the_dtype(str(refused.value))


def test_resume_on_its_shards_prepared_again_as_uint32_in_the_same_out_names_the_dtype(
    tokenizer_path, docs, tmp_path
):
    """The usual way to re-prepare: into the same --out, its uint16 run deleted first (as
    prepare asks for another recipe's run there). The checkpoint's manifest is gone; what the
    checkpoint recorded of its shards says it is their token type, and --allow-data-change
    continues the run."""
    data = corpus(tmp_path / "docs.jsonl", docs, copies=2)
    out = tmp_path / "data"
    manifest = prepared_as("uint16", tokenizer_path, data, out)
    save = tmp_path / "ck"
    train("--manifest", str(manifest), *SMALL, "--steps", "4", "--stop-at", "2", "--save", str(save))
    shutil.rmtree(out)
    assert prepared_as("uint32", tokenizer_path, data, out) == manifest
    with pytest.raises(TokshardError) as refused:
        cli.main(resume_args(manifest, save))
    assert_names_the_dtype(str(refused.value))
    train(*resume_args(manifest, save), "--allow-data-change")
    assert latest(save) == "step00000004"


def test_resume_of_an_older_checkpoint_with_other_weights_is_one_line(manifest, halfway, tmp_path):
    """A checkpoint from before the model was recorded: DeepSpeed's size mismatch, one line."""
    save = tmp_path / "ck"
    shutil.copytree(halfway, save)
    state_file = save / "step00000002" / "tokshard.json"
    state = json.loads(state_file.read_text())
    del state["vocab_size"]
    state_file.write_text(json.dumps(state))
    line = one_error_line(train(*resume_args(manifest, save), "--vocab-size", "2048", code=2))
    assert f"--resume: {save / 'step00000002'} holds another model's weights (size mismatch" in line
    assert line.endswith(
        "resume with the --model and --vocab-size it was trained with, or start a new run in another --save"
    )


# --- issue 29: a damaged checkpoint is one line naming what to do ---


def test_a_resume_from_a_cut_short_model_state_file_is_one_line(manifest, halfway, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(halfway, save)
    states = save / "step00000002" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[: states.stat().st_size // 2])
    line = one_error_line(train(*resume_args(manifest, save), code=1))
    assert f"--resume: {save / 'step00000002'} cannot be loaded (mp_rank_00_model_states.pt cut short" in line
    assert line.endswith(f"{save} holds no other checkpoint: start a new run in another --save")


def test_latest_naming_a_checkpoint_that_is_gone_names_the_ones_there(manifest, halfway, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(halfway, save)
    (save / "latest").write_text("step00000009")
    with pytest.raises(TokshardError, match=r"names step00000009, which is not in .*write its name "
                       r"\(step00000002\) into .*latest"):  # fmt: skip
        cli.main(resume_args(manifest, save))


# --- item 15: a full disk during a checkpoint leaves none half written ---


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}); needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_during_a_save_keeps_the_last_whole_checkpoint(manifest, small_disk):
    save = small_disk / "ck"
    args = ["--manifest", str(manifest), *SMALL, "--steps", "4", "--save", str(save)]
    train(*args, "--stop-at", "2")
    size = sum(f.stat().st_size for f in (save / "step00000002").rglob("*") if f.is_file())
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - size // 2))  # room for half a checkpoint
    line = one_error_line(train(*args, "--resume", code=2))
    assert line.startswith(
        f"tokshard: error: checkpoint not saved: disk full writing {save / 'step00000004'} ("
    )
    assert "nothing of it was kept and the last whole checkpoint, step00000002, is kept" in line
    assert line.endswith("free space there, then rerun with --resume to continue from step00000002")
    assert latest(save) == "step00000002"
    assert sorted(p.name for p in save.iterdir() if p.is_dir()) == ["step00000002"]  # no partial folder
    (small_disk / "filler").unlink()
    done = train(*args, "--resume")
    assert "resumed step00000002 at step 2" in done.stdout and latest(save) == "step00000004"


def test_a_full_disk_under_the_metrics_log_is_one_line_naming_trains_flags(manifest, tmpfs, tmp_path):
    """metrics.jsonl's write fails; closing it after must not fail again and bury that line."""
    mount, _ = tmpfs
    save = mount(tmp_path / "disk", "8k") / "ck"
    done = train("--manifest", str(manifest), *SMALL, "--steps", "4", "--save", str(save), code=2)
    line = one_error_line(done)
    assert line.startswith(f"tokshard: error: disk full writing {save / 'metrics.jsonl'} (")
    assert "free space there or pass --run-dir another folder for the run's record" in line
    assert "--out" not in line


def test_a_full_disk_at_run_json_takes_back_what_the_run_made(manifest, tmpfs, tmp_path):
    """run.json's write fails on a full disk: the run had written nothing of its record yet, so
    the folder it made, its lock and the metrics.jsonl it opened go, and the line's "rerun the
    same command" then trains."""
    mount, _ = tmpfs
    disk = mount(tmp_path / "disk", "64k")
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (15 * 4096))
    run_dir = disk / "rd"
    args = ["--manifest", str(manifest), *SMALL, "--steps", "2", "--save", str(tmp_path / "ck"),
            "--run-dir", str(run_dir)]  # fmt: skip
    line = one_error_line(train(*args, code=2))
    assert line.startswith(f"tokshard: error: disk full writing {run_dir / 'run.json'}")
    assert "rerun the same command to start again" in line
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no run dir, lock or metrics.jsonl
    assert not (tmp_path / "ck").exists()
    filler.unlink()
    train(*args)
    assert (run_dir / "run.json").is_file() and latest(tmp_path / "ck") == "step00000002"


# --- item 15: ids the embedding has no row for (a hand-edited, re-sealed manifest) ---


def test_ids_beyond_the_models_vocabulary_are_one_line_naming_the_shard(manifest, tmp_path):
    shutil.copytree(manifest.parent, tmp_path / "m")
    data = json.loads((tmp_path / "m" / "manifest.json").read_text())
    data["tokenizer"]["vocab_size"] = 256  # the ids in the shards go up to 1023
    manifest_mod.write(tmp_path / "m", {k: v for k, v in data.items() if k != "checksum"})
    done = train(
        "--manifest", str(tmp_path / "m"), *SMALL, "--steps", "2", "--run-dir", str(tmp_path / "r"), code=1
    )
    line = one_error_line(done)
    assert f"{tmp_path / 'm'}/" in line and ".bin: token id " in line
    assert "is beyond the model's 256 embedding rows" in line


def test_a_config_deepspeed_refuses_is_one_line_naming_it(manifest, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betass": [0.9, 0.95]}}}))
    done = train("--manifest", str(manifest), *SMALL, "--deepspeed", str(ds), "--steps", "1",
                 "--run-dir", str(tmp_path / "r"), code=2)  # fmt: skip
    line = one_error_line(done)
    assert f"--deepspeed {ds}: DeepSpeed refuses this config (" in line and "betass" in line


def test_resume_with_other_steps_says_the_schedule_changes(manifest, halfway, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(halfway, save)
    args = [
        "--manifest",
        str(manifest),
        *SMALL,
        "--steps",
        "6",
        "--stop-at",
        "3",
        "--save",
        str(save),
        "--resume",
    ]
    done = train(*args)
    assert (
        "--steps 6, the checkpoint's run was scheduled for 4: the learning rate follows the schedule"
        in done.stdout
    )


def test_a_save_clears_only_its_own_interrupted_saves(tmp_path):
    """A resumed run saves into a folder that may by then hold a user's files: another tool's
    partial download, a file of the same ending, notes. Only ``stepNNNNNNNN.partial`` goes."""
    theirs = {
        "weights.partial/part-0": b"a download in progress",
        "notes.partial": b"mine",
        "notes.txt": b"x",
    }
    for name, data in theirs.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / "step00000009.partial" / "mp_rank_00_model_states.pt").mkdir(parents=True)
    clear_interrupted_saves(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in theirs} == theirs
    assert not (tmp_path / "step00000009.partial").exists()


def test_a_checkpoint_past_the_file_size_limit_says_ulimit_f(manifest, tmp_path):
    """Under `ulimit -f` torch.save says only "unexpected pos": it was called a failed write
    with the disk's free space, and "free space there" was the remedy."""
    import resource

    save, limit = tmp_path / "ck", 200 << 10
    cmd, env = trainer_cmd("--manifest", str(manifest), *SMALL, "--steps", "2", "--save", str(save))
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_error_line(done)
    assert line.startswith(
        f"tokshard: error: checkpoint not saved: cannot write {save / 'step00000002'}: it would grow past "
        f"this process's file size limit of {limit:,} bytes (ulimit -f 200;"
    ), line
    assert "raise it (ulimit -f unlimited), then run the same command again" in line
