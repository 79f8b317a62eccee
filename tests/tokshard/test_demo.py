"""`tokshard demo` end to end, run as a newcomer runs it: from a clean copy of the repository.

The clean copy holds exactly the files git tracks (no .venv, no caches, no build output), so
a module someone forgot to add, or a path that only exists in a developer's checkout, fails
here. Installing everything again into a fresh venv (`.ci/setup`) takes minutes of pip and a
DeepSpeed build, too long for the suite; the copy runs with the interpreter of the current
environment instead, with PYTHONPATH pointing at the copy (asserted), and `test_readme.py`
checks that the Quickstart's set-up commands are the ones CI runs.

The demo runs once at `--size quick` (about 30 s); the rerun tests work on copies of its
folder, so each test sees the same first run.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from support import REPO, cli, validate_manifest

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import DiskFullError, lock_file, try_exclusive
from pipeline.format.errors import TokshardError
from tokshard.demo import DEMO_LOCK

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def clean_copy(dest: Path) -> Path:
    """The tracked files of the repository (working-tree content), nothing else."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def run_demo(copy: Path, out: Path, *extra: str):
    return cli("demo", "--out", str(out), "--size", "quick", *extra, env={"PYTHONPATH": str(copy)}, cwd=copy)


def mtimes(paths: list[Path]) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in paths}


def prepared_files(out: Path) -> list[Path]:
    """What the corpus, tokenizer and prepare stages wrote (shards, index, checkpoints, manifest)."""
    data = out / "data"
    files = [*data.rglob("*.bin"), *data.rglob("*.idx"), *(data / ".tokshard").rglob("*.json")]
    return [
        *files,
        data / "manifest.json",
        out / "tokenizer" / "tokenizer.json",
        *(out / "hub-mirror").rglob("*"),
    ]


def checkpoint_files(out: Path) -> list[Path]:
    return [p for p in (out / "run").rglob("*") if p.is_file() and p.suffix in (".pt", ".json")]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    dest = clean_copy(tmp_path_factory.mktemp("clean") / "tokshard")
    assert not (dest / ".venv").exists()
    where = subprocess.run(
        [sys.executable, "-c", "import pipeline, trainer; print(pipeline.__file__); print(trainer.__file__)"],
        capture_output=True,
        text=True,
        cwd=dest,
        env={**os.environ, "PYTHONPATH": str(dest)},
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(dest) for p in where), where  # the copy's code, not the checkout's
    return dest


@pytest.fixture(scope="module")
def demo(copy, tmp_path_factory):
    """One quick demo from the clean copy: (folder, finished process, seconds)."""
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    t0 = time.monotonic()
    proc = run_demo(copy, out)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc, seconds


def test_demo_writes_a_png_report_and_a_json_summary(demo):
    out, proc, _ = demo
    for name in ("report.png", "doc_lengths.png"):
        raw = (out / name).read_bytes()
        assert raw.startswith(PNG_MAGIC)
        with Image.open(out / name) as img:
            img.verify()
        with Image.open(out / name) as img:
            assert img.size[0] >= 600 and img.size[1] >= 400
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {"sources", "totals", "encode", "training", "stages", "paths"}
    assert summary["training"]["tokens_per_s"] > 0
    assert 0 <= summary["training"]["data_wait_frac"] < 1
    assert summary["encode"]["tokens_per_worker_s"] > 0
    assert set(summary["stages"]) == {"corpus", "tokenizer", "prepare", "verify", "train", "report"}
    assert "| eval loss, first -> last |" in (out / "summary.md").read_text()
    assert "eval loss" in proc.stdout and "report.png" in proc.stdout


def test_demo_model_learns_on_the_validation_split(demo):
    out, _, _ = demo
    evals = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if "eval_loss" in e]
    assert evals[0]["step"] == 0 and evals[0]["split"] == "validation"
    assert evals[0]["eval_loss"] == pytest.approx(math.log(2048), abs=0.3)  # untrained: uniform over 2048 ids
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 1.0
    t = json.loads((out / "summary.json").read_text())["training"]
    assert (t["first_eval_loss"], t["last_eval_loss"]) == (evals[0]["eval_loss"], evals[-1]["eval_loss"])
    assert t["last_eval_ppl"] == pytest.approx(math.exp(t["last_eval_loss"]))


