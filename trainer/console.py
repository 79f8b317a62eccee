"""The console (stdout) of training and of the commands that read a run: a reader may leave,
and the place it goes may fail.

``tokshard train ... | head``, ``tokshard samples ... | less`` quit early: what is left to
print then goes nowhere, quietly. A training run goes on (its record is metrics.jsonl, not
the console); a command that only prints has nothing more to do.

``tokshard inspect DIR > report.txt`` on a full disk (or a quota, or ``> /dev/full``): a write
fails with an `OSError` that names no file, and Python drops what it could not write. While a
command runs, stdout is `CheckedStdout`, which raises `StdoutUnwritable` instead: one line for
a command, and for a training run one line saying it goes on without its console.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import TokshardError


class StdoutUnwritable(TokshardError):
    """Standard output failed a write (not a reader that quit: that is `BrokenPipeError`)."""

    def __init__(self, exc: OSError) -> None:
        self.reason = exc.strerror or str(exc)
        super().__init__(
            f"cannot write to standard output ({self.reason}); send it elsewhere, or free space where it goes"
        )


class CheckedStdout:
    """``sys.stdout`` whose failed writes raise `StdoutUnwritable` (`BrokenPipeError` as it is)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutUnwritable(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutUnwritable(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def checked_stdout() -> Iterator[None]:
    """``sys.stdout`` is a `CheckedStdout` inside, and what it was again after."""
    stream = sys.stdout
    sys.stdout = CheckedStdout(stream)
    try:
        yield
    finally:
        sys.stdout = stream


def reader_gone() -> int:
    """Point stdout at /dev/null once its reader has quit; returns the exit status of a
    command that has nothing more to say (0: nothing went wrong). Without this, every later
    line, and Python's flush at exit, would fail again (a traceback on stderr)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def stdout_reader_left() -> bool:
    """Whether stdout is a pipe whose reader has closed it: a `BrokenPipeError` raised for
    anything else (a worker's socket, a subprocess) is a failure, not a reader that quit."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # stdout closed or not a file
        return False
