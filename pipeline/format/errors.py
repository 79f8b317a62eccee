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
