"""The `tokshard` command: its parser, built from the command modules (``tokshard/commands/``),
and the exit code each way a command can end.

User mistakes raise `TokshardError` and end as one line on stderr with its exit code (1 for bad
data, 2 for bad usage); Ctrl-C, SIGTERM and SIGHUP end in one line too, and so does a path the
system refuses outright (`path_refused`). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection

from pipeline import __version__
from pipeline.format.errors import TokshardError
from pipeline.run.process_limits import processes_exhausted
from tokshard.commands import (
    demo,
    inspect,
    megatron_args,
    plot,
    prepare,
    samples,
    status,
    tokenizer,
    train,
    verify,
)
from tokshard.commands.command import (
    INTERRUPTED,
    Command,
    Terminated,
    code_changed_under,
    error_line,
    locale_refused,
    no_temporary_folder,
    open_files_exhausted,
    path_refused,
    stopped_before_start,
    stopping_signals_raise,
)
from tokshard.usage import OneLineParser
from trainer.console import StdoutUnwritable, guarded_console, reader_gone, stdout_reader_left

#: every command, in the order ``tokshard --help`` lists them
COMMANDS: tuple[Command, ...] = tuple(
    module.COMMAND
    for module in (prepare, tokenizer, status, verify, inspect, train, samples, megatron_args, plot, demo)
)
EXAMPLE = "tokshard demo --out demo-out   # the whole job on a small built-in corpus, offline"


def build_parser(options_of: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``options_of``, only those commands get their options
    (the rest are listed by name and summary): describing ``train`` loads torch, which no other
    command needs."""
    parser = OneLineParser(
        prog="tokshard",
        description="Tokenize corpora on CPU nodes into memory-mapped shards; train on them with DeepSpeed.",
        epilog=f"example:\n  {EXAMPLE}\n\nRun `tokshard COMMAND --help` for a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tokshard {__version__}")
    # launchers that start a module put this before the command (`python -m tokshard
    # --local_rank=0 train ...`); LOCAL_RANK in the environment says the same
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = commands.add_parser(command.name, help=command.summary, **command.parser_settings())
        if options_of is None or command.name in options_of:
            command.add_options(p)
        p.set_defaults(
            run=command.run, after_stop=command.after_stop, stray_words=command.stray_words, usage=p
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # `train`'s options load torch: a job stopped then is named too; --help and --version
        # write through the guarded console, and flush inside it, as every command does
        with stopping_signals_raise(), guarded_console():
            try:
                args, rest = build_parser(options_of=_command_in(argv)).parse_known_args(argv)
                if rest:
                    if args.stray_words is not None:
                        args.stray_words(args, rest)
                    args.usage.unrecognized(rest)
            except SystemExit as exc:  # --help, --version
                sys.stdout.flush()
                return int(exc.code or 0)
    except StdoutUnwritable as exc:  # `--help > /dev/full`
        reader_gone()
        return _failed(exc)
    except TokshardError as exc:
        return _failed(exc)
    except OSError as exc:  # `train`'s options load torch, which writes a temporary file
        refused = no_temporary_folder(exc)
        if refused is None:
            raise
        return _failed(refused)
    except (KeyboardInterrupt, Terminated) as stop:  # nothing started yet
        return stopped_before_start(stop)
    try:
        with stopping_signals_raise(), guarded_console():  # a console that goes away: trainer.console
            status = args.run(args)
            sys.stdout.flush()  # a reader that quit shows here, not in Python's flush at exit
            return status
    except BrokenPipeError:  # stdout's own is taken in trainer.console; a write that went around it
        if not stdout_reader_left():
            raise
        return reader_gone()
    except StdoutUnwritable as exc:  # `> file` on a full disk: Python has dropped what failed
        reader_gone()
        return _failed(exc)
    except TokshardError as exc:
        return _failed(exc)
    except OSError as exc:  # after the pipe and disk-full cases above, which are OSErrors too
        refused = (
            path_refused(exc)
            or open_files_exhausted(exc)
            or processes_exhausted(exc)
            or no_temporary_folder(exc)
        )
        if refused is None:
            raise
        return _failed(refused)
    except ImportError as exc:  # tokshard's own code changed under a long run (an upgrade)
        refused = code_changed_under(exc)
        if refused is None:
            raise
        return _failed(refused)
    except RuntimeError as exc:  # a library's own wrapping of too many open files, or threads
        refused = open_files_exhausted(exc) or processes_exhausted(exc)
        if refused is None:
            raise
        return _failed(refused)
    except UnicodeEncodeError as exc:  # a name the locale cannot take, met anywhere
        refused = locale_refused(exc)
        if refused is None:
            raise
        return _failed(refused)
    except KeyboardInterrupt:
        print(f"tokshard: interrupted; {args.after_stop}", file=sys.stderr)
        return INTERRUPTED
    except Terminated as stop:
        print(f"tokshard: {stop.what}; {args.after_stop}", file=sys.stderr)
        return stop.exit_code


def _command_in(argv: list[str]) -> set[str]:
    """The command ``argv`` runs, as a set of none or one name: the first word naming one
    (what may come before it, ``--local_rank N``, never names a command)."""
    names = {command.name for command in COMMANDS}
    first = next((word for word in argv if word in names), None)
    return {first} if first else set()


def _failed(exc: TokshardError) -> int:
    print(error_line(exc), file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
