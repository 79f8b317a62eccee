"""A training run's report: ``RUN_DIR/metrics.jsonl`` -> a PNG and the numbers worth quoting.

``tokshard plot RUN_DIR`` and ``tokshard demo`` use it. The PNG has three panels over the
optimizer step: loss (training, and evaluation where the run evaluated), trained tokens per
second, and the share of time the loop waited for data.

A resumed run appends to the same file and logs again the steps after its checkpoint; for
each step the line written last is the one that counts (the run that carried on from there).
A line cut short by a kill, or one another tool wrote (not a training or evaluation line with
its fields), is skipped and counted. A training line's ``loss`` is null for a step that scored
no target (``trainer.metrics``): a gap in the loss curve, passed over by the first and last loss.

A resume line (a resume into a folder that had not logged up to its checkpoint) marks steps
the record does not hold: those after the folder's last line up to the checkpoint are in the
folder it names. The summary counts the steps held and says where the others are, and the
curves break there instead of joining across them.
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


@dataclass(frozen=True)
class Gap:
    """Steps ``after`` + 1 to ``upto`` of the run, which another folder (``logged_in``) logged."""

    after: int
    upto: int
    logged_in: str

    def to_json(self) -> dict[str, Any]:
        return {"after": self.after, "upto": self.upto, "logged_in": self.logged_in}


@dataclass
class Metrics:
    path: Path
    train: list[dict[str, Any]] = field(default_factory=list)  # one per logged step, by step
    evals: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0
    #: the steps another folder logged, by step (from the record's resume lines): a record that
    #: starts at a resume into a new --run-dir has one from step 0
    gaps: list[Gap] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        """The last step the record has a line of."""
        if self.train:
            return self.train[-1]["step"]
        return self.evals[-1]["step"] if self.evals else 0


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
    resumes: list[dict[str, Any]] = []
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
            resumes.append(record)
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
    m = Metrics(path, [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)], unreadable)
    m.gaps = gaps(resumes, m.last_step)
    return m


def gaps(resumes: list[dict[str, Any]], last: int) -> list[Gap]:
    """The steps up to ``last`` that the resume lines say another folder logged, by step; gaps
    that overlap (or touch) are one, in the folder of the later one."""
    found: list[Gap] = []
    spans = [(r["last_here"], min(r["step"], last), r["logged_in"]) for r in resumes]
    for after, upto, logged_in in sorted(s for s in spans if s[0] < s[1]):
        if found and after <= found[-1].upto:
            after = found.pop().after
        found.append(Gap(after, upto, logged_in))
    return found


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
        "steps": m.last_step,
        "steps_held": m.last_step - sum(g.upto - g.after for g in m.gaps),
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
        "gaps": [g.to_json() for g in m.gaps],
    }


def plot(m: Metrics, png: Path, title: str | None = None) -> None:
    fig = figure(8, 8.5)
    loss_ax, rate_ax, wait_ax = fig.subplots(3, 1, sharex=True, height_ratios=[3, 1.3, 1.3])
    steps, rows = series(m)
    if m.train:
        # a step that scored no target (null) is a gap; with gaps, a dot on each step that scored
        # keeps one between two of them in sight
        losses = [math.nan if r.get("loss") is None else r["loss"] for r in rows]
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
    rate_ax.plot(steps, [r.get("tokens_per_s", math.nan) for r in rows], color="tab:green", lw=1.2)
    rate_ax.set_ylabel("trained tokens/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.grid(alpha=0.3)
    wait_ax.plot(steps, [100 * r.get("data_wait_frac", math.nan) for r in rows], color="tab:red", lw=1.2)
    wait_ax.set_ylabel("data wait (%)")
    wait_ax.set_ylim(bottom=0)
    wait_ax.set_xlabel("optimizer step")
    wait_ax.grid(alpha=0.3)
    fig.suptitle(shown_name(title or str(m.path.parent)))  # a name the locale could not decode, as typed
    save_png(fig, png, "choose another path (tokshard plot --out PNG)")


def series(m: Metrics) -> tuple[list[float], list[dict[str, Any]]]:
    """The training lines' steps and lines, with an empty line inside each gap (a NaN point):
    a curve breaks where another folder logged the steps, instead of joining across them."""
    steps: list[float] = []
    rows: list[dict[str, Any]] = []
    for r in m.train:
        if steps and any(steps[-1] < g.upto and g.after + 1 < r["step"] for g in m.gaps):
            steps.append((steps[-1] + r["step"]) / 2)
            rows.append({})
        steps.append(r["step"])
        rows.append(r)
    return steps, rows


def write_report(
    run_dir: str | Path, png: str | Path | None = None, title: str | None = None
) -> dict[str, Any]:
    """Plot the run into ``png`` (default ``RUN_DIR/report.png``); returns the numbers and the path."""
    m = load(run_dir)
    out = Path(png) if png is not None else m.path.parent / REPORT_FILE
    plot(m, out, title)
    return {**numbers(m), "png": str(out)}


def steps(n: dict[str, Any]) -> str:
    """The steps the record holds, and where those it does not are: a record that starts at a
    resume holds those after it, one with a resume in its middle those on either side."""
    if not n["gaps"]:
        return f"{n['steps']} steps"
    held = ", ".join(_span(a, b) for a, b in held_spans(n["gaps"], n["steps"]))
    where = "; ".join(
        f"those before are in {g['logged_in']}"
        if g["after"] == 0
        else f"steps {_span(g['after'], g['upto'])} are in {g['logged_in']}"
        for g in n["gaps"]
    )
    if not held:  # only an evaluation after the resume line
        return f"0 steps ({where})"
    if "," not in held:
        return f"steps {held} ({where})"
    return f"{n['steps_held']} steps: {held} ({where})"


def held_spans(found: list[dict[str, Any]], last: int) -> list[tuple[int, int]]:
    """The (after, upto] spans of steps 1 to ``last`` outside the gaps ``found``."""
    spans, after = [], 0
    for g in found:
        if g["after"] > after:
            spans.append((after, g["after"]))
        after = g["upto"]
    if last > after:
        spans.append((after, last))
    return spans


def _span(after: int, upto: int) -> str:
    """Steps ``after`` + 1 to ``upto``, as "4-5" or "4"."""
    return str(upto) if upto == after + 1 else f"{after + 1}-{upto}"


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