def test_demo_prepares_the_three_hub_sources_from_a_mirror_in_the_hub_layouts(demo):
    out, _, _ = demo
    mirror = out / "hub-mirror"
    for rel in (
        "Salesforce/wikitext/wikitext-103-raw-v1/train-00000-of-00002.parquet",
        "Salesforce/wikitext/wikitext-103-raw-v1/train-00001-of-00002.parquet",
        "Salesforce/wikitext/wikitext-103-raw-v1/validation-00000-of-00001.parquet",
        "Salesforce/wikitext/wikitext-103-raw-v1/test-00000-of-00001.parquet",
        "vblagoje/cc_news/data/train-00000-of-00002.parquet",
        "bookcorpus/bookcorpus/plain_text/train/0000.parquet",
    ):
        assert (mirror / rel).is_file(), rel
    data = validate_manifest(out / "data" / "manifest.json")
    assert {name: s["type"] for name, s in data["sources"].items()} == {
        "bookcorpus": "bookcorpus",
        "cc_news": "cc_news",
        "wikitext": "wikitext",
    }
    assert list(data["sources"]["wikitext"]["splits"]) == ["train", "validation", "test"]
    for name, source in data["sources"].items():
        assert source["origin"]["mirror"].startswith(str(mirror)), name
        assert all(s["tokens"] > 0 for s in source["splits"].values()), name


def test_demo_summary_counts_are_the_manifests(demo):
    out, _, _ = demo
    summary = json.loads((out / "summary.json").read_text())
    m = manifest_mod.load(out / "data")
    assert summary["totals"] == m.data["totals"]
    for name, info in m.data["sources"].items():
        for split, stats in info["splits"].items():
            assert summary["sources"][name][split]["tokens"] == stats["tokens"]
    assert summary["encode"]["tokens"] == m.data["totals"]["tokens"]


def test_rerun_keeps_every_finished_stage_and_rewrites_the_report(demo, copy, tmp_path):
    first, _, seconds = demo
    out = tmp_path / "demo-out"
    shutil.copytree(first, out)  # copy2 keeps modification times
    kept = mtimes(prepared_files(out) + checkpoint_files(out))
    metrics = (out / "run" / "metrics.jsonl").read_text()
    report = (out / "report.png").stat().st_mtime_ns
    t0 = time.monotonic()
    proc = run_demo(copy, out)
    rerun = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage in ("corpus", "tokenizer", "prepare", "train"):
        assert f"{stage}: already done" in proc.stderr
    assert mtimes(prepared_files(out) + checkpoint_files(out)) == kept
    assert (out / "run" / "metrics.jsonl").read_text() == metrics
    assert (out / "report.png").stat().st_mtime_ns > report
    assert rerun < max(20.0, seconds / 2), (rerun, seconds)


def test_interrupted_training_continues_from_its_last_checkpoint(demo, copy, tmp_path):
    first, _, _ = demo
    out = tmp_path / "demo-out"
    shutil.copytree(first, out)
    final_eval = json.loads((out / "summary.json").read_text())["training"]["last_eval_loss"]
    run = out / "run"
    tags = sorted(p.name for p in run.glob("step*") if p.is_dir())
    assert len(tags) >= 2, tags  # the demo saves along the way, not only at the end
    shutil.rmtree(run / tags[-1])  # as if stopped before the last save
    (run / "latest").write_text(tags[-2])
    kept = mtimes(prepared_files(out))
    proc = run_demo(copy, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = int(tags[-2].removeprefix("step"))
    assert f"resumed {tags[-2]} at step {step}" in (out / "train.log").read_text()
    assert (run / "latest").read_text().strip() == tags[-1]
    assert mtimes(prepared_files(out)) == kept
    resumed_eval = json.loads((out / "summary.json").read_text())["training"]["last_eval_loss"]
    assert resumed_eval == pytest.approx(final_eval, rel=1e-4)  # the same samples as without the stop


def test_demo_refuses_a_folder_that_holds_a_demo_of_another_size(demo, copy, tmp_path):
    out = tmp_path / "demo-out"
    out.mkdir()
    (out / "demo.json").write_text(json.dumps({"size": "default", "stages": {}}))
    proc = run_demo(copy, out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tokshard: error: {out} holds a demo of size 'default', not 'quick'; "
        "use another --out, or delete the folder to start over"
    ]


def test_plot_and_inspect_plot_draw_the_demos_run_and_data(demo, tmp_path):
    out, _, _ = demo
    png = tmp_path / "loss.png"
    proc = cli("plot", str(out / "run"), "--out", str(png), check=True)
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert "validation loss" in proc.stdout and "tok/s" in proc.stdout
    hist = tmp_path / "lengths.png"
    proc = cli("inspect", str(out / "data"), "--json", "--plot-file", str(hist), check=True)
    assert json.loads(proc.stdout)["totals"]["shards"] >= 8  # the JSON stays clean
    assert hist.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("command", ["plot", "inspect"])
def test_a_png_that_cannot_be_written_is_one_line(demo, tmp_path, command):
    out, _, _ = demo
    (tmp_path / "a-file").write_text("x")
    target = str(tmp_path / "a-file" / "x.png")  # below a file: no folder can be made there
    args = (
        ["plot", str(out / "run"), "--out", target] if command == "plot" else ["inspect", str(out / "data")]
    )
    proc = cli(*args, *(["--plot-file", target] if command == "inspect" else []))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"tokshard: error: cannot write {target}: ")


