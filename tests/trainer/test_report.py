"""`tokshard plot`: a run's metrics.jsonl (written by the trainer's own MetricsLog) -> PNG + numbers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from trainer.metrics import MetricsLog
from trainer.report import describe, load, series, write_report


def log_run(run_dir: Path, steps: range, loss0: float, evals: tuple[int, ...] = (), rate: float = 1000.0):
    """Lines exactly as a training run writes them (appending, as a resumed run does)."""
    log = MetricsLog(run_dir, enabled=True, total_steps=steps.stop, out=io.StringIO())
    for step in steps:
        if step in evals:
            log.eval(step=step, loss=loss0 - step / 100, split="validation", sources={"w": loss0})
        if step:
            log.train(
                step=step,
                loss=loss0 - step / 50,
                lr=1e-3,
                tokens_per_s=rate * (0.1 if step == steps.start + 1 else 1),
                samples=8 * step,
                data_wait_frac=0.01,
                elapsed_s=float(step),
            )
    log.close()


def test_a_resumed_run_counts_the_lines_written_last(tmp_path):
    log_run(tmp_path, range(0, 16), loss0=8.0, evals=(0, 10))
    log_run(tmp_path, range(10, 21), loss0=6.0, evals=(20,))  # resumed from step 10's checkpoint
    m = load(tmp_path)
    assert [r["step"] for r in m.train] == list(range(1, 21))
    assert m.train[12]["loss"] == pytest.approx(6.0 - 13 / 50)  # step 13 as the resumed run logged it
    assert m.train[5]["loss"] == pytest.approx(8.0 - 6 / 50)  # step 6 only the first run logged
    assert [e["step"] for e in m.evals] == [0, 10, 20]


def test_a_record_that_starts_at_a_resume_says_which_steps_it_holds(tmp_path):
    """A resume into a new --run-dir logs a resume line (step 3, the steps before in r1) and
    then steps 4 and 5: plot said "5 steps" of a folder holding two."""
    log = MetricsLog(tmp_path, enabled=True, total_steps=5, out=io.StringIO())
    log.resumed(step=3, checkpoint=tmp_path / "ck", logged_in=tmp_path / "r1", last_here=0)
    log.close()
    log_run(tmp_path, range(4, 6), loss0=8.0)
    n = write_report(tmp_path)
    assert describe(n).startswith(f"{n['png']}: steps 4-5 (those before are in {tmp_path / 'r1'}); ")


def resumed_in_the_middle(run_dir: Path, other: Path) -> None:
    """Steps 1-2 logged here, 3-4 in ``other`` (a resume into it), then a resume from step 4's
    checkpoint back into this folder logs its resume line and steps 5-6."""
    run_dir.mkdir()
    log_run(run_dir, range(0, 3), loss0=8.0)
    log = MetricsLog(run_dir, enabled=True, total_steps=6, out=io.StringIO())
    log.resumed(step=4, checkpoint=other / "ck", logged_in=other, last_here=2)
    log.close()
    log_run(run_dir, range(5, 7), loss0=8.0)


def test_a_record_with_a_gap_in_its_middle_counts_the_steps_it_holds(tmp_path):
    """plot said "6 steps" of a record holding 4 (steps 3-4 are in the other folder): it counts
    the steps held and says where the others are."""
    resumed_in_the_middle(tmp_path / "a", tmp_path / "b")
    n = write_report(tmp_path / "a")
    assert describe(n).startswith(f"{n['png']}: 4 steps: 1-2, 5-6 (steps 3-4 are in {tmp_path / 'b'}); ")
    assert n["steps_held"] == 4


def test_the_curves_break_at_a_gap_instead_of_joining_across_it(tmp_path):
    resumed_in_the_middle(tmp_path / "a", tmp_path / "b")
    steps, rows = series(load(tmp_path / "a"))
    assert [s for s, r in zip(steps, rows, strict=True) if r] == [1, 2, 5, 6]
    assert [s for s, r in zip(steps, rows, strict=True) if not r] == [3.5]  # one break, inside the gap


def test_a_line_cut_short_by_a_kill_is_skipped_and_counted(tmp_path):
    log_run(tmp_path, range(0, 6), loss0=8.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss": 7.\n')
    log_run(tmp_path, range(5, 9), loss0=8.0)
    n = write_report(tmp_path)
    assert n["unreadable_lines"] == 1 and n["steps"] == 8
    assert "1 unreadable line(s) skipped" in describe(n)


def test_report_numbers_and_png(tmp_path):
    log_run(tmp_path, range(0, 31), loss0=8.0, evals=(0, 10, 20, 30))
    n = write_report(tmp_path, tmp_path / "out" / "r.png", title="run")
    assert (n["first_eval_loss"], n["last_eval_loss"]) == (pytest.approx(8.0), pytest.approx(7.7))
    assert n["tokens_per_s"] == 1000.0  # the first interval (start-up) does not count
    assert n["data_wait_frac"] == pytest.approx(0.01)
    with Image.open(tmp_path / "out" / "r.png") as img:
        assert img.format == "PNG" and img.size == (800, 850)


def test_a_run_without_evaluation_plots_its_training_lines(tmp_path):
    log_run(tmp_path, range(0, 11), loss0=5.0)
    n = write_report(tmp_path / "metrics.jsonl")  # the file itself works as well as its folder
    assert n["first_eval_loss"] is None and n["steps"] == 10
    assert Path(n["png"]) == tmp_path / "report.png"
    assert "validation" not in describe(n)


def test_plot_replaces_its_own_figure_but_no_other_file(tmp_path):
    """`tokshard plot --out` naming the run's metrics, or a PNG another program wrote, is one
    line and the file is kept; the run's own report.png is redrawn."""
    from support import cli

    log_run(tmp_path, range(0, 6), loss0=8.0)
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    for _ in range(2):  # drawn, then drawn again over its own
        assert cli("plot", str(tmp_path)).returncode == 0
    foreign = tmp_path / "mine.png"
    Image.new("RGB", (4, 4)).save(foreign)
    kept = foreign.read_bytes()
    refused = {
        tmp_path / "metrics.jsonl": (metrics, "metrics.jsonl: the figure is a PNG; name the file with .png"),
        foreign: (kept, f"{foreign} exists and is not a figure tokshard wrote, so it is kept"),
    }
    for target, (what, said) in refused.items():
        proc = cli("plot", str(tmp_path), "--out", str(target))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert said in proc.stderr
        assert target.read_bytes() == what


