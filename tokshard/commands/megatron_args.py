"""``tokshard megatron-args MANIFEST``: its options and output (``trainer.megatron`` computes)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import file_head, file_or_nothing, write_json
from pipeline.format.errors import TokshardError
from pipeline.storage.locations import refuse_url
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
        "--valid-split",
        help=f"the split for 'valid' in --json (default: {default_of(EvalSettings, 'split')}, where a source has it)",
    )
    p.add_argument(
        "--test-split", help=f"the split for 'test' in --json (default: {TEST_SPLIT}, where a source has it)"
    )
    p.add_argument("--mix", metavar="SRC=W,...", help="weights per source (default: by token count)")
    p.add_argument(
        "--json",
        metavar="FILE",
        type=file_arg,
        help="write {train, valid, test} blend lists here instead of printing ('-': to stdout)",
    )


#: the split Megatron's blend file names 'test', by default
TEST_SPLIT = "test"


def run(args: argparse.Namespace) -> int:
    from trainer.megatron import blend_of
    from trainer.sampler import parse_mix

    manifests = [manifest_mod.load(p) for p in args.manifest]
    for m in manifests:  # the weights come from its counts: an edited count would skew the blend
        m.check_sealed()
    train = blend_of(manifests, split_named(manifests, args.split, "--split"), parse_mix(args.mix))
    if args.json is None:
        say(train.notes)
        print(shlex.join(train.items))  # a reader that quits early: `tokshard.cli.main`
        return 0
    refuse_url(args.json, "--json")
    valid = other_split(manifests, args.valid_split, default_of(EvalSettings, "split"), "--valid-split")
    test = other_split(manifests, args.test_split, TEST_SPLIT, "--test-split")
    doc = {"train": train.items, "valid": valid, "test": test}
    if args.json == "-":
        say(train.notes)
        print(json.dumps(doc, indent=1))
        return 0
    write_blend(Path(os.path.realpath(args.json)), doc)  # through a link, as an editor saves
    say(train.notes)
    counts = ", ".join(f"{len(v) // 2} {k}" for k, v in doc.items() if v)
    print(f"wrote {args.json}: {counts} shards", file=sys.stderr)
    return 0


def say(notes: list[str]) -> None:
    """The train blend's notes on stderr (after every check passed: a refusal stays one line)."""
    for note in notes:
        print(f"tokshard: {note}", file=sys.stderr)


def split_named(manifests: list[manifest_mod.Manifest], split: str, flag: str) -> str:
    """``split`` if some source has it, else one line listing the splits there are."""
    if any(split in m.splits() for m in manifests):
        return split
    splits = sorted({s for m in manifests for s in m.splits()})
    raise TokshardError(
        f"megatron-args: no source has a {split!r} split ({flag}; splits: {', '.join(splits)})"
    )


def other_split(
    manifests: list[manifest_mod.Manifest], named: str | None, default: str, flag: str
) -> list[str] | None:
    """The blend of the 'valid' or 'test' split: one named must exist (a typo gave none, silently);
    the default is used where a source has it, else null (Megatron reads no data)."""
    from trainer.megatron import blend

    if named is None and not any(default in m.splits() for m in manifests):
        return None
    return blend(manifests, split_named(manifests, named or default, flag), None) or None


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
