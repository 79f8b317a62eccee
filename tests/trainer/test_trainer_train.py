"""The trainer end to end: real DeepSpeed engines on CPU (gloo), one and two processes.

Every run is a subprocess started the way users start it (``python -m tokshard train``, the
``deepspeed`` launcher, ``torchrun``), so each has a fresh process group.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import (
    CONFIGS,
    REPO,
    SMALL,
    cached_manifest,
    launch,
    make_manifest,
    metrics,
    samples_by_step,
)

from pipeline.format.errors import TokshardError
from tokshard.commands import train as cli


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


def test_loss_falls_on_real_text(manifest, tmp_path):
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero0-fp32.json"), *SMALL),
        *("--seq-len", "64", "--micro-batch", "8", "--steps", "60", "--lr", "3e-3", "--warmup", "5"),
        *("--vocab-size", "2048"),  # the embedding this test's thresholds were set for
        *("--eval-every", "30", "--eval-samples", "32", "--log-every", "5", "--run-dir", str(run)),
    )
    train, evals = metrics(run)
    assert [t["step"] for t in train] == list(range(5, 61, 5))
    assert set(train[0]) == {"step", "loss", "lr", "tokens_per_s", "samples", "data_wait_frac", "elapsed_s"}
    assert train[-1]["samples"] == 60 * 8
    assert sum(t["loss"] for t in train[-3:]) / 3 < train[0]["loss"] - 1.0
    assert [e["step"] for e in evals] == [0, 30, 60]
    assert evals[0]["eval_loss"] == pytest.approx(math.log(2048), rel=0.02)  # untrained: uniform
    assert evals[2]["eval_loss"] < evals[1]["eval_loss"] < evals[0]["eval_loss"] - 1.0
    assert evals[2]["eval_ppl"] == pytest.approx(math.exp(evals[2]["eval_loss"]), rel=1e-6)
    assert set(evals[2]["sources"]) == {"stdlib", "asyncio"} and evals[2]["split"] == "validation"
    assert max(t["data_wait_frac"] for t in train[1:]) < 0.1
    assert "| loss " in out.stdout and "tok/s" in out.stdout and "data wait" in out.stdout
    assert json.loads((run / "run.json").read_text())["deepspeed_config"]["zero_optimization"]["stage"] == 0


@pytest.mark.parametrize(
    ("config", "stage", "precision"), [("zero2-bf16.json", 2, "bf16"), ("zero3-opt.json", 3, "fp32")]
)
def test_example_config_runs_single_process(manifest, tmp_path, config, stage, precision):
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / config), *SMALL, "--steps", "2"),
        *("--global-batch", "4", "--micro-batch", "2", "--eval-every", "2", "--run-dir", str(run)),
    )
    assert f"{precision}, ZeRO {stage}, global batch 4 (2 x 2 x 1)" in out.stdout
    train, evals = metrics(run)
    assert [t["step"] for t in train] == [1, 2] and [e["step"] for e in evals] == [0, 2]
    assert all(torch.isfinite(torch.tensor(t["loss"])) for t in train)


def small_opt(folder: Path) -> Path:
    """A Transformers OPT config (a type whose loss can be chunked; dropout as published)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OPTConfig(
        vocab_size=1024, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
        max_position_embeddings=64, word_embed_proj_dim=32,
    )  # fmt: skip
    cfg.save_pretrained(folder)
    return folder


def test_transformers_opt_from_config_under_zero3(manifest, tmp_path):
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero3-opt.json"), *SMALL),
        *("--model", f"hf:{small_opt(tmp_path / 'opt')}", "--steps", "2", "--micro-batch", "2"),
        *("--run-dir", str(run)),
    )
    assert "ZeRO 3" in out.stdout
    assert len(metrics(run)[0]) == 2


# --- the learning rate: each step's line logs the rate that step applied ---


