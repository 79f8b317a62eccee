"""``tokshard verify MANIFEST``: its options and output (``pipeline.storage.verify_place`` checks)."""

from __future__ import annotations

import argparse
import sys

from tokshard.commands.command import Command
from tokshard.usage import path_arg


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", type=path_arg, help="manifest.json or its folder")


def run(args: argparse.Namespace) -> int:
    from pipeline.storage.verify_place import verify

    faults, totals = verify(args.manifest)
    for fault in faults:
        print(f"FAULT {fault}")
    if faults:
        print(f"tokshard: verify found {len(faults)} fault(s)", file=sys.stderr)
        return 1
    print(f"OK: {totals['shards']} shards, {totals['tokens']:,} tokens match the manifest")
    return 0


COMMAND = Command(
    name="verify",
    summary="re-hash every shard and check .idx against .bin; exit 1 on any fault",
    example="tokshard verify data/wt103/manifest.json",
    add_options=add_options,
    run=run,
)
