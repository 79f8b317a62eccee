"""The one exception type that means "the user can fix this".

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps
its traceback. Stdlib only, so the shard reader and the trainer can raise it too.
"""

from __future__ import annotations

import argparse
import os


class TokshardError(Exception):
    """A user-facing failure: say what went wrong, where, and what to do."""

    exit_code = 2


class DataError(TokshardError):
    """An input or output file holds bad data (corrupt, truncated, changed): exit 1, as for any
    fault in the data rather than in the command line. Usage mistakes (flags, paths of the
    wrong kind, configs) keep exit 2, so a script can tell "fix the command" from "fix or
    re-make the data"."""

    exit_code = 1


class VerifyError(DataError):
    """Data on disk does not match its manifest (exit 1, like a failed check)."""


def empty_option(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> str | None:
    """The first of ``parser``'s arguments given as an empty (or blank) string, by its name.

    ``--out ""`` or ``--split " "`` is never a usable path or name; a parser refuses it at once,
    as a usage error, instead of a later stage failing on it."""
    for action in parser._actions:
        value = getattr(namespace, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            return "/".join(action.option_strings) or action.metavar or action.dest
    return None


def _is_url(text: str) -> bool:
    return "://" in text


def folder_arg(text: str) -> str:
    """An argparse type for a folder a command writes or reads: an existing file is refused at
    once (exit 2), not when the command gets to it. URLs pass unchanged."""
    if text.strip() and not _is_url(text) and os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file; this names a folder")
    return text


def file_arg(text: str) -> str:
    """An argparse type for a file: an existing folder is refused at once (exit 2)."""
    if text.strip() and not _is_url(text) and os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; this names a file")
    return text