def test_the_logged_lr_is_the_rate_each_step_applied_and_warmup_0_starts_at_the_peak(manifest, tmp_path):
    """The default schedule (linear warmup, cosine to 0.1 of the peak over --steps): with two
    warmup steps, step 1 applies a rate of 0 (its weights stay the initial ones) and step 2
    half the peak; with --warmup 0 step 1 applies the peak."""
    from trainer import models
    from trainer.sampler import DEFAULT_SEED

    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--lr", "1e-3"]
    warmed = launch(*common, "--warmup", "2", "--save", str(tmp_path / "w2"), "--save-every", "1")
    launch(*common, "--warmup", "0", "--run-dir", str(tmp_path / "w0"))
    assert "learning rate from scheduler before it has started" not in warmed.stderr  # DeepSpeed's, every run
    peak, end = 1e-3, 1e-4
    assert [t["lr"] for t in metrics(tmp_path / "w2")[0]] == pytest.approx(
        [0, peak / 2, (peak + end) / 2, end]
    )
    assert [t["lr"] for t in metrics(tmp_path / "w0")[0]] == pytest.approx(
        [peak, peak, (peak + end) / 2, end]
    )
    torch.manual_seed(DEFAULT_SEED)
    initial = models.resolve("tiny", None, 1024).build().state_dict()
    after_step_1 = torch.load(
        tmp_path / "w2" / "step00000001" / "mp_rank_00_model_states.pt", weights_only=False
    )
    assert all(torch.equal(after_step_1["module"][k], v) for k, v in initial.items())
    after_step_2 = torch.load(
        tmp_path / "w2" / "step00000002" / "mp_rank_00_model_states.pt", weights_only=False
    )
    assert not all(torch.equal(after_step_2["module"][k], v) for k, v in initial.items())


def test_a_run_that_ends_inside_its_warmup_says_so_once_and_trains(manifest, tmp_path):
    """Only DeepSpeed's raw timestamped WARNING said it; a smoke run is not refused."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "3"]
    short = launch(*common, "--warmup", "50", "--run-dir", str(tmp_path / "short"))
    said = (short.stdout + short.stderr).splitlines()
    assert [line for line in said if "warm-up" in line] == [
        "tokshard: --steps 3 ends inside the learning rate's 50-step warm-up: the run never reaches its peak "
        "rate (step 3 trains at 4% of it); for one that does, set --warmup 2 or less (0: none) or --steps 51 "
        "or more"
    ]
    assert len(metrics(tmp_path / "short")[0]) == 3
    reaching = launch(*common, "--warmup", "2", "--run-dir", str(tmp_path / "reaching"))
    assert "warm-up" not in reaching.stdout + reaching.stderr


def test_a_local_file_named_as_a_shipped_config_is_said_once_and_run_json_records_which(manifest, tmp_path):
    """A ``{}`` named ``zero0-fp32`` in the current folder was taken over the shipped config
    without a word, and run.json recorded only "zero0-fp32"."""
    (tmp_path / "zero0-fp32").write_text("{}")
    argv = [
        "--manifest",
        str(manifest),
        *SMALL,
        "--micro-batch",
        "2",
        "--steps",
        "1",
        "--deepspeed",
        "zero0-fp32",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tokshard", "train", *argv, "--run-dir", "run"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if "ships" in line]
    assert said == [
        "tokshard: --deepspeed zero0-fp32: using the file zero0-fp32 here, not the config tokshard ships of "
        f"that name; for that one, give its path ({CONFIGS / 'zero0-fp32.json'})"
    ]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["deepspeed_file"] == str(tmp_path / "zero0-fp32")


def test_a_resume_with_another_schedule_applies_it_from_its_first_step(manifest, tmp_path):
    """Stopped at step 2 of 4 (--lr 1e-3, --warmup 2), resumed with --lr 2e-3 --warmup 0: step 3
    applies the new schedule's rate at step 3, not the one the checkpoint's optimizer holds."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4"]
    save = tmp_path / "ck"
    launch(*common, "--lr", "1e-3", "--warmup", "2", "--stop-at", "2", "--save", str(save))
    resumed = launch(*common, "--lr", "2e-3", "--warmup", "0", "--save", str(save), "--resume")
    peak, end = 2e-3, 2e-4  # --warmup 0: [peak, peak, (peak + end) / 2, end]
    assert [t["lr"] for t in metrics(save)[0]][2:] == pytest.approx([(peak + end) / 2, end])
    assert (
        "the learning rate follows this run's schedule from step 3: "
        "1.10e-03 there, where the checkpoint's schedule had 5.50e-04"
    ) in resumed.stdout


