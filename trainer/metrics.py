"""The run's record: ``RUN_DIR/metrics.jsonl`` (one JSON object per line) and console lines.

Written by rank 0 only, appended to (a resumed run continues the same file). A resume first
cuts the file back to the checkpoint's step (``cut_back_logs``): the lines a killed run wrote
after its last checkpoint are trained again, so the log reads as one run. ``tokshard plot``
reads it. Keys:

training line (every ``--log-every`` steps, and the last step)
    ``step``            optimizer steps done (DeepSpeed's global step)
    ``loss``            mean training loss of the step: the mean over its micro-batches, on
                        every rank, that scored at least one target (one whose targets are all
                        ignored, -100, is left out); ``null`` for a step in which none did (a
                        step of packed bins of lone EOS pieces, or of windows whose inputs are
                        all EOS under ``--eod-mask-loss``): such a step has no loss, and
                        ``tokshard plot`` leaves a gap there
    ``lr``              the learning rate the step's optimizer step applied
    ``tokens_per_s``    trained tokens per second, all ranks, over the steps since the last line
    ``samples``         samples consumed since the run began (the data position)
    ``data_wait_frac``  share of wall time the loop waited for a batch since the last line
                        (the slowest rank's)
    ``elapsed_s``       seconds since this process started training

evaluation line (at step 0 of a fresh run, every ``--eval-every`` steps, and the last step;
a stop during one abandons it, unlogged, and the resume from that step runs it first)
    ``step``, ``eval_loss`` (mean over the split's evaluation windows), ``eval_ppl``
    (``exp(eval_loss)``), ``split``, ``sources`` (loss per source)

resume line (a resume into a run folder that did not log the checkpoint's last steps: another
``--run-dir`` did, and the steps between this folder's last line and the checkpoint are there)
    ``step`` (the checkpoint's), ``resumed`` (the checkpoint's folder), ``logged_in`` (the folder
    that logged up to it), ``last_here`` (this folder's last logged step before it)

A value that is not a finite number (a diverged step's NaN, in fp16 a step its loss scaler
skips; an infinite evaluation loss) is written as ``null`` and named in the line's
``not_finite`` list: JSON has no NaN or Infinity, and strict readers (jq, most languages'
parsers) refuse a file that holds them.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, TextIO, get_args

from pipeline.format.atomic import disk_error, write_bytes
from trainer.console import StdoutUnwritable, reader_gone

METRICS_FILE = "metrics.jsonl"
SAMPLES_GLOB = "samples-rank*.jsonl"

#: a training line's keys and what each holds (a number: an int or a float; None: null)
TRAIN_LINE = {
    "step": int,
    "loss": float | None,
    "lr": float,
    "tokens_per_s": float,
    "samples": int,
    "data_wait_frac": float,
    "elapsed_s": float,
}
#: an evaluation line's
EVAL_LINE = {"step": int, "eval_loss": float, "eval_ppl": float, "split": str, "sources": dict}
#: a resume line's
RESUME_LINE = {"step": int, "resumed": str, "logged_in": str, "last_here": int}


def line_kind(record: Any) -> str | None:
    """``"train"``, ``"eval"`` or ``"resume"`` for a line as ``MetricsLog`` writes it; None for
    anything else (a line another tool wrote, a field of another type)."""
    for kind, keys in (("train", TRAIN_LINE), ("eval", EVAL_LINE), ("resume", RESUME_LINE)):
        if isinstance(record, dict) and all(k in record and _holds(record[k], t) for k, t in keys.items()):
            return kind
    return None


def _holds(value: Any, kind: Any) -> bool:
    if isinstance(kind, UnionType):
        return any(_holds(value, k) for k in get_args(kind))
    if kind is NoneType:
        return value is None
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def cut_back_logs(run_dir: Path, step: int, eval_again: bool = False) -> int:
    """Drop, from metrics.jsonl and the samples-rank*.jsonl files, every line after ``step``
    (and a last line a kill cut short); returns how many lines went. With ``eval_again`` (the
    checkpoint's evaluation was abandoned, and the resume runs it), an evaluation line of
    ``step`` goes too: an earlier resume of the same checkpoint wrote it. Each file is replaced
    atomically, so a kill now loses nothing that was kept."""
    dropped = 0
    for path in [run_dir / METRICS_FILE, *sorted(run_dir.glob(SAMPLES_GLOB))]:
        if path.is_file():
            dropped += _cut_back(path, step, eval_again)
    return dropped


def _cut_back(path: Path, step: int, eval_again: bool) -> int:
    lines = path.read_bytes().splitlines(keepends=True)
    keep = [line for line in lines if _keep(line, step, eval_again)]
    if len(keep) != len(lines):
        write_bytes(path, b"".join(keep))
    return len(lines) - len(keep)


def _keep(line: bytes, step: int, eval_again: bool) -> bool:
    """A whole JSON line of a step up to ``step`` (or of no step at all) stays."""
    if not line.endswith(b"\n"):
        return False  # cut short by the kill
    try:
        record = json.loads(line)
    except ValueError:
        return False
    at = record.get("step") if isinstance(record, dict) else None
    if eval_again and at == step and line_kind(record) == "eval":
        return False
    if at == step and line_kind(record) == "resume":  # an earlier resume of this checkpoint: said again
        return False
    return not isinstance(at, int) or at <= step


def last_logged(run_dir: Path) -> int:
    """The last step ``run_dir``'s metrics.jsonl has a training or evaluation line of (0: none)."""
    try:
        lines = (run_dir / METRICS_FILE).read_bytes().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if line_kind(record) in ("train", "eval"):
                steps.append(record["step"])
    return max(steps)


def finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as strict JSON holds it: each value that is not a finite number (at the top
    level, or per source) null, and their keys listed in ``not_finite``."""
    named: list[str] = []

    def kept(key: str, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            named.append(key)
            return None
        if isinstance(value, dict):
            return {k: kept(f"{key}.{k}", v) for k, v in value.items()}
        return value

    out = {key: kept(key, value) for key, value in record.items()}
    return {**out, "not_finite": named} if named else out


class LineFile:
    """A file of the run's record that lines are appended to, each on disk once written (a kill
    -9 loses none before the checkpoint a resume starts from). A write that fails (a full disk)
    is one line naming the file, and closes it on the spot: its lost line is of a step the resume
    trains again, and a later ``close`` (in a ``finally``) must not try it again and bury that
    line under a second error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: TextIO | None = open(path, "a")
        except OSError as exc:
            raise disk_error(exc, path) from exc

    def write(self, line: str) -> None:
        """Append ``line`` (ending in a newline) and flush it; after a failed write, nothing."""
        if self._file is None:
            return
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:  # a full disk mid-run: one line, the checkpoints are kept
            self._abandon()
            raise disk_error(exc, self.path) from exc

    def _abandon(self) -> None:
        file, self._file = self._file, None
        with contextlib.suppress(OSError):  # the failed write's bytes, tried again: the same error
            file.close()

    def close(self) -> None:
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.close()
        except OSError as exc:
            raise disk_error(exc, self.path) from exc


