"""Progress of long work: a live bar on a terminal, plain periodic lines elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

from pipeline.storage.locations import shown_location


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

#: finished partitions a `CostModel` needs before it fits, and how much larger its largest must
#: be than its smallest: partitions of (nearly) one size cannot tell a fixed cost from a rate
FIT_MIN_PARTITIONS = 4
FIT_MIN_SPREAD = 2.0


@dataclass
class CostModel:
    """A partition's working seconds as ``fixed + per_byte * size``, fitted by least squares to
    the partitions finished so far (their sizes and busy seconds). Each task pays a fixed cost
    (opening, committing, sealing its shards, fsyncs) whatever its size, so an ETA from bytes
    alone, learned on the large partitions that run first, reads far short on a tail of small
    ones. Sums are kept centred (Welford), so each partition costs O(1) and sizes of very
    different magnitudes do not cancel out."""

    n: int = 0
    mean_size: float = 0.0
    mean_seconds: float = 0.0
    size_spread: float = 0.0  # sum of (size - mean_size)**2
    co_spread: float = 0.0  # sum of (size - mean_size) * (seconds - mean_seconds)
    smallest: int = 0
    largest: int = 0

    def add(self, size: int, seconds: float) -> None:
        """One finished partition (one without input or without a recorded time says nothing)."""
        if size <= 0 or seconds <= 0:
            return
        self.n += 1
        dx = size - self.mean_size
        self.mean_size += dx / self.n
        self.mean_seconds += (seconds - self.mean_seconds) / self.n
        self.size_spread += dx * (size - self.mean_size)
        self.co_spread += dx * (seconds - self.mean_seconds)
        self.smallest = size if self.n == 1 else min(self.smallest, size)
        self.largest = max(self.largest, size)

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_byte)`` seconds, neither negative, or None while the partitions finished
        are too few or too alike in size to tell the two apart."""
        if self.n < FIT_MIN_PARTITIONS or self.largest < FIT_MIN_SPREAD * self.smallest:
            return None
        per_byte = self.co_spread / self.size_spread
        if per_byte <= 0:  # larger ones took no longer: the fixed cost is all that shows
            return self.mean_seconds, 0.0
        fixed = self.mean_seconds - per_byte * self.mean_size
        if fixed < 0:  # no fixed cost to see: a rate through the origin
            squares = self.size_spread + self.n * self.mean_size**2
            return 0.0, (self.co_spread + self.n * self.mean_size * self.mean_seconds) / squares
        return fixed, per_byte


class Progress:
    """Tracks input consumed (its % and, with ``costs``, the ETA), partitions done (for the ETA)
    and tokens written (for tokens/s). ``partitions``: how many the run has, and
    ``partitions_done`` how many of them are done, each in-progress one as the fraction of its
    input read; ``costs``: what the finished ones cost (`finished`), for the ETA."""

    def __init__(
        self,
        total: int,
        done: int = 0,
        tokens: int = 0,
        stream: TextIO | None = None,
        interval: float = 10.0,
        label: str = "prepare",
        partitions: int = 0,
        partitions_done: float = 0.0,
        costs: CostModel | None = None,
    ) -> None:
        self.total = max(total, 1)
        self.partitions = partitions
        self.start_partitions = self.partitions_done = partitions_done
        self.costs = costs or CostModel()
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
            from rich.progress import BarColumn, TaskProgressColumn, TextColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[tokens]} tokens, {task.fields[rate]}"),
                TextColumn("{task.fields[eta]}"),  # the plain line's ETA, not rich's from bytes
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(
                label, total=self.total, completed=done, tokens="0", rate="- tok/s", eta=""
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
        """Seconds left at the pace seen so far (None while no worker is there: unknown): the
        work left over the work done per second, work modelled by `CostModel` once it fits
        (bytes until then, and a model of equal partitions is bytes too)."""
        elapsed = self._working_seconds()
        fixed, per_byte = (self.costs.fit() if self.partitions else None) or (0.0, 1.0)
        gained = fixed * (self.partitions_done - self.start_partitions) + per_byte * (
            self.done - self.start_done
        )
        if self.is_waiting or gained <= 0 or elapsed <= 0:
            return None
        left = fixed * (self.partitions - self.partitions_done) + per_byte * (self.total - self.done)
        return max(left, 0.0) * elapsed / gained

    def finished(self, size: int, seconds: float) -> None:
        """A partition of ``size`` input units finished, after ``seconds`` of work (all its
        attempts'): what the ETA learns each partition's cost from."""
        self.costs.add(size, seconds)

    def _rate_text(self) -> str:
        if self.is_waiting:
            return WAITING
        return f"{human(self.rate())} tok/s, ETA {eta_text(self.eta())}"

    def update(self, done: int, tokens: int, partitions_done: float | None = None) -> None:
        self.done, self.tokens = min(done, self.total), tokens
        if partitions_done is not None:
            self.partitions_done = min(partitions_done, float(self.partitions))
        if self._bar is not None:
            rate = WAITING if self.is_waiting else f"{human(self.rate())} tok/s"
            eta = "" if self.is_waiting else f"ETA {eta_text(self.eta())}"
            self._bar.update(self._task, completed=self.done, tokens=human(tokens), rate=rate, eta=eta)
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
