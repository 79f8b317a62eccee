"""``tokshard plot RUN_DIR``: its options and output (``trainer.report`` draws the run)."""

from __future__ import annotations

import argparse

from pipeline.storage.locations import refuse_url
from tokshard.commands.command import Command
from tokshard.usage import path_arg, png_arg


def add_options(p: argparse.ArgumentParser) -> None:
    from trainer.report import REPORT_FILE

    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        type=path_arg,
        help="a run's --run-dir (or --save) folder, or its metrics.jsonl",
    )
    p.add_argument(
        "--out", metavar="PNG", type=png_arg, help=f"where to write the PNG (default: RUN_DIR/{REPORT_FILE})"
    )
    p.add_argument("--title", help="the figure's title (default: the run folder)")


def run(args: argparse.Namespace) -> int:
    from trainer.console import reporting
    from trainer.report import describe, write_report

    refuse_url(args.run_dir, "RUN_DIR")
    refuse_url(args.out, "--out")
    report = write_report(args.run_dir, args.out, args.title)
    with reporting(f"drew {report['png']}"):
        print(describe(report))
    return 0


COMMAND = Command(
    name="plot",
    summary="draw a training run's loss, tokens/s and data wait (metrics.jsonl) into a PNG",
    example="tokshard plot ckpt            # the PNG goes beside ckpt/metrics.jsonl",
    add_options=add_options,
    run=run,
)
