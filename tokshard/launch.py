"""The `tokshard` console script (and ``python -m tokshard``).

Loading the command line (numpy, each command's module) takes a moment after the shell starts
it: a Ctrl-C, SIGTERM or SIGHUP then ends in the one line a command gives when stopped before it
started, not Python's traceback or silence. A command stopped while Rust works on a thread of
its own (`pipeline.encoding.interruptible`) ends without the interpreter's teardown, which that
thread would abort.
"""

from __future__ import annotations

import os
import sys

from pipeline.encoding.interruptible import work_abandoned
from tokshard.commands.command import Terminated, stopped_before_start, stopping_signals_raise


def main() -> int:
    try:
        with stopping_signals_raise():
            from tokshard.cli import main as run_command
    except (KeyboardInterrupt, Terminated) as stop:
        return stopped_before_start(stop)
    status = run_command()
    if work_abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
