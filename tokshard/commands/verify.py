"""``tokshard verify MANIFEST...``: its options and output (``pipeline.storage.verify_place`` checks)."""

from __future__ import annotations

import argparse
import sys

from tokshard.commands.command import Command, each_path
from tokshard.usage import path_arg


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "manifest",
        nargs="+",
        type=path_arg,
        help="manifest.json or its folder; several (runs/*/, as the shell expands it) are each checked",
    )


def run(args: argparse.Namespace) -> int:
    several = len(args.manifest) > 1
    codes, worst = each_path(args.manifest, lambda m: _verify_one(m, where=f"{m}: " if several else ""))
    failed = len(args.manifest) - codes.count(0)  # faults, and manifests that could not be read
    if several and failed:
        print(f"tokshard: {failed} of {len(args.manifest)} manifests failed verification", file=sys.stderr)
    return max([worst, *codes])


def _verify_one(manifest: str, where: str) -> int:
    from pipeline.format.verify import REMAKE
    from pipeline.storage.verify_place import verify

    faults, totals = verify(manifest)
    for fault in faults:
        print(f"FAULT {where}{fault}")
    if faults:
        print(
            f"tokshard: verify found {len(faults)} fault(s){' in ' + manifest if where else ''}; {REMAKE}",
            file=sys.stderr,
        )
        return 1
    print(
        f"OK: {where}{totals['shards']} shard{'' if totals['shards'] == 1 else 's'}, {totals['tokens']:,} tokens match the manifest"
    )
    return 0


COMMAND = Command(
    name="verify",
    summary="re-hash every shard and check .idx against .bin; exit 1 on any fault",
    example="tokshard verify data/wt103/manifest.json",
    add_options=add_options,
    run=run,
)
