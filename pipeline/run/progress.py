"""Progress of long work: a live bar on a terminal, plain periodic lines elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from pipeline.storage.locations import shown_location


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 partition``, ``2 partitions``: a count and its noun as a log line says them."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def stderr_log(msg: str, prefix: str = "tokshard") -> None:
    """A log line for a person: stderr, flushed at once, named after the command; a URL's
    user:password in it shown as ``***``."""
    print(f"{prefix}: {shown_location(msg)}", file=sys.stderr, flush=True)


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


#: what a progress line says in place of a rate and an ETA while no worker is connected
WAITING = "waiting for workers"


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
        self._idle = 0.0  # seconds spent with no worker to run a task, left out of the rate
        self._waiting_since: float | None = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[tokens]} tokens, {task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(
                label, total=self.total, completed=done, tokens="0", rate="- tok/s"
            )
            self._bar.start()

    def waiting(self, waiting: bool) -> None:
        """Whether no worker is there to run a task now: the lines then say so instead of a rate
        and an ETA (a rate averaged over the time nobody worked fell and fell, and its ETA grew,
        as if the run were slow rather than stopped), and that time is left out of the rate."""
        now = time.monotonic()
        if waiting and self._waiting_since is None:
            self._waiting_since = now
        elif not waiting and self._waiting_since is not None:
            self._idle += now - self._waiting_since
            self._waiting_since = None

    @property
    def is_waiting(self) -> bool:
        return self._waiting_since is not None

    def _working_seconds(self) -> float:
        now = time.monotonic()
        return now - self.start - self._idle - (now - self._waiting_since if self.is_waiting else 0.0)

    def rate(self) -> float:
        """Tokens per second of the time workers were there (0 while none is)."""
        elapsed = self._working_seconds()
        if self.is_waiting or elapsed <= 0:
            return 0.0
        return (self.tokens - self.start_tokens) / elapsed

    def eta(self) -> float | None:
        """Seconds left at the rate seen so far (None while no worker is there: unknown)."""
        elapsed = self._working_seconds()
        gained = self.done - self.start_done
        if self.is_waiting or gained <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / gained

    def _rate_text(self) -> str:
        if self.is_waiting:
            return WAITING
        return f"{human(self.rate())} tok/s, ETA {eta_text(self.eta())}"

    def update(self, done: int, tokens: int) -> None:
        self.done, self.tokens = min(done, self.total), tokens
        if self._bar is not None:
            rate = WAITING if self.is_waiting else f"{human(self.rate())} tok/s"
            self._bar.update(self._task, completed=self.done, tokens=human(tokens), rate=rate)
            return
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self.interval:
            self._last_line = now
            self.line()

    def line(self) -> None:
        self._printed = (self.done, self.tokens)
        print(
            f"tokshard: {self.label}: {100 * self.done / self.total:5.1f}% of input, "
            f"{self.tokens:,} tokens, {self._rate_text()}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._printed != (self.done, self.tokens):
            self.line()
