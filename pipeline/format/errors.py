"""The one exception type that means "the user can fix this".

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps
its traceback. Stdlib only, so the shard reader and the trainer can raise it too.
"""

from __future__ import annotations

import codecs
import errno
import os
import sys


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


def name_too_long(exc: OSError) -> bool:
    """Whether ``exc`` is a filesystem refusing a name too long for it (ENAMETOOLONG): no file
    of that name can be there, so a reader takes it as absent (a run refused for it is then
    one that wrote nothing, taken back like any other), not as a file to delete."""
    return exc.errno == errno.ENAMETOOLONG


def not_utf8(what: str, exc: UnicodeDecodeError) -> TokshardError:
    """A config file (a recipe, a DeepSpeed config) that is not UTF-8 text, as an editor or a
    shell saving UTF-16 writes it: say so and what to do, not the codec's message alone.
    (A UTF-8 byte-order mark, as Windows editors write, is read past by the callers.)"""
    return TokshardError(
        f"{what} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 "
        "(a UTF-16 file, as PowerShell's `>` writes, is the usual cause)"
    )


def names_files_in_utf8() -> bool:
    """Whether this process names files in UTF-8. Not so in the C or POSIX locale with
    PYTHONUTF8=0 (ASCII): a non-ASCII name then arrives as lone surrogates, which every UTF-8
    writer (run.json, a Rust library's path) refuses, and a non-ASCII name from a file (a
    recipe) cannot be opened at all."""
    return codecs.lookup(sys.getfilesystemencoding()).name == "utf-8"


def shown_name(text: str) -> str:
    """A name as the user typed it, where this process holds its bytes as surrogates."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def locale_cannot_name(what: str) -> TokshardError:
    """Text this process's locale cannot take (see `names_files_in_utf8`): the locale is the
    cause, not the file, the folder or the data."""
    return TokshardError(
        f"{what} holds characters that this process's locale cannot take (it names files in "
        f"{sys.getfilesystemencoding()}: LC_ALL or LANG is not a UTF-8 locale, e.g. C with PYTHONUTF8=0); run "
        "under a UTF-8 locale (e.g. LC_ALL=C.UTF-8) or with PYTHONUTF8=1"
    )


def encodes_as_utf8(text: str) -> bool:
    """False for text holding lone surrogates: bytes this process could not decode (a name
    under a non-UTF-8 locale, or not UTF-8 at all)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_path(path: str | os.PathLike[str], what: str) -> str:
    """``path`` as a library that takes UTF-8 paths only (tokenizers, in Rust) needs it. A name
    this process holds as lone surrogates fails there with "surrogates not allowed", which a
    caller's handler would call an unwritable folder or a damaged file: said here instead, naming
    the cause (the locale, or a name that is not UTF-8)."""
    text = os.fspath(path)
    if not encodes_as_utf8(text):
        if not names_files_in_utf8():
            raise locale_cannot_name(f"{what} '{shown_name(text)}'")
        raise TokshardError(
            f"{what} '{shown_name(text)}': its path is not UTF-8 text, which the tokenizers library needs; "
            "rename it to UTF-8 (from Latin-1: convmv -f latin1 -t utf8 --notest NAME)"
        )
    return text


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 partition``, ``2 partitions``: a count and its noun as a log line says them."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def out_of_range(low: int, high: int) -> str:
    """How a number outside ``low .. high`` is said, by a flag's argparse type and by the check
    behind it alike: ``--max-token-length 0`` said ">= 1", then 1 was "out of range (2 ..)"."""
    return f"out of range ({low:,} .. {high:,})"
