"""The console (stdout) of training and of the commands that read a run: a reader may leave.

``tokshard train ... | head``, ``tokshard samples ... | less`` quit early: what is left to
print then goes nowhere, quietly. A training run goes on (its record is metrics.jsonl, not
the console); a command that only prints has nothing more to do.
"""

from __future__ import annotations

import os
import select
import sys


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
