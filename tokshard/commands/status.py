"""``tokshard status DIR...``: its options and output (``pipeline.run.status`` reads the run)."""

from __future__ import annotations

import argparse
import json

from tokshard.commands.command import Command, each_path
from tokshard.usage import run_folder_arg


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        nargs="+",
        type=run_folder_arg,
        help="the --out folder of a prepare run (or its manifest.json); several (runs/*/, as the shell expands it) are each read",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (for several folders, a list in their order)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.run.status import render, status

    found, code = each_path(args.dir, status)
    if args.json:
        print(json.dumps(found if len(args.dir) > 1 else found[0], indent=1))
    elif found:
        print("\n\n".join(render(s) for s in found))
    return code


COMMAND = Command(
    name="status",
    summary="what a prepare folder has done, is doing, and what a rerun would do",
    example="tokshard status data/wt103",
    add_options=add_options,
    run=run,
)
