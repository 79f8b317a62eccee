"""``tokshard demo``: its options and the console lines around the run (``tokshard.demo``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.format.errors import utf8_path
from pipeline.storage.locations import refuse_url
from tokshard.commands.command import Command
from tokshard.demo import DEFAULT_SIZE, MAX_WORKERS, SIZES
from tokshard.usage import folder_arg, positive_int

#: where the demo writes unless told (a folder of the working directory)
DEFAULT_OUT = "demo-out"


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        type=folder_arg,
        default=DEFAULT_OUT,
        help="folder for everything the demo makes",
    )
    p.add_argument(
        "--size",
        choices=list(SIZES),
        default=DEFAULT_SIZE,
        help="; ".join(f"{name}: {size.about}" for name, size in SIZES.items()),
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help=f"local Dask worker processes for prepare (default: cores, at most {MAX_WORKERS})",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.run.cluster import check_local_workers
    from tokshard import demo
    from trainer.console import reporting

    refuse_url(args.out, "--out")
    utf8_path(args.out, "--out")  # its parquet and tokenizer writers take UTF-8 paths only: before any file
    check_local_workers(args.workers)
    summary = demo.run(Path(args.out), args.size, args.workers)
    with reporting(f"the demo ran to its end in {args.out}"):
        print(demo.console_summary(summary))
    if not summary["learned"]:
        print(
            "tokshard demo: the evaluation loss did not fall as expected; see the report above",
            file=sys.stderr,
        )
        return 1
    return 0


COMMAND = Command(
    name="demo",
    summary="the whole job on a corpus tokshard writes itself, offline; rerun to resume",
    details="Build WikiText/CC-News/BookCorpus look-alikes in the hub's layouts, train a BPE, prepare\n"
    "on a local Dask cluster, verify, train a small GPT with DeepSpeed, evaluate, and write a report.\n"
    "Exits 1 if the validation loss did not fall (the report says by how much).",
    example="tokshard demo --out demo-out   # then open demo-out/report.png and demo-out/summary.md",
    add_options=add_options,
    run=run,
    after_stop="rerun the same command to resume",
)
