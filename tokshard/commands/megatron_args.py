"""``tokshard megatron-args MANIFEST``: its options and output (``trainer.megatron`` computes)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import file_head, file_or_nothing, write_json
from pipeline.format.errors import TokshardError
from tokshard.commands.command import Command
from tokshard.usage import default_of, file_arg, path_arg
from trainer.settings import DataSettings, EvalSettings


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "manifest",
        nargs="+",
        metavar="MANIFEST",
        type=path_arg,
        help="manifest.json or its folder (several allowed)",
    )
    p.add_argument("--split", default=default_of(DataSettings, "train_split"), help="the split to train on")
    p.add_argument(
        "--valid-split", default=default_of(EvalSettings, "split"), help="the split for 'valid' in --json"
    )
    p.add_argument("--mix", metavar="SRC=W,...", help="weights per source (default: by token count)")
    p.add_argument(
        "--json",
        metavar="FILE",
        type=file_arg,
        help="write {train, valid, test} blend lists here instead of printing",
    )


def run(args: argparse.Namespace) -> int:
    from trainer.megatron import blend
    from trainer.sampler import parse_mix

    manifests = [manifest_mod.load(p) for p in args.manifest]
    mix = parse_mix(args.mix)
    train = blend(manifests, args.split, mix)
    if not train:
        splits = sorted({s for m in manifests for s in m.splits()})
        raise TokshardError(
            f"megatron-args: no source has a {args.split!r} split (splits: {', '.join(splits)})"
        )
    if args.json:
        valid = blend(manifests, args.valid_split, None)
        write_blend(Path(args.json), {"train": train, "valid": valid or None, "test": None})
        print(
            f"wrote {args.json}: {len(train) // 2} train and {len(valid) // 2} valid shards", file=sys.stderr
        )
    else:
        print(shlex.join(train))  # a reader that quits early: `tokshard.cli.main`
    return 0


#: the keys of the per-split blend file (Megatron reads a null split as "no data")
BLEND_KEYS = {"train", "valid", "test"}


#: more than any blend file holds: a larger file at --json is not one
BLEND_MAX_BYTES = 1 << 24


def write_blend(path: Path, doc: dict) -> None:
    """Write the blend to ``path``, replacing only a blend file written before."""
    if file_or_nothing(path, "choose a file path for --json"):
        try:
            head = file_head(path, BLEND_MAX_BYTES)
            old = None if head is None else json.loads(head)
        except (OSError, ValueError):
            old = None
        if not (isinstance(old, dict) and set(old) == BLEND_KEYS):
            raise TokshardError(
                f"--json {path} exists and is not a blend file megatron-args wrote, so it is kept; "
                "choose another --json"
            )
    write_json(path, doc)


COMMAND = Command(
    name="megatron-args",
    summary="print Megatron-LM's --data-path (weight prefix ...) for a manifest's shards, or write its blend JSON",
    details="A path the shell would split (spaces, quotes) is printed shell-quoted: paste the line, or\n"
    "eval it; $(...) does not unquote, so for such paths use --json (the per-split blend JSON for\n"
    "Megatron's --per-split-data-args-path).",
    example="pretrain_gpt.py ... --data-path $(tokshard megatron-args out/manifest.json --mix wiki=0.7,code=0.3)\n"
    "tokshard megatron-args out/manifest.json --json blend.json   # --per-split-data-args-path blend.json",
    add_options=add_options,
    run=run,
)