def with_optimizer(folder: Path, name: str, scheduler: dict | None = None, **params) -> Path:
    """The shipped ZeRO-0 fp32 config with these optimizer params and scheduler, as a file."""
    cfg = json.loads((CONFIGS / "zero0-fp32.json").read_text())
    cfg["optimizer"]["params"].update(params)
    if scheduler is not None:
        cfg["scheduler"] = scheduler
    path = folder / name
    path.write_text(json.dumps(cfg))
    return path


def optimizer_group(save: Path, step: int) -> dict:
    """The optimizer's settings a checkpoint holds (those its step trained with)."""
    states = torch.load(save / f"step{step:08d}" / "mp_rank_00_model_states.pt", weights_only=False)
    return states["optimizer"]["param_groups"][0]


def test_a_resume_with_other_optimizer_settings_trains_with_them_from_its_first_step(manifest, tmp_path):
    """Stopped at step 2 with weight decay 0.1 and betas [0.9, 0.95], resumed with
    --weight-decay 0.3 and a config's betas [0.8, 0.9]: steps 3 and 4 train with those (the
    checkpoint's optimizer state held the old ones, and torch's load put them back), said once."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--save-every", "1"]
    save = tmp_path / "ck"
    launch(*common, "--weight-decay", "0.1", "--stop-at", "2", "--save", str(save))
    other = with_optimizer(tmp_path, "betas.json", betas=[0.8, 0.9])
    resumed = launch(
        *common, "--weight-decay", "0.3", "--deepspeed", str(other), "--save", str(save), "--resume"
    )
    used = [
        (optimizer_group(save, s)["weight_decay"], list(optimizer_group(save, s)["betas"])) for s in (2, 3, 4)
    ]
    assert used == [(0.1, [0.9, 0.95]), (0.3, [0.8, 0.9]), (0.3, [0.8, 0.9])]
    assert (
        "the optimizer trains with this run's settings (--weight-decay, the --deepspeed config's) from step 3, "
        "not the checkpoint's: betas [0.9, 0.95] -> [0.8, 0.9]; weight_decay 0.1 -> 0.3"
    ) in resumed.stdout


def test_a_resume_with_another_torch_scheduler_follows_it_from_its_first_step(manifest, tmp_path):
    """A config naming torch's StepLR (gamma 0.5), stopped at step 2 of 4, resumed with gamma
    0.1: steps 3 and 4 apply the rates gamma 0.1 gives there (1e-3 x 0.1^2, 0.1^3), where the
    checkpoint's scheduler state, loaded over this run's, went on with gamma 0.5."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--lr", "1e-3"]
    save = tmp_path / "ck"
    halving = with_optimizer(
        tmp_path, "half.json", {"type": "StepLR", "params": {"step_size": 1, "gamma": 0.5}}
    )
    tenth = with_optimizer(
        tmp_path, "tenth.json", {"type": "StepLR", "params": {"step_size": 1, "gamma": 0.1}}
    )
    launch(*common, "--deepspeed", str(halving), "--stop-at", "2", "--save", str(save))
    resumed = launch(*common, "--deepspeed", str(tenth), "--save", str(save), "--resume")
    assert [t["lr"] for t in metrics(save)[0]] == pytest.approx([1e-3, 5e-4, 1e-5, 1e-6])
    assert "from step 3: 1.00e-05 there, where the checkpoint's schedule had 2.50e-04" in resumed.stdout


