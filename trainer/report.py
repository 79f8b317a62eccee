"""A training run's report: ``RUN_DIR/metrics.jsonl`` -> a PNG and the numbers worth quoting.

``tokshard plot RUN_DIR`` and ``tokshard demo`` use it. The PNG has three panels over the
optimizer step: loss (training, and evaluation where the run evaluated), trained tokens per
second, and the share of time the loop waited for data.

A resumed run appends to the same file and logs again the steps after its checkpoint; for
each step the line written last is the one that counts (the run that carried on from there).
A line cut short by a kill, or one another tool wrote (not a training or evaluation line with
its fields), is skipped and counted. A training line's ``loss`` is null for a step that scored no
target (``trainer.metrics``): a gap in the loss curve, passed over by the first and last loss.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.format.errors import TokshardError, shown_name
from trainer.figures import figure, save_png
from trainer.metrics import METRICS_FILE, line_kind

REPORT_FILE = "report.png"


@dataclass
class Metrics:
    path: Path
    train: list[dict[str, Any]] = field(default_factory=list)  # one per logged step, by step
    evals: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0
    #: the resume line a record starts with (a resume into a new --run-dir): the steps up to
    #: its step are in its ``logged_in`` folder's record
    starts_at: dict[str, Any] | None = None


def metrics_path(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    path = run / METRICS_FILE if run.is_dir() or not run.suffix else run
    if not path.is_file():
        if not run.exists():
            raise TokshardError(
                f"{run} does not exist; pass the --run-dir (or --save) folder of a training run"
            )
        raise TokshardError(
            f"{run} holds no {METRICS_FILE}; pass the --run-dir (or --save) folder of a `tokshard train` run"
        )
    return path


def load(run_dir: str | Path) -> Metrics:
    path = metrics_path(run_dir)
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    unreadable = 0
    starts_at = None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokshardError(f"cannot read {path}: {exc.strerror}") from exc
    for line in raw.splitlines():  # a crash may leave a line of other bytes: it is one line lost
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        kind = line_kind(record)
        if kind == "eval":
            evals[record["step"]] = record
        elif kind == "train":
            train[record["step"]] = record
        elif kind == "resume":  # where a resume's steps before it were logged: no numbers
            if not train and not evals:
                starts_at = record
        else:  # cut short by a kill, or not a line tokshard train wrote
            unreadable += 1
    if not train and not evals:
        if unreadable and path.name != METRICS_FILE:  # lines, none a step's or an evaluation's
            raise TokshardError(
                f"{path} is not a {METRICS_FILE} of `tokshard train` (none of its {unreadable:,} lines is a "
                "training or evaluation line); pass the --run-dir (or --save) folder of a training run"
            )
        raise TokshardError(
            f"{path} has no training or evaluation lines yet; plot it once the run has logged"
        )
    return Metrics(
        path, [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)], unreadable, starts_at
    )


def numbers(m: Metrics) -> dict[str, Any]:
    """What the summary quotes: losses first and last (training: of the steps that scored a
    target; a ``null`` loss is a step that scored none), median tokens/s, mean data wait."""
    scored = [r["loss"] for r in m.train if r["loss"] is not None]
    rates = [r["tokens_per_s"] for r in m.train[1:] or m.train]  # the first interval holds start-up
    waits = [r["data_wait_frac"] for r in m.train]
    first_eval = m.evals[0] if m.evals else None
    last_eval = m.evals[-1] if m.evals else None
    return {
        "metrics": str(m.path),
        "steps": m.train[-1]["step"] if m.train else (last_eval or {}).get("step", 0),
        "first_loss": scored[0] if scored else None,
        "last_loss": scored[-1] if scored else None,
        "first_eval_loss": first_eval["eval_loss"] if first_eval else None,
        "last_eval_loss": last_eval["eval_loss"] if last_eval else None,
        "first_eval_ppl": first_eval["eval_ppl"] if first_eval else None,
        "last_eval_ppl": last_eval["eval_ppl"] if last_eval else None,
        "eval_split": last_eval.get("split") if last_eval else None,
        "tokens_per_s": statistics.median(rates) if rates else 0.0,
        "data_wait_frac": statistics.fmean(waits) if waits else 0.0,
        "unreadable_lines": m.unreadable,
        "resumed_at": m.starts_at["step"] if m.starts_at else None,
        "steps_before_in": m.starts_at["logged_in"] if m.starts_at else None,
    }


def plot(m: Metrics, png: Path, title: str | None = None) -> None:
    fig = figure(8, 8.5)
    loss_ax, rate_ax, wait_ax = fig.subplots(3, 1, sharex=True, height_ratios=[3, 1.3, 1.3])
    steps = [r["step"] for r in m.train]
    if m.train:
        # a step that scored no target (null) is a gap; with gaps, a dot on each step that scored
        # keeps one between two of them in sight
        losses = [math.nan if r["loss"] is None else r["loss"] for r in m.train]
        dots = {"marker": ".", "ms": 4} if any(r["loss"] is None for r in m.train) else {}
        loss_ax.plot(steps, losses, color="tab:blue", lw=1.2, label="train loss", **dots)
    if m.evals:
        split = m.evals[-1].get("split", "eval")
        loss_ax.plot(
            [r["step"] for r in m.evals],
            [r["eval_loss"] for r in m.evals],
            "o-",
            color="tab:orange",
            lw=1.5,
            ms=4,
            label=f"{split} loss",
        )
        last = m.evals[-1]
        loss_ax.annotate(
            f"{last['eval_loss']:.3f} (ppl {last['eval_ppl']:,.1f})",
            (last["step"], last["eval_loss"]),
            textcoords="offset points",
            xytext=(-8, 10),
            ha="right",
            color="tab:orange",
        )
    loss_ax.set_ylabel("loss (nats/token)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(loc="upper right")
    rate_ax.plot(steps, [r["tokens_per_s"] for r in m.train], color="tab:green", lw=1.2)
    rate_ax.set_ylabel("trained tokens/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.grid(alpha=0.3)
    wait_ax.plot(steps, [100 * r["data_wait_frac"] for r in m.train], color="tab:red", lw=1.2)
    wait_ax.set_ylabel("data wait (%)")
    wait_ax.set_ylim(bottom=0)
    wait_ax.set_xlabel("optimizer step")
    wait_ax.grid(alpha=0.3)
    fig.suptitle(shown_name(title or str(m.path.parent)))  # a name the locale could not decode, as typed
    save_png(fig, png, "choose another path (tokshard plot --out PNG)")


def write_report(
    run_dir: str | Path, png: str | Path | None = None, title: str | None = None
) -> dict[str, Any]:
    """Plot the run into ``png`` (default ``RUN_DIR/report.png``); returns the numbers and the path."""
    m = load(run_dir)
    out = Path(png) if png is not None else m.path.parent / REPORT_FILE
    plot(m, out, title)
    return {**numbers(m), "png": str(out)}


def steps(n: dict[str, Any]) -> str:
    """The steps the record holds: a record that starts at a resume holds those after it."""
    if n["resumed_at"] is None or n["resumed_at"] >= n["steps"]:
        return f"{n['steps']} steps"
    return f"steps {n['resumed_at'] + 1}-{n['steps']} (those before are in {n['steps_before_in']})"


def describe(n: dict[str, Any]) -> str:
    """One line for the console."""

    def f(x: float | None) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x:.3f}"

    parts = [f"{n['png']}: {steps(n)}"]
    if n["first_loss"] is not None:
        parts.append(f"train loss {f(n['first_loss'])} -> {f(n['last_loss'])}")
    if n["first_eval_loss"] is not None:
        parts.append(f"{n['eval_split']} loss {f(n['first_eval_loss'])} -> {f(n['last_eval_loss'])}")
    parts.append(f"{n['tokens_per_s']:,.0f} tok/s, data wait {100 * n['data_wait_frac']:.2f}%")
    if n["unreadable_lines"]:
        parts.append(f"{n['unreadable_lines']} unreadable line(s) skipped")
    return "; ".join(parts)
