"""The `tokshard` console script. Loading the command line (numpy, each command's module)
takes a moment after the shell starts it: a Ctrl-C, SIGTERM or SIGHUP then ends in the one
line a command gives when stopped before it started, not Python's traceback or silence."""

from __future__ import annotations

from tokshard.commands.command import Terminated, stopped_before_start, stopping_signals_raise


def main() -> int:
    try:
        with stopping_signals_raise():
            from tokshard.cli import main as run_command
    except (KeyboardInterrupt, Terminated) as stop:
        return stopped_before_start(stop)
    return run_command()