def test_a_resume_under_reduce_lr_on_plateau_goes_on_from_the_checkpoints_scheduler(manifest, tmp_path):
    """ReduceLROnPlateau steps on a metric, not the step count, so it cannot be replayed to the
    checkpoint's position (the replay was a TypeError traceback): the resume keeps the
    checkpoint's scheduler state and rate, trains steps 3 and 4, and says which of its
    settings differ from this run's config."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--lr", "1e-3"]
    save = tmp_path / "ck"
    halving = with_optimizer(tmp_path, "half.json", {"type": "ReduceLROnPlateau", "params": {"factor": 0.5}})
    fifth = with_optimizer(tmp_path, "fifth.json", {"type": "ReduceLROnPlateau", "params": {"factor": 0.2}})
    launch(*common, "--deepspeed", str(halving), "--stop-at", "2", "--save", str(save))
    resumed = launch(*common, "--deepspeed", str(fifth), "--save", str(save), "--resume")
    assert [t["lr"] for t in metrics(save)[0]] == pytest.approx([1e-3] * 4)
    assert (
        "the ReduceLROnPlateau scheduler goes on from the checkpoint's state with its settings, not this "
        "run's: factor 0.5 (this run's 0.2)"
    ) in resumed.stdout
    assert "the learning rate follows" not in resumed.stdout


def test_an_unchanged_one_cycle_resume_says_nothing_of_the_momentum_it_cycles(manifest, tmp_path):
    """OneCycleLR (cycle_momentum) sets beta1 at each step itself: a resume with the same config
    said the optimizer's betas changed ("[0.85..., 0.999] -> [0.95, 0.999]"), where the steps
    after it train exactly as an uninterrupted run's."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--save-every", "1"]
    cycle = with_optimizer(
        tmp_path, "cycle.json", {"type": "OneCycleLR", "params": {"max_lr": 0.01, "total_steps": 10}}
    )
    launch(*common, "--deepspeed", str(cycle), "--save", str(tmp_path / "whole"))
    launch(*common, "--deepspeed", str(cycle), "--stop-at", "2", "--save", str(tmp_path / "ck"))
    resumed = launch(*common, "--deepspeed", str(cycle), "--save", str(tmp_path / "ck"), "--resume")
    assert "the optimizer trains with this run's settings" not in resumed.stdout
    assert "the learning rate follows" not in resumed.stdout
    betas = [list(optimizer_group(tmp_path / run, 4)["betas"]) for run in ("whole", "ck")]
    assert betas[0] == pytest.approx(betas[1])


SCHEDULERS = {
    "OneCycleLR": {"type": "OneCycleLR", "params": {"max_lr": 0.01, "total_steps": 10}},
    "CyclicLR": {"type": "CyclicLR", "params": {"base_lr": 0.0001, "max_lr": 0.01, "step_size_up": 2}},
    "ReduceLROnPlateau": {"type": "ReduceLROnPlateau", "params": {"factor": 0.5, "patience": 0}},
    "StepLR": {"type": "StepLR", "params": {"step_size": 1, "gamma": 0.5}},
}


@pytest.mark.parametrize(
    "was, now",
    [("OneCycleLR", "CyclicLR"), ("CyclicLR", "ReduceLROnPlateau"), ("StepLR", "ReduceLROnPlateau")],
)
def test_a_resume_with_a_scheduler_that_cannot_go_on_from_the_checkpoints_is_refused(
    manifest, tmp_path, was, now
):
    """Another scheduler kind whose state the checkpoint's cannot become (DeepSpeed loads it
    into this run's): a KeyError traceback, a "cannot be loaded ... start a new run", or the
    other kind's state kept with no word. Now one line naming both, exit 2, before any load."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--lr", "1e-3"]
    save = tmp_path / "ck"
    first = with_optimizer(tmp_path, "was.json", SCHEDULERS[was])
    launch(*common, "--deepspeed", str(first), "--stop-at", "2", "--save", str(save))
    cmd = [sys.executable, "-m", "tokshard", "train", *common, "--save", str(save), "--resume",
           "--deepspeed", str(with_optimizer(tmp_path, "now.json", SCHEDULERS[now]))]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (
        f"--resume: the checkpoint's learning-rate scheduler is {was}, this run's --deepspeed config names "
        f"{now}, which cannot go on from a {was} state; resume with the scheduler section the checkpoint "
        f"was saved with ({was})"
    ) in proc.stderr
    assert [t["step"] for t in metrics(save)[0]] == [1, 2]


def test_a_resume_from_a_deepspeed_schedule_with_a_torch_one_replays_it_without_warnings(manifest, tmp_path):
    """A checkpoint of DeepSpeed's WarmupCosineLR resumed with torch's StepLR (halving each
    step): steps 3 and 4 train at 1e-3 x 0.5^2 and 0.5^3, the note says so, and torch's
    warnings of the replay's steps (printed before) are not on the console."""
    common = ["--manifest", str(manifest), *SMALL, "--micro-batch", "2", "--steps", "4", "--lr", "1e-3"]
    save = tmp_path / "ck"
    launch(*common, "--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--stop-at", "2", "--save", str(save))
    step = with_optimizer(tmp_path, "step.json", SCHEDULERS["StepLR"])
    resumed = launch(*common, "--deepspeed", str(step), "--save", str(save), "--resume")
    assert [t["lr"] for t in metrics(save)[0]][2:] == pytest.approx([2.5e-4, 1.25e-4])
    assert "the learning rate follows this run's schedule from step 3: 2.50e-04 there" in resumed.stdout
    assert "Warning" not in resumed.stdout + resumed.stderr, resumed.stderr


