"""Progress of long work: a live bar on a terminal, plain periodic lines elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 partition``, ``2 partitions``: a count and its noun as a log line says them."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def stderr_log(msg: str, prefix: str = "tokshard") -> None:
    """A log line for a person: stderr, flushed at once, named after the command."""
    print(f"{prefix}: {msg}", file=sys.stderr, flush=True)


def human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Tracks input consumed (for ETA) and tokens written (for tokens/s)."""

    def __init__(
        self,
        total: int,
        done: int = 0,
        tokens: int = 0,
        stream: TextIO | None = None,
        interval: float = 10.0,
        label: str = "prepare",
    ) -> None:
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.interval = interval
        self.label = label
        self.start = time.monotonic()
        self.start_done, self.start_tokens = done, tokens
        self.done, self.tokens = done, tokens
        self._last_line: float | None = None  # monotonic() has no fixed origin: never compare to 0
        self._bar = None
        self._printed: tuple[int, int] | None = None  # (done, tokens) of the last plain line
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[tokens]} tokens, {task.fields[rate]} tok/s"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(label, total=self.total, completed=done, tokens="0", rate="-")
            self._bar.start()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.start
        return (self.tokens - self.start_tokens) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        elapsed = time.monotonic() - self.start
        gained = self.done - self.start_done
        if gained <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / gained

    def update(self, done: int, tokens: int) -> None:
        self.done, self.tokens = min(done, self.total), tokens
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, tokens=human(tokens), rate=human(self.rate()))
            return
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self.interval:
            self._last_line = now
            self.line()

    def line(self) -> None:
        self._printed = (self.done, self.tokens)
        print(
            f"tokshard: {self.label}: {100 * self.done / self.total:5.1f}% of input, "
            f"{self.tokens:,} tokens, {human(self.rate())} tok/s, ETA {eta_text(self.eta())}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._printed != (self.done, self.tokens):
            self.line()