class MetricsLog:
    def __init__(self, run_dir: Path, enabled: bool, total_steps: int, out: TextIO | None = None) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.path = run_dir / METRICS_FILE
        self._file = LineFile(self.path) if enabled else None
        self._out = out
        self._console_lost = False

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(finite(record), allow_nan=False) + "\n")

    def _say(self, line: str) -> None:
        if not self.enabled or self._console_lost:
            return
        try:
            print(line, file=self._out, flush=True)
        except BrokenPipeError:  # the console's reader quit: the run goes on, metrics.jsonl is its record
            self._lose_console()
        except (StdoutUnwritable, OSError) as exc:  # a full disk under `> train.log`: the same
            reason = exc.reason if isinstance(exc, StdoutUnwritable) else exc.strerror
            print(
                f"tokshard: cannot write to standard output ({reason}); training goes on without "
                f"its console, and {self.path} keeps its record",
                file=sys.stderr,
                flush=True,
            )
            self._lose_console()

    def _lose_console(self) -> None:
        self._console_lost = True
        if self._out is None:
            reader_gone()

    def train(
        self,
        *,
        step: int,
        loss: float | None,
        lr: float,
        tokens_per_s: float,
        samples: int,
        data_wait_frac: float,
        elapsed_s: float,
    ) -> None:
        self._write(
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "tokens_per_s": tokens_per_s,
                "samples": samples,
                "data_wait_frac": data_wait_frac,
                "elapsed_s": elapsed_s,
            }
        )
        shown = "-, no target scored" if loss is None else f"{loss:.4f}"
        self._say(
            f"step {step:>6}/{self.total_steps} | loss {shown} | lr {lr:.2e} | "
            f"{tokens_per_s:,.0f} tok/s | samples {samples:,} | data wait {100 * data_wait_frac:.2f}%"
        )

    def eval(self, *, step: int, loss: float, split: str, sources: dict[str, float]) -> None:
        ppl = math.exp(min(loss, 700.0))
        self._write({"step": step, "eval_loss": loss, "eval_ppl": ppl, "split": split, "sources": sources})
        self._say(f"eval {step:>6}/{self.total_steps} | {split} loss {loss:.4f} | ppl {ppl:,.2f}")

    def resumed(self, *, step: int, checkpoint: Path, logged_in: Path, last_here: int) -> None:
        """The resume line: the steps after ``last_here`` up to ``step`` are in ``logged_in``'s
        record (both folders absolute: the line is read from other working folders)."""
        checkpoint, logged_in = checkpoint.absolute(), logged_in.absolute()
        self._write(
            {"step": step, "resumed": str(checkpoint), "logged_in": str(logged_in), "last_here": last_here}
        )
        start = f"{self.path} resumes at step {step} from {checkpoint}"
        if last_here == 0:  # this folder logged nothing before
            self.note(f"{start}; the steps before it are in {logged_in}")
        else:
            where = f"; its steps after {last_here} are there" if last_here < step else ""
            self.note(f"{start}, whose steps {logged_in} logged{where}")

    def note(self, line: str) -> None:
        self._say(f"tokshard: {line}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
