"""The one exception type that means "the user can fix this".

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps
its traceback. Stdlib only, so the shard reader and the trainer can raise it too.
"""

from __future__ import annotations


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


def not_utf8(what: str, exc: UnicodeDecodeError) -> TokshardError:
    """A config file (a recipe, a DeepSpeed config) that is not UTF-8 text, as an editor or a
    shell saving UTF-16 writes it: say so and what to do, not the codec's message alone.
    (A UTF-8 byte-order mark, as Windows editors write, is read past by the callers.)"""
    return TokshardError(
        f"{what} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 "
        "(a UTF-16 file, as PowerShell's `>` writes, is the usual cause)"
    )