@pytest.mark.parametrize("console", ["a reader that quits", "a full disk"])
def test_a_console_that_goes_away_leaves_the_run_training(manifest, tmp_path, console):
    """`tokshard train ... | head` or `> train.log` on a full disk (here /dev/full): the run goes
    on to its last step, its record complete; the console's first line is tokshard's own
    (DeepSpeed's warnings go to stderr)."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "tokshard", "train", "--manifest", str(manifest), *SMALL, "--micro-batch", "2",
           "--steps", "30", "--run-dir", str(run)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with open("/dev/full", "w") as full:
        out = subprocess.PIPE if console == "a reader that quits" else full
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
    if proc.stdout is not None:
        assert proc.stdout.readline().startswith("tokshard: ")
        proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=240) == 0 and "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert [t["step"] for t in metrics(run)[0]] == list(range(1, 31))
    lost = "cannot write to standard output (No space left on device); training goes on without its console"
    assert err.count(lost) == (console == "a full disk")


@pytest.mark.parametrize("log_every", ["1", "5"])
def test_a_run_whose_loss_turns_nan_stops_before_a_checkpoint_holds_it(manifest, tmp_path, log_every):
    """A learning rate far too high: the loss turns NaN, and the run stops at once in one line,
    where it went on to its last step and saved NaN weights as `latest` (exit 0). A step whose
    loss was not logged is looked at before it is saved."""
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "tokshard", "train", "--manifest", str(manifest), *SMALL, "--micro-batch", "2",
           "--steps", "40", "--lr", "1e4", "--warmup", "1", "--log-every", log_every, "--save", str(save),
           "--save-every", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    stopped = re.fullmatch(r"tokshard: error: step (\d+): the training loss is (nan|inf)\b.*", line)
    assert stopped and "the run diverged, and it stops before a checkpoint holds it" in line, line
    at = int(stopped[1])
    saved = sorted(int(p.name.removeprefix("step")) for p in save.glob("step*"))
    assert all(step < at for step in saved)
    latest = (save / "latest").read_text().strip() if saved else None
    assert latest == (f"step{saved[-1]:08d}" if saved else None)
    assert f"the last checkpoint is {save / latest}" in line if latest else "no checkpoint was saved" in line
    assert all(math.isfinite(t["loss"]) for t in metrics(save)[0] if t["step"] < at)


# --- exact resume: the same samples whether or not the run was interrupted, on 1 or 2 ranks ---

RESUME_STEPS = 6
ZERO2_FP32 = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "allgather_bucket_size": 1e6},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 2}},
}


@pytest.fixture(scope="module")
def resumed(manifest, tmp_path_factory) -> dict[str, Path]:
    """Run A straight through; B, C, D interrupted half way and resumed (D, C across rank counts)."""
    root = tmp_path_factory.mktemp("resume")
    ds = root / "zero2.json"
    ds.write_text(json.dumps(ZERO2_FP32))
    common = ["--manifest", str(manifest), "--deepspeed", str(ds), *SMALL, "--log-samples"]
    common += ["--steps", str(RESUME_STEPS), "--eval-every", str(RESUME_STEPS // 2)]
    half = ["--stop-at", str(RESUME_STEPS // 2)]
    A, B, C, D = (root / n for n in "ABCD")
    launch(*common, "--run-dir", str(A))
    launch(*common, *half, "--save", str(B))
    shutil.copytree(B, C)  # C resumes B's half-way checkpoint on two ranks
    launch(*common, "--save", str(B), "--resume")
    launch(*common, "--save", str(C), "--resume", procs=2, launcher="deepspeed")
    launch(*common, *half, "--save", str(D), procs=2, launcher="torchrun")
    launch(*common, "--save", str(D), "--resume")
    return {"A": A, "B": B, "C": C, "D": D}


def test_resume_continues_with_exactly_the_uninterrupted_samples(resumed):
    a = samples_by_step(resumed["A"])
    assert list(a) == list(range(1, RESUME_STEPS + 1))
    assert all(len(v) == 4 for v in a.values())
    assert len({s[:1] for v in a.values() for s in v}) == 4 * RESUME_STEPS  # positions never repeat
    b = samples_by_step(resumed["B"])
    assert b == a
    a_loss = [t["loss"] for t in metrics(resumed["A"])[0]]
    assert [t["loss"] for t in metrics(resumed["B"])[0]] == a_loss  # bit-identical on one rank
    assert metrics(resumed["B"])[1] == metrics(resumed["A"])[1]  # evaluations at steps 0, 3, 6


@pytest.mark.parametrize("run", ["C", "D"], ids=["1-to-2-ranks", "2-to-1-ranks"])
def test_resume_across_a_rank_count_change_keeps_samples_and_training(resumed, run):
    assert samples_by_step(resumed[run]) == samples_by_step(resumed["A"])
    a_loss = [t["loss"] for t in metrics(resumed["A"])[0]]
    r_loss = [t["loss"] for t in metrics(resumed[run])[0]]
    assert r_loss == pytest.approx(a_loss, rel=1e-4)  # optimizer state came through the conversion
    assert (resumed[run] / f"step{RESUME_STEPS // 2:08d}_universal").is_dir()
    # evaluation split over two ranks (padded so ZeRO-3 would see equal forward passes) agrees too
    a_eval, r_eval = metrics(resumed["A"])[1][-1], metrics(resumed[run])[1][-1]
    assert r_eval["step"] == a_eval["step"] == RESUME_STEPS
    assert r_eval["eval_loss"] == pytest.approx(a_eval["eval_loss"], rel=1e-4)
    state = json.loads((resumed[run] / f"step{RESUME_STEPS:08d}" / "tokshard.json").read_text())
    assert state["samples"] == 4 * RESUME_STEPS and state["world_size"] == (2 if run == "C" else 1)


def test_resume_on_a_different_manifest_is_refused(resumed, manifest, tmp_path):
    other = make_manifest(tmp_path / "other", shard_tokens=30_000)
    ds = resumed["A"].parent / "zero2.json"
    args = ["--manifest", str(other), "--deepspeed", str(ds), *SMALL, "--steps", str(RESUME_STEPS)]
    with pytest.raises(TokshardError, match=r"trained on different data .*manifest.*--allow-data-change"):
        cli.main([*args, "--save", str(resumed["B"]), "--resume"])


def test_resume_on_another_tokenizers_shards_is_refused_naming_both(resumed, manifest, tmp_path):
    """An o200k checkpoint resumed on qwen2 shards went on with a note about windows only: the
    checkpoint records its tokenizer, and another one is said by name, refused unless
    --allow-data-change, which then says the model continues on the other tokenizer's ids."""
    from trainer.checkpoint.resume import check_compatible
    from trainer.checkpoint.state import DataState, read_tag

    other = make_manifest(tmp_path / "other", vocab_size=700)  # a tokenizer trained to another size
    saved = read_tag(resumed["B"], f"step{RESUME_STEPS:08d}")
    ds = resumed["A"].parent / "zero2.json"
    args = ["--manifest", str(other), "--deepspeed", str(ds), *SMALL, "--steps", str(RESUME_STEPS)]
    args += ["--vocab-size", str(saved.vocab_size)]  # the checkpoint's model
    was, now = (json.loads(m.read_text())["tokenizer"]["sha256"] for m in (manifest, other))
    assert was != now
    named = rf"tokenizer: checkpoint sha256 {was[:16]}\.\.\., now sha256 {now[:16]}\.\.\."
    with pytest.raises(TokshardError, match=rf"another tokenizer's ids \({named}\).*--allow-data-change"):
        cli.main([*args, "--save", str(resumed["B"]), "--resume"])
    assert saved.data.tokenizer == was
    moved = DataState(**{**saved.data.__dict__, "tokenizer": now})
    assert check_compatible(saved.data, moved, allow_data_change=True)[0].endswith(
        ": the model continues on another tokenizer's ids"
    )
    older = {k: v for k, v in saved.data.to_json().items() if k != "tokenizer_sha256"}  # an older checkpoint
    assert check_compatible(DataState.from_json(older), moved, allow_data_change=False) == []


