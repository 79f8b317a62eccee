"""Output to a reader that may leave: ``tokshard samples ... | head``, a pager quit early."""

from __future__ import annotations

import os
import sys


def reader_gone() -> int:
    """What a command returns when its stdout's reader quit: nothing is wrong and nothing
    more is said. Python would report the unflushed rest at exit (a traceback on stderr),
    so stdout is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0
