"""`Command`: what every `tokshard` command module gives the command line, and how a run stops.

Each module of ``tokshard/commands/`` ends with one ``COMMAND``: its name, the line
``tokshard --help`` lists it by, an example, the function that adds its options and the one
that runs it. ``tokshard/cli.py`` builds the whole parser from these and maps errors to exit
codes; `Command.main` runs one command alone (scripts and tests), its mistakes raised as
``TokshardError`` instead of printed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tokshard.usage import OneLineParser

#: options are added to the command's own parser
AddOptions = Callable[[argparse.ArgumentParser], None]
#: runs the command on its parsed options; returns the exit status
Run = Callable[[argparse.Namespace], int]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; each option's argparse default shown after its help, except
    None and False ("(default: None)" says nothing: an option defaulting to None states what
    it falls back to itself, from that default's owner)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


@dataclass(frozen=True)
class Command:
    """One `tokshard` command: its name, its help, its options and its handler."""

    name: str
    #: one line: ``tokshard --help`` lists the command by it, and its own --help starts with it
    summary: str
    #: one or more command lines (comments between them start with #), shown at the end of
    #: the command's --help
    example: str
    add_options: AddOptions
    run: Run
    #: more about the command, below the summary in its own --help
    details: str = ""

    def parser_settings(self) -> dict[str, Any]:
        """The keyword arguments of the command's parser (``add_parser`` or a parser alone)."""
        heading = "examples" if "\n" in self.example else "example"
        return {
            "description": f"{self.summary}\n\n{self.details}" if self.details else self.summary,
            "epilog": f"{heading}:\n{textwrap.indent(self.example, '  ')}",
            "formatter_class": HelpFormatter,
        }

    def parser(self) -> argparse.ArgumentParser:
        """The command's parser on its own, as ``tokshard NAME`` would parse."""
        p = OneLineParser(prog=f"tokshard {self.name}", **self.parser_settings())
        self.add_options(p)
        return p

    def main(self, argv: list[str]) -> int:
        """Run ``tokshard NAME ARGV`` in this process; a mistake raises ``TokshardError``."""
        try:
            args = self.parser().parse_args(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        with sigterm_raises():
            return self.run(args)


#: the exit status of a command stopped by Ctrl-C, and by SIGTERM (a shell's 128 + signal)
INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM (a job's time limit, ``kill``) as an exception of the main thread: a command
    stops as on Ctrl-C (workers closed, committed work kept) and says so in one line, where
    the default would end it without a word. A BaseException, so that no ``except Exception``
    on the way swallows it."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (only the main thread handles signals;
    elsewhere nothing changes); the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