def test_resume_refuses_a_new_seed_and_a_changed_seq_len(resumed, manifest):
    ds = resumed["A"].parent / "zero2.json"
    args = [
        "--manifest",
        str(manifest),
        "--deepspeed",
        str(ds),
        *SMALL,
        "--save",
        str(resumed["B"]),
        "--resume",
    ]
    with pytest.raises(TokshardError, match="--seed 5 differs from the checkpoint's 1337"):
        cli.main([*args, "--seed", "5"])
    with pytest.raises(TokshardError, match="--seq-len: checkpoint 32, now 16"):
        cli.main([*args, "--seq-len", "16"])


def test_resume_without_a_checkpoint_and_save_over_one(resumed, manifest, tmp_path):
    base = ["--manifest", str(manifest), *SMALL]
    with pytest.raises(TokshardError, match=r"no checkpoint in .*drop --resume"):
        cli.main([*base, "--save", str(tmp_path / "empty"), "--resume"])
    with pytest.raises(TokshardError, match=r"already holds checkpoints .*pass --resume"):
        cli.main([*base, "--save", str(resumed["B"])])


# --- guards: refused before any process group or model exists ---


def test_vocabulary_larger_than_the_model_is_refused(manifest):
    with pytest.raises(TokshardError, match="1024 ids but model tiny embeds only 512"):
        cli.main(["--manifest", str(manifest), *SMALL, "--vocab-size", "512"])


