"""The one exception type that means "the user can fix this", and the argparse pieces that
turn a usage mistake into it.

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps
its traceback. Stdlib only, so the shard reader and the trainer (whose own command line,
``python -m trainer``, parses with `OneLineParser` too) can raise it.
"""

from __future__ import annotations

import argparse


class TokshardError(Exception):
    """A user-facing failure: say what went wrong, where, and what to do."""

    exit_code = 2


class VerifyError(TokshardError):
    """Data on disk does not match its manifest (exit 1, like a failed check)."""

    exit_code = 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line like every other tokshard error."""

    def error(self, message: str):
        command = self.prog.removeprefix("tokshard").strip()
        raise TokshardError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (expected a number >= 1), got {value}")
    return value
