"""``tokshard status DIR...``: its options and output (``pipeline.run.status`` reads the run)."""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.format.errors import TokshardError
from tokshard.commands.command import Command
from tokshard.usage import folder_arg


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        nargs="+",
        type=folder_arg,
        help="the --out folder of a prepare run; several (runs/*/, as the shell expands it) are each read",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (for several folders, a list in their order)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.run.status import render, status

    if len(args.dir) == 1:
        found, code = [status(args.dir[0])], 0
    else:
        found, code = _each_status(args.dir, status)
    if args.json:
        print(json.dumps(found if len(args.dir) > 1 else found[0], indent=1))
    elif found:
        print("\n\n".join(render(s) for s in found))
    return code


def _each_status(folders: list[str], status) -> tuple[list[dict], int]:
    """Each folder's status; one that cannot be read is said in its line and the rest still
    read (the exit status is the worst of theirs)."""
    found, code = [], 0
    for folder in folders:
        try:
            found.append(status(folder))
        except TokshardError as exc:
            print(f"tokshard: error: {exc}", file=sys.stderr)
            code = max(code, exc.exit_code)
    return found, code


COMMAND = Command(
    name="status",
    summary="what a prepare folder has done, is doing, and what a rerun would do",
    example="tokshard status data/wt103",
    add_options=add_options,
    run=run,
)