def test_shard_that_does_not_match_the_manifest_is_refused(manifest, tmp_path):
    shutil.copytree(manifest.parent, tmp_path / "m")
    victim = next((tmp_path / "m" / "stdlib" / "train").glob("*.bin"))
    victim.write_bytes(victim.read_bytes()[:-2])
    with pytest.raises(TokshardError, match=f"{victim.name}: .* bytes on disk, the manifest says"):
        cli.main(["--manifest", str(tmp_path / "m"), *SMALL])


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 runs on this machine")
def test_fp16_config_on_a_machine_without_a_gpu_is_refused(manifest):
    recipe = CONFIGS / "gpt-neo-2.7b-zero2-offload-fp16.json"
    with pytest.raises(TokshardError, match=r"fp16, which needs a CUDA GPU.*bf16"):
        cli.main(["--manifest", str(manifest), "--deepspeed", str(recipe), *SMALL])


def test_missing_validation_split_is_refused(manifest):
    with pytest.raises(TokshardError, match=r"no 'test' split to evaluate on \(splits: train, validation\)"):
        cli.main(["--manifest", str(manifest), *SMALL, "--eval-every", "5", "--eval-split", "test"])


def test_mix_naming_an_unknown_source_is_refused(manifest):
    with pytest.raises(TokshardError, match="--mix names wiki"):
        cli.main(["--manifest", str(manifest), *SMALL, "--mix", "stdlib=1,wiki=2"])


