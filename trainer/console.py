"""The console (stdout, stderr) of every command: a reader may leave, and the place it goes
may fail. Neither changes what a command does or the status it exits with.

``tokshard verify ... | head -1``, ``tokshard prepare ... 2>&1 | head``: the reader quits early.
While a command runs, stdout is `CheckedStdout`: what is left to print goes to /dev/null
(`reader_gone`), and the command goes on to its end and its own exit status (a verify that
found a fault still exits 1; a prepare still writes its manifest). A command whose output is
all it makes may stop early once `reader_left` says so. stderr is `ForgivingStderr`: its lines
are for a person, and a failure to write them is never the command's failure.

``tokshard inspect DIR > report.txt`` on a full disk (or a quota, or ``> /dev/full``): a write
fails with an `OSError` that names no file, and Python drops what it could not write:
`CheckedStdout` raises `StdoutUnwritable`, one line for a command; a training run goes on
without its console (`trainer.metrics`).

``tokshard verify DIR >&-``, ``tokshard prepare ... 2>&-``: a stream closed before the command
started is /dev/null (`closed_streams_to_devnull`), as for a reader that left.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

from pipeline.format.errors import TokshardError


def closed_streams_to_devnull() -> None:
    """Give a command started with stdout or stderr closed (``>&-``, ``2>&-``; Python then
    sets ``sys.stdout`` or ``sys.stderr`` to None) /dev/null in its place, before it does
    anything: what it prints is dropped and its work done. The descriptor itself is taken too,
    so that neither a file opened later (a shard, a manifest) lands on 1 or 2, where a worker's
    or a library's console lines would go into it, nor a worker started inherits a closed one."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != fd and not _is_open(fd):
            os.dup2(devnull, fd)
            os.close(devnull)
            devnull = fd
        setattr(sys, name, os.fdopen(devnull, "w"))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def forgive_stderr() -> None:
    """Make ``sys.stderr`` a `ForgivingStderr` for the rest of the process, from its start:
    a command's last line (its error, or that it was stopped) is written after its console
    guard ends, and a failure to write it there (``2>/dev/full``) raised out of the command,
    whose exit status became 1 whatever the line would have said."""
    if not isinstance(sys.stderr, ForgivingStderr):
        sys.stderr = ForgivingStderr(sys.stderr)


class StdoutUnwritable(TokshardError):
    """Standard output failed a write (not a reader that quit: that is `BrokenPipeError`)."""

    def __init__(self, exc: OSError) -> None:
        self.reason = exc.strerror or str(exc)
        super().__init__(
            f"cannot write to standard output ({self.reason}); send it elsewhere, or free space where it goes"
        )


class ReportLost(StdoutUnwritable):
    """Standard output failed the report of work already done: the line says what was done,
    so that no one takes it for a failed run (and a rerun refused for the output it finds there
    for a mystery)."""

    def __init__(self, done: str, reason: str) -> None:
        self.reason = reason
        TokshardError.__init__(  # not StdoutUnwritable's line, which says nothing was done
            self,
            f"{done}, but its report could not be written to standard output ({self.reason}); "
            "send it elsewhere, or free space where it goes",
        )


@contextlib.contextmanager
def reporting(done: str) -> Iterator[None]:
    """The lines printed inside report work already done (``done``: what was written, where,
    as "wrote DIR/manifest.json"): a standard output that fails them, flushed here, raises
    `ReportLost`, whose line says the work stands and only its report was lost."""
    try:
        yield
        sys.stdout.flush()
    except StdoutUnwritable as exc:
        raise ReportLost(done, exc.reason) from exc


class _Console:
    """A console stream whose failed writes go to `_failed` (the rest is the stream's own)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        raise exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class CheckedStdout(_Console):
    """``sys.stdout`` whose reader may quit (`reader_gone`, then quiet) and whose failed writes
    raise `StdoutUnwritable`."""

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, BrokenPipeError):
            _reader_quit()
        elif isinstance(exc, OSError):
            raise StdoutUnwritable(exc) from exc
        else:
            raise exc


class ForgivingStderr(_Console):
    """``sys.stderr`` that never fails a command: once a write fails (its reader quit, a full
    disk, a closed stream), it and what follows go to /dev/null."""

    def _failed(self, exc: Exception) -> None:
        _to_devnull(self._stream)


_left = {"stdout": False}


def reader_left() -> bool:
    """Whether stdout's reader has quit during this command (what it prints goes nowhere)."""
    return _left["stdout"]


def _reader_quit() -> None:
    _left["stdout"] = True
    reader_gone()


def _to_devnull(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null, and drop what it holds (it failed to go)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
        stream.flush()


@contextlib.contextmanager
def guarded_console() -> Iterator[None]:
    """stdout a `CheckedStdout` and stderr a `ForgivingStderr` inside, what they were after;
    each writes what its encoding cannot hold as an escape (`escaping_what_cannot_be_encoded`)."""
    out, err = sys.stdout, sys.stderr
    with escaping_what_cannot_be_encoded(out), escaping_what_cannot_be_encoded(err):
        sys.stdout, sys.stderr = CheckedStdout(out), ForgivingStderr(err)
        _left["stdout"] = False
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def escaping_what_cannot_be_encoded(stream: Any) -> Iterator[None]:
    """A character the stream's encoding lacks (``é`` in a document, on a console that is ASCII
    or Latin-1 by ``PYTHONIOENCODING`` or an old locale) or cannot hold at all (a file name's
    undecodable byte, a lone surrogate) is written as its escape, ``\\xe9``: the line still says
    what and where, where a strict stream raised and lost the command's whole output."""
    errors = getattr(stream, "errors", None)
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is None or errors == "backslashreplace":
        yield
        return
    reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):  # a stream closed meanwhile keeps its state
            reconfigure(errors=errors)


def reader_gone() -> int:
    """Point stdout at /dev/null once its reader has quit; returns the exit status of a
    command that has nothing more to say (0: nothing went wrong). Without this, every later
    line, and Python's flush at exit, would fail again (a traceback on stderr)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def stdout_reader_left() -> bool:
    """Whether stdout is a pipe whose reader has closed it: a `BrokenPipeError` raised for
    anything else (a worker's socket, a subprocess) is a failure, not a reader that quit."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # stdout closed or not a file
        return False
