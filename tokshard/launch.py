"""The `tokshard` console script (and ``python -m tokshard``).

Loading the command line (numpy, orjson, each command's module) takes a moment after the shell
starts it. A Ctrl-C, SIGTERM or SIGHUP meanwhile is noted, not raised: an exception raised
inside an import can crash a C extension's start-up (orjson's ends in a segfault) or be dropped
by importlib's own cleanup, and the command would then run on. Once the modules are loaded, a
noted stop ends in the one line a command gives when stopped before it started. A command
stopped while Rust works on a thread of its own (`pipeline.encoding.interruptible`) ends
without the interpreter's teardown, which that thread would abort.

Before anything else, a stdout or stderr closed at exec becomes /dev/null
(`trainer.console.closed_streams_to_devnull`), stderr one whose failed writes never change the
exit status (`trainer.console.forgive_stderr`), and a command run in a folder removed meanwhile
is refused in one line (`current_folder_gone`). A crash in native code (a SIGSEGV in a library's
Rust or C++) prints the Python stack of every thread (`faulthandler`), so a report can say where.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

from pipeline.encoding.interruptible import work_abandoned
from tokshard.commands.command import (
    STOPPING,
    Terminated,
    current_folder_gone,
    error_line,
    stopped_before_start,
)
from trainer.console import closed_streams_to_devnull, forgive_stderr

#: the signals noted while the command line loads (one left ignored, as under nohup, stays so)
NOTED = (signal.SIGINT, *STOPPING)


def main() -> int:
    closed_streams_to_devnull()
    faulthandler.enable()  # a crash in native code (SIGSEGV, SIGBUS) says where, on stderr
    forgive_stderr()
    if (gone := current_folder_gone()) is not None:
        print(error_line(gone), file=sys.stderr)
        return gone.exit_code
    noted: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, _frame: noted.append(signum))
        for signum in NOTED
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)
    }
    try:
        from tokshard.cli import main as run_command
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if noted:
        return stopped_before_start(
            KeyboardInterrupt() if noted[0] == signal.SIGINT else Terminated(noted[0])
        )
    status = run_command()
    if work_abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
