"""Whether a path the format reads holds a file, and what it holds where it does not.

Shards, indexes, sidecars and the tokenizer are read whole or memory-mapped, wherever a link
leads (a DVC or git-annex cache, another disk). A pipe there would wait forever on open, a
device never end, so each is looked at (one ``stat``) before it is opened. Stdlib only.
"""

from __future__ import annotations

import os
import stat

from pipeline.format.errors import DataError

#: what a path that is not a file is, by its type's test
NOT_A_FILE = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device"),
              (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


class NotAFileError(DataError):
    """A path the format reads holds something other than a file (exit 1, as damaged data)."""


def kind_of(mode: int) -> str:
    """``a pipe``, ``a folder``...: what a mode that is not a regular file's stands for."""
    return next((name for test, name in NOT_A_FILE if test(mode)), "not a file")


def not_a_file(path: str | os.PathLike) -> str | None:
    """What is at ``path`` where it is not a readable file (``missing`` where nothing is, a
    broken link included), else None. For a fault list, which names each and goes on."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    return None if stat.S_ISREG(mode) else kind_of(mode)


def require_file(path: str | os.PathLike) -> os.stat_result:
    """``path``'s stat where it holds a file (through any link); else NotAFileError in one line.
    Nothing there is the caller's ``FileNotFoundError``, as before any look."""
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode):
        return st
    through = f" (through a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    raise NotAFileError(
        f"{path} is {kind_of(st.st_mode)}{through}, not a file; tokshard reads it as a file: "
        "put the file itself there (or re-run `tokshard prepare` to make it again)"
    )