def test_plot_refuses_a_pipe_at_once(tmp_path):
    """Deciding whether the PNG there was tokshard's opened it to read: a FIFO waited forever."""
    from support import cli

    log_run(tmp_path, range(0, 6), loss0=8.0)
    fifo = tmp_path / "report.png"
    os.mkfifo(fifo)
    proc = cli("plot", str(tmp_path), "--out", str(fifo), timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{fifo} is a pipe, not a file: tokshard writes a file whole and renames it there" in proc.stderr


def test_plot_skips_lines_another_tool_wrote_and_counts_them(tmp_path):
    """A line with a training line's step but not its fields (another tool's, or a field of
    another type) is skipped and counted, never a traceback."""
    from support import cli

    log_run(tmp_path, range(0, 6), loss0=8.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(
            '{"step": 3, "loss": "high"}\n{"step": 4, "loss": 1.0}\n{"step": 7, "eval_loss": null}\n[1, 2]\n'
        )
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 6, "loss": 1.0, \xff\xfe}\n')  # not UTF-8: a disk's garbage after a crash
    proc = cli("plot", str(tmp_path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "5 steps" in proc.stdout and "5 unreadable line(s) skipped" in proc.stdout


def test_a_step_that_scored_no_target_is_a_null_loss_a_gap_and_no_first_or_last(tmp_path):
    """A step none of whose micro-batches scored a target logs ``"loss": null`` (`trainer.loop`):
    still a training line (its rate, samples and wait count), drawn as a gap, and passed over by
    the first and last loss; a run of nothing else quotes no training loss."""
    out = io.StringIO()
    log = MetricsLog(tmp_path, enabled=True, total_steps=5, out=out)
    for step, loss in ((1, None), (2, 6.5), (3, None), (4, 6.0), (5, None)):
        log.train(step=step, loss=loss, lr=1e-3, tokens_per_s=100.0, samples=step, data_wait_frac=0.0,
                  elapsed_s=float(step))  # fmt: skip
    log.close()
    assert "step      1/5 | loss -, no target scored | lr 1.00e-03" in out.getvalue()
    assert '"loss": null' in (tmp_path / "metrics.jsonl").read_text()
    n = write_report(tmp_path)
    assert (n["steps"], n["first_loss"], n["last_loss"], n["unreadable_lines"]) == (5, 6.5, 6.0, 0)
    assert "train loss 6.500 -> 6.000" in describe(n)
    other = tmp_path / "none"
    other.mkdir()
    (other / "metrics.jsonl").write_text(
        '{"step": 1, "loss": null, "lr": 0.0, "tokens_per_s": 1.0, "samples": 1, "data_wait_frac": 0.0, '
        '"elapsed_s": 1.0}\n'
    )
    n = write_report(other)
    assert (n["steps"], n["first_loss"], n["unreadable_lines"]) == (1, None, 0)
    assert "train loss" not in describe(n)


def test_a_value_that_is_not_finite_is_written_as_null_and_named(tmp_path):
    """A diverged step's NaN and an infinite evaluation loss were written as NaN and Infinity,
    which JSON does not have: strict readers (jq, json.loads with parse_constant refusing them)
    refused the whole file."""
    import json
    import math

    log = MetricsLog(tmp_path, enabled=True, total_steps=2, out=io.StringIO())
    log.train(step=1, loss=math.nan, lr=1e-3, tokens_per_s=1.0, samples=8, data_wait_frac=0.0, elapsed_s=1.0)
    log.eval(step=1, loss=math.inf, split="validation", sources={"w": math.inf, "v": 2.0})
    log.close()

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    train, evaluation = [
        json.loads(line, parse_constant=refuse) for line in (tmp_path / "metrics.jsonl").open()
    ]
    assert train["loss"] is None and train["not_finite"] == ["loss"]
    assert evaluation["eval_loss"] is None and evaluation["sources"] == {"w": None, "v": 2.0}
    assert evaluation["not_finite"] == ["eval_loss", "sources.w"]


def test_plot_of_a_non_ascii_run_folder_under_an_ascii_locale_draws_it(tmp_path):
    """Under LC_ALL=C with PYTHONUTF8=0 the folder's name arrives as lone surrogates, which the
    figure's default title could not render (a matplotlib traceback)."""
    from support import cli

    (tmp_path / "rün").mkdir()
    log_run(tmp_path / "rün", range(0, 6), loss0=8.0)
    proc = cli("plot", "rün", cwd=tmp_path, env={"LC_ALL": "C", "PYTHONUTF8": "0"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "rün" / "report.png").is_file()