def test_stop_at_without_save_is_refused(manifest):
    """It would stop early and keep nothing to continue from."""
    with pytest.raises(
        TokshardError, match=r"--stop-at 2 stops the run to continue it later.*add --save DIR"
    ):
        cli.main(["--manifest", str(manifest), *SMALL, "--steps", "4", "--stop-at", "2"])


def test_command_line_errors_are_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "tokshard", "train", "--manifest", str(tmp_path / "nowhere")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("tokshard: error: no manifest at")
    assert "Traceback" not in done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tokshard", "train", "--manifest", "x", "--steps", "0"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "--steps: must be a positive integer" in bad.stderr


def test_help_has_an_example():
    text = cli.COMMAND.parser().format_help()
    assert "deepspeed --num_gpus 8 --module tokshard train" in text and "--resume" in text


@pytest.mark.parametrize(("config", "model"), [("zero0-fp32.json", "tiny"), ("zero3-opt.json", "hf:opt")])
def test_a_loss_made_a_chunk_at_a_time_trains_and_evaluates_as_the_whole_one(
    manifest, tmp_path, config, model
):
    """--loss-chunk makes the logits 24 tokens at a time, and again in the backward pass (under
    ZeRO 3 too, where the tied head's weight is gathered at each call), for tokshard's model and a
    Transformers one: the same losses, the same evaluations, to float rounding."""
    if model == "hf:opt":
        model = f"hf:{small_opt(tmp_path / 'opt')}"
    runs = {}
    for chunk in ("0", "24"):
        run = tmp_path / chunk
        launch(
            *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / config), *SMALL, "--model", model),
            *("--micro-batch", "4", "--steps", "4", "--eval-every", "2", "--loss-chunk", chunk, "--run-dir", str(run)),
        )  # fmt: skip
        runs[chunk] = metrics(run)
    (whole_train, whole_eval), (chunked_train, chunked_eval) = runs["0"], runs["24"]
    assert [t["loss"] for t in chunked_train] == pytest.approx([t["loss"] for t in whole_train], rel=1e-5)
    assert [e["eval_loss"] for e in chunked_eval] == pytest.approx(
        [e["eval_loss"] for e in whole_eval], rel=1e-5
    )
    assert len(whole_train) == 4 and len(whole_eval) == 3


@pytest.mark.slow
def test_cpu_optimizer_offload_runs(manifest, tmp_path):
    """ZeRO-2 with the optimizer on the CPU (DeepSpeedCPUAdam: compiled on first use, minutes)."""
    run = tmp_path / "run"
    out = launch(
        *("--manifest", str(manifest), "--deepspeed", str(CONFIGS / "zero2-offload-bf16.json"), *SMALL),
        *("--steps", "2", "--micro-batch", "2", "--run-dir", str(run), "--save", str(tmp_path / "ck")),
        timeout=600,
    )
    assert "bf16, ZeRO 2" in out.stdout
    assert len(metrics(run)[0]) == 2


def test_a_steps_loss_is_the_mean_over_its_micro_batches_that_scored_and_none_where_none_did():
    """A micro-batch that scored no target is loss 0 (`trainer.model.scored_mean`): counted in
    the mean it would drag the step's loss toward 0, and a step of nothing else would log 0."""
    from trainer.distributed import Dist
    from trainer.loop import scored_loss

    one = Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"))
    assert scored_loss(torch.tensor(9.0), torch.tensor(3.0), 0.25, one) == (3.0, 0.25)
    assert scored_loss(torch.tensor(6.0), torch.tensor(1.0), 0.0, one) == (6.0, 0.0)  # one of 2 scored
    assert scored_loss(torch.tensor(0.0), torch.tensor(0.0), 0.0, one) == (None, 0.0)
    nan, _ = scored_loss(torch.tensor(math.nan), torch.tensor(2.0), 0.0, one)
    assert math.isnan(nan)  # a diverged loss still reads as one
