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
import errno
import functools
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from pipeline.format.atomic import file_size_limit
from pipeline.format.errors import TokshardError, locale_cannot_name, names_files_in_utf8, shown_name
from pipeline.storage.locations import shown_location
from tokshard.usage import OneLineParser
from trainer.console import StdoutUnwritable

T = TypeVar("T")

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
    #: what the line of a run stopped by Ctrl-C (or SIGTERM, SIGHUP) says after it: what the
    #: stop left and what a rerun does
    after_stop: str = "nothing was changed"
    #: what words the command's parser did not take may mean, said instead of argparse's
    #: "unrecognized arguments" where it knows better (it returns to let that be said)
    stray_words: Callable[[argparse.Namespace, list[str]], None] | None = None

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
        with stopping_signals_raise():
            return self.run(args)


#: the exit status of a command stopped by Ctrl-C (a shell's 128 + signal)
INTERRUPTED = 128 + signal.SIGINT
#: the signals that stop a command as Ctrl-C does, each as its one line names it: a job's time
#: limit or ``kill``, and the terminal a run was started from closing (an ssh session lost)
STOPPING = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP (its terminal closed)"}


class Terminated(BaseException):
    """A `STOPPING` signal as an exception of the main thread: a command stops as on Ctrl-C
    (workers closed, committed work kept) and says so in one line, where the default would
    end it without a word. A BaseException, so that no ``except Exception`` on the way
    swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def what(self) -> str:
        return f"stopped by {STOPPING[self.signum]}"


def stopped_before_start(stop: KeyboardInterrupt | Terminated) -> int:
    """Say that a stop came before the command did anything; its exit status."""
    if isinstance(stop, Terminated):
        print(f"tokshard: {stop.what} before it started", file=sys.stderr)
        return stop.exit_code
    print("tokshard: interrupted before it started", file=sys.stderr)
    return INTERRUPTED


#: how soon a signal that arrived inside a finalizer is sent again (see `_terminated`)
RESEND_SECONDS = 0.05


def _terminated(signum: int, frame: FrameType | None) -> None:
    """Raise `Terminated`, unless the signal arrived inside a finalizer (a ``__del__``, where
    Dask releases its futures, or a ``weakref.finalize`` callback), where Python prints the
    exception and drops it, and the run would go on: there the signal is sent again a moment
    later, to be taken outside it."""
    if in_a_finalizer(frame):
        _send_again(signum)
        return
    raise Terminated(signum)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Python's own Ctrl-C handler (KeyboardInterrupt), but for a signal inside a finalizer,
    which `_terminated` says why to send again."""
    if in_a_finalizer(frame):
        _send_again(signum)
        return
    raise KeyboardInterrupt


def _signal_raised_where_python_drops_it(hook_before: Callable[[Any], None], unraisable: Any) -> None:
    """`sys.unraisablehook` while a command runs: a stop raised where Python prints an exception
    and drops it (an at-fork hook such as logging's, which runs inside every fork; any place
    `in_a_finalizer` does not name) is sent again, to be taken outside it; anything else goes to
    the hook there was."""
    exc = unraisable.exc_value
    if isinstance(exc, Terminated):
        _send_again(exc.signum)
    elif isinstance(exc, KeyboardInterrupt):
        _send_again(signal.SIGINT)
    else:
        hook_before(unraisable)


