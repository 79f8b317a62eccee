"""The argparse pieces both command lines share (`tokshard ...` and ``python -m trainer``):
a usage mistake becomes one `TokshardError` line, and whole numbers >= 1 are checked once."""

from __future__ import annotations

import argparse

from pipeline.format.errors import TokshardError


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
