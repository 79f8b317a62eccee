"""``tokshard status DIR``: its options and output (``pipeline.run.status`` reads the run)."""

from __future__ import annotations

import argparse
import json

from tokshard.commands.command import Command
from tokshard.usage import folder_arg


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=folder_arg, help="the --out folder of a prepare run")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from pipeline.run.status import render, status

    s = status(args.dir)
    print(json.dumps(s, indent=1) if args.json else render(s))
    return 0


COMMAND = Command(
    name="status",
    summary="what a prepare folder has done, is doing, and what a rerun would do",
    example="tokshard status data/wt103",
    add_options=add_options,
    run=run,
)