def test_the_test_suite_collects_from_the_clean_copy(copy):
    # --assert=plain: a collection runs no assert, and rewriting them all in a copy without
    # bytecode caches cost a third of its CPU
    options = ["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "--assert=plain"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *options],
        capture_output=True,
        text=True,
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests/tokshard/test_demo.py::test_demo_writes_a_png_report_and_a_json_summary" in proc.stdout


@pytest.mark.parametrize("record", ["[]", '{"stages": 7}', '{"size": "quick", "stages": {"corpus": 7}}'])
def test_a_demo_record_of_another_shape_is_one_line(copy, tmp_path, record):
    out = tmp_path / "demo-out"
    out.mkdir()
    (out / "demo.json").write_text(record)
    proc = run_demo(copy, out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f'tokshard: error: {out}/demo.json is damaged (not an object whose "stages" holds an object per '
        f"stage); delete {out} to start the demo over"
    ]
    assert (out / "demo.json").read_text() == record


def test_a_demo_json_of_the_users_is_named_as_not_the_demos(copy, tmp_path):
    """It was "holds a demo of size None, not 'quick'"."""
    out = tmp_path / "demo-out"
    out.mkdir()
    (out / "demo.json").write_text('{"my": "config"}')
    proc = run_demo(copy, out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tokshard: error: {out} holds a demo.json that tokshard demo did not write (it names no size); "
        "use another --out, or delete the folder to start over"
    ]
    assert (out / "demo.json").read_text() == '{"my": "config"}'
    assert [p.name for p in out.iterdir()] == ["demo.json"], "no lock file left beside it"


def test_an_out_folder_that_cannot_be_made_is_one_line(copy):
    proc = run_demo(copy, Path("/proc/tokshard-demo-out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tokshard: error: --out /proc/tokshard-demo-out: cannot write there (No such file or directory); "
        "choose a writable folder"
    ]


@pytest.mark.parametrize("started", [False, True])
def test_a_second_demo_on_a_folder_is_refused_naming_the_first(copy, tmp_path, started):
    """The first demo holds the folder's lock (here this process does), from before its record."""
    out = tmp_path / "demo-out"
    out.mkdir()
    if started:
        (out / "demo.json").write_text(json.dumps({"size": "quick", "stages": {}}))
    lock = out / DEMO_LOCK
    fd = lock_file(lock)
    try:
        assert try_exclusive(fd, lock)
        os.write(fd, json.dumps({"pid": 4242, "host": "node7", "since": "2024-05-01 10:00:00"}).encode())
        proc = run_demo(copy, out)
    finally:
        os.close(fd)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"tokshard: error: another tokshard demo (pid 4242 on node7 since 2024-05-01 10:00:00) is running "
        f"on {out}; wait for it or stop it"
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted([DEMO_LOCK, *(["demo.json"] if started else [])])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped has ended)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def trainer_pid(out: Path, proc: subprocess.Popen, attempt: int, timeout: float = 180) -> int:
    """The pid of the demo's ``tokshard train`` (its lock's record), once its ``attempt``-th
    start has logged a step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        log = (out / "train.log").read_text() if (out / "train.log").exists() else ""
        runs = re.split(r"^\$ ", log, flags=re.MULTILINE)
        if len(runs) > attempt and "\nstep" in runs[attempt]:
            return json.loads((out / "run" / ".tokshard-train.lock").read_text())["pid"]
        time.sleep(0.2)
    raise AssertionError(f"no step logged by training attempt {attempt}")


def test_a_stopped_demo_stops_its_trainer_and_a_rerun_resumes_it(demo, copy, tmp_path):
    """SIGTERM is passed on (the trainer saves and stops); a SIGKILL of the demo ends the trainer
    too; the rerun then resumes and ends as an uninterrupted run."""
    first, _, _ = demo
    out = tmp_path / "demo-out"
    shutil.copytree(first, out)
    final_eval = json.loads((out / "summary.json").read_text())["training"]["last_eval_loss"]
    shutil.rmtree(out / "run")
    (out / "train.log").write_text("")
    kept = mtimes(prepared_files(out))
    cmd = [sys.executable, "-m", "tokshard", "demo", "--out", str(out), "--size", "quick"]
    env = {**os.environ, "PYTHONPATH": str(copy)}
    for attempt, how in enumerate((signal.SIGTERM, signal.SIGKILL), start=1):
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=copy
        )
        pid = trainer_pid(out, proc, attempt)
        proc.send_signal(how)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == (143 if how == signal.SIGTERM else -9), err[-3000:]
        if how == signal.SIGTERM:
            assert "Traceback" not in err
            assert (
                err.strip().splitlines()[-1]
                == "tokshard: stopped by SIGTERM; rerun the same command to resume"
            )
        deadline = time.monotonic() + 60
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(pid), f"the trainer {pid} outlived the demo ({how!r})"
    proc = run_demo(copy, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed step" in (out / "train.log").read_text()
    assert mtimes(prepared_files(out)) == kept
    resumed_eval = json.loads((out / "summary.json").read_text())["training"]["last_eval_loss"]
    assert resumed_eval == pytest.approx(final_eval, rel=1e-4)


def test_a_tokenizer_json_that_no_longer_reads_is_trained_again(demo, copy, tmp_path):
    first, _, _ = demo
    out = tmp_path / "demo-out"
    shutil.copytree(first, out)
    tok = out / "tokenizer" / "tokenizer.json"
    original = tok.read_bytes()
    tok.write_text("not a tokenizer")
    proc = run_demo(copy, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"tokenizer: {tok} does not read as a tokenizer; training it again" in proc.stderr
    assert tok.read_bytes() == original  # the same text trains the same tokenizer: the shards stand
    assert "prepare: already done" in proc.stderr and "train: already done" in proc.stderr


@pytest.mark.parametrize(
    "full",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow's
        DiskFullError("x/demo.json.tmp", 0, None),  # a stage's own line, which says to rerun that stage
    ],
)
def test_a_full_disk_is_one_line_saying_to_rerun_the_demo(tmp_path, monkeypatch, full):
    from tokshard import demo as demo_mod

    def write_mirror(*args):
        raise full

    monkeypatch.setattr(demo_mod, "write_mirror", write_mirror)
    out = tmp_path / "demo-out"
    with pytest.raises(TokshardError) as raised:
        demo_mod.run(out, "quick", log=lambda line: None)
    assert (
        str(raised.value)
        == f"no space left on the device of {out}; free space and rerun the demo: it resumes"
    )


def test_a_trainer_that_found_the_disk_full_is_one_line_of_the_demo(tmp_path, monkeypatch):
    """The trainer's own error line was echoed ("tokshard demo:   tokshard: error: checkpoint
    not saved: disk full ...") above the demo's, which says the same and what to do."""
    from tokshard import demo as demo_mod

    trainer = tmp_path / "trainer"
    trainer.write_text(
        "#!/bin/sh\necho 'step 1 loss 7.6'\n"
        "echo 'tokshard: error: checkpoint not saved: disk full writing x (0.0 MiB free); free space'\nexit 2\n"
    )
    trainer.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(trainer))
    folder = demo_mod.DemoFolder(tmp_path / "demo-out")
    folder.root.mkdir()
    shown: list[str] = []
    with pytest.raises(TokshardError) as raised:
        demo_mod.run_training(folder, demo_mod.SIZES["quick"], shown.append)
    assert shown == ["  step 1 loss 7.6"]
    assert str(raised.value).startswith(f"no space left on the device of {folder.run} while training (")


def test_the_summarys_pieces_start_with_the_tokenizer_train_the_demo_ran(tmp_path):
    """summary.md's "Run the pieces yourself" lacked the tokenizer stage: its line now parses
    as `tokshard tokenizer train` over the mirror's train files, at the demo's vocabulary."""
    import shlex

    from tokshard import demo as demo_mod
    from tokshard.cli import build_parser

    size = demo_mod.SIZES["quick"]
    line = demo_mod.tokenizer_command(str(tmp_path / "mirror"), str(tmp_path / "tokenizer"), size)
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert args.input == [f"{tmp_path / 'mirror'}/{g}" for g in demo_mod.TRAIN_FILES]
    assert (args.vocab_size, args.out) == (size.vocab_size, str(tmp_path / "tokenizer"))