def _send_again(signum: int) -> None:
    timer = threading.Timer(RESEND_SECONDS, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def in_a_finalizer(frame: FrameType | None) -> bool:
    """Inside a ``__del__``, a `weakref.finalize` callback, or importlib's callback that drops a
    module's lock (a weakref callback too, run as a lazy import ends): Python prints what each
    raises and drops it."""
    while frame is not None:
        code = frame.f_code
        if (
            code.co_name == "__del__"
            or code.co_filename.endswith(f"{os.sep}weakref.py")
            or (code.co_filename == "<frozen importlib._bootstrap>" and code.co_name == "cb")
        ):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stopping_signals_raise() -> Iterator[None]:
    """Within the block, each `STOPPING` signal raises `Terminated`, and Ctrl-C
    KeyboardInterrupt as ever, wherever they arrive (only the main thread handles signals;
    elsewhere nothing changes); the previous handlers are back afterwards. A signal the command
    was started ignoring stays ignored: under ``nohup`` a closed terminal must not stop the run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, _terminated)
        for signum in STOPPING
        if signal.getsignal(signum) is signal.SIG_DFL
    }
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupted)
    hook_before = sys.unraisablehook
    sys.unraisablehook = functools.partial(_signal_raised_where_python_drops_it, hook_before)
    try:
        yield
    finally:
        sys.unraisablehook = hook_before
        for signum, handler in previous.items():
            signal.signal(signum, handler)


#: what the system answers for a path it will not even look at, and what the user can do
PATH_REFUSALS = {
    errno.ENAMETOOLONG: "choose a shorter path",
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "choose a writable place",
    errno.ENOTDIR: "a part of it is a file, not a folder; check the path",
    errno.ELOOP: "a symbolic link on it leads back to itself; fix the link",
}


def path_refused(exc: OSError) -> TokshardError | None:
    """An `OSError` that escaped a command for a path the system refused outright (too long, not
    permitted, a file where a folder should be) as one line naming that path; None for any
    other, which stays a bug's traceback. Asking whether such a path exists already fails
    (`pathlib` answers only "no such file" itself), so the class is caught here once rather
    than at each place a command looks at a path it was given."""
    if exc.filename is None or exc.errno not in PATH_REFUSALS:
        return None
    path = exc.filename if isinstance(exc.filename, str) else os.fsdecode(exc.filename)
    shown = path if len(path) <= 1000 else f"{path[:600]}...{path[-200:]} ({len(path)} characters)"
    return TokshardError(f"cannot use {shown}: {exc.strerror}; {PATH_REFUSALS[exc.errno]}")


#: tokshard's own packages: an import of one of them that fails mid-command is code that changed
OWN_PACKAGES = ("pipeline", "trainer", "tokshard")


#: when this process started (its own clock): a module of tokshard's changed since is an upgrade
#: under the running command
STARTED = time.time()


def code_changed_under(exc: ImportError) -> TokshardError | None:
    """An import of tokshard's own code that fails while a command runs (None for any other):
    its modules load as first used, so an upgrade or checkout under a long run mixes old ones
    with new ("cannot import name X" after a finished prepare had written its manifest). What
    the command finished is on disk, and a rerun, all in the new code, goes on from it. Where
    the module is no newer than the command, the installation itself is broken: a rerun would
    fail the same way, so that is said instead."""
    name = exc.name or ""
    if name.split(".", 1)[0] not in OWN_PACKAGES:
        return None
    if _changed_since_start(exc.path or _module_file(name)):
        return TokshardError(
            f"tokshard's code changed on disk while this command ran ({name}: {exc}; an upgrade or "
            "checkout under a running command?); what it finished is kept: run the same command again"
        )
    return TokshardError(
        f"tokshard's installation is broken ({name}: {exc}); reinstall tokshard (or check out a whole "
        "commit), then run the same command again"
    )


def _module_file(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec else None


def _changed_since_start(path: str | None) -> bool:
    try:
        return path is not None and os.stat(path).st_mtime >= STARTED
    except OSError:  # gone since: changed
        return True


def open_files_exhausted(exc: BaseException) -> TokshardError | None:
    """Too many open files met anywhere, in ``exc`` or what it was raised from (Dask wraps its
    nannies' in "Nanny failed to start"), as one line naming the limit; None for anything else.
    A prepare checks the limit it needs first (`pipeline.run.process_limits`); this is for what
    a run opens beyond it, and for the other commands."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        said = str(exc)  # C++ libraries' own errors (torch's DistNetworkError) carry only the name
        if (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)) or (
            not isinstance(exc, OSError) and ("EMFILE" in said or "ENFILE" in said)
        ):
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            which = (
                "the system"
                if getattr(exc, "errno", None) == errno.ENFILE or "ENFILE" in said
                else "this process"
            )
            return TokshardError(
                f"too many open files for {which} (ulimit -n is {soft}): raise it (ulimit -n 4096) and rerun"
            )
        exc = exc.__cause__ or exc.__context__
    return None


def no_temporary_folder(exc: BaseException) -> TokshardError | None:
    """Python's ``tempfile`` finding no folder it can write a file in, met anywhere in ``exc``
    or what it was raised from (torch and its libraries write one as they load: `train`'s
    options did, in a traceback), as one line naming the cause and what to do; None for
    anything else. Under ``ulimit -f 0`` no file can hold a byte, wherever it goes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        said = getattr(exc, "strerror", None) or ""
        if isinstance(exc, FileNotFoundError) and said.startswith(_NO_TEMPORARY_FOLDER):
            tried = said.removeprefix(_NO_TEMPORARY_FOLDER).strip(" []").replace("'", "")
            if file_size_limit() == 0:
                cause, remedy = (
                    "this process's file size limit is 0 bytes (ulimit -f 0)",
                    "raise it (ulimit -f unlimited)",
                )
            else:
                cause, remedy = (
                    "each is missing, not writable or full",
                    "set TMPDIR to a folder you can write",
                )
            return TokshardError(
                f"no temporary folder can be written (TMPDIR, /tmp, /var/tmp, /usr/tmp, the current "
                f"folder; tried {tried}): {cause}; {remedy} and rerun"
            )
        exc = exc.__cause__ or exc.__context__
    return None


#: how Python's ``tempfile`` says it found no folder it can write in (its only such error)
_NO_TEMPORARY_FOLDER = "No usable temporary directory found in"


def locale_refused(exc: UnicodeEncodeError) -> TokshardError | None:
    """A name or a text that escaped a command because the locale cannot encode it (a recipe's
    non-ASCII path, a folder's non-ASCII file names under LC_ALL=C with PYTHONUTF8=0), as one
    line naming the locale, wherever it was met; None under a UTF-8 locale (a bug then)."""
    if names_files_in_utf8() or not isinstance(exc.object, str):
        return None
    text = shown_name(exc.object)
    return locale_cannot_name(f"'{text}'" if len(text) <= 200 else f"'{text[:200]}...'")


def current_folder_gone() -> TokshardError | None:
    """The current folder, if it was removed under the shell (``rm -r`` of a run folder from
    another terminal, a scratch folder a job cleaned): every relative path, Dask's start and
    torch's own libraries fail on it, each in a traceback of its own, after some of them have
    written; said in one line before the command does anything. None where it exists."""
    try:
        os.getcwd()
    except FileNotFoundError:
        try:
            where = f" ({os.readlink('/proc/self/cwd').removesuffix(' (deleted)')})"
        except OSError:  # not Linux
            where = f" ({os.environ['PWD']})" if os.environ.get("PWD") else ""
        return TokshardError(
            f"the current folder{where} no longer exists; cd to a folder that exists and rerun"
        )
    return None


def error_line(exc: TokshardError) -> str:
    """How a command says its error: one line, even where a library's text inside the message
    (a parser's, the hub client's) runs to several, since a user or a log search reads the last
    line of a failed command alone. A URL's user:password in it (a library's message may echo
    one) is shown as ``***``."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"tokshard: error: {shown_location(text)}"


def each_path(paths: list[str], do: Callable[[str], T]) -> tuple[list[T], int]:
    """``do`` on each of the paths a command was given (``runs/*/`` as the shell expands it):
    of several, one that fails is said in its one line and the rest still done; a single one's
    failure is the command's own, raised as usual. Returns what the others gave, and the worst
    exit status of those that failed (0 if none did)."""
    if len(paths) == 1:
        return [do(paths[0])], 0
    done, worst = [], 0
    for path in paths:
        try:
            done.append(do(path))
        except StdoutUnwritable:  # the output's fault, not this path's: the others would fail as well
            raise
        except TokshardError as exc:
            print(error_line(exc), file=sys.stderr)
            worst = max(worst, exc.exit_code)
    return done, worst
