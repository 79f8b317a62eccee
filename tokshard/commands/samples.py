"""``tokshard samples RUN_DIR --steps A-B``: its options and output (``trainer.samples`` computes)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline.format.errors import DataError, TokshardError, utf8_path
from tokshard.commands.command import Command
from tokshard.usage import LARGEST_WHOLE, add_data_cache_options, folder_arg, path_arg, positive_int
from trainer.console import reader_left

if TYPE_CHECKING:
    from pipeline.format.manifest import Manifest
    from trainer.samples import Layout, RunData


def parse_steps(text: str) -> tuple[int, int]:
    """``41237`` or ``100-120`` (inclusive, 1-based)."""
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP or FIRST-LAST, got {text!r}") from None
    if b > LARGEST_WHOLE:
        raise argparse.ArgumentTypeError(f"{text} names a step past the largest taken ({LARGEST_WHOLE:,})")
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"steps count from 1 and FIRST <= LAST, got {text!r}")
    return a, b


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        type=folder_arg,
        help="the run's --save folder (or a --run-dir naming it)",
    )
    p.add_argument(
        "--steps", required=True, type=parse_steps, metavar="A-B", help="a step or a range, 1-based"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per sample")
    p.add_argument("--decode", action="store_true", help="add each sample's text (the manifest's tokenizer)")
    p.add_argument(
        "--origin",
        action="store_true",
        help="name each document's input (file, object or hub file) and its line, row or byte offset",
    )
    p.add_argument("--world", type=positive_int, metavar="N", help="name the rank and micro-step for N ranks")
    p.add_argument(
        "--micro-batch", type=positive_int, metavar="M", help="samples per rank per micro-step (with --world)"
    )
    p.add_argument(
        "--manifest",
        action="extend",
        nargs="+",
        type=path_arg,
        help="where the manifests are now, one or more (default: the paths the run recorded)",
    )
    add_data_cache_options(p, files="files", limit=False)


def layout_for(args: argparse.Namespace, global_batch: int) -> Layout | None:
    from trainer.samples import Layout

    if args.world is None and args.micro_batch is not None:  # it was ignored: no rank was named
        raise TokshardError(
            "samples: --micro-batch says how each rank's samples split into micro-steps; "
            "pass --world N (the run's ranks) with it"
        )
    if args.world is None:
        return None
    micro = args.micro_batch or global_batch // args.world
    if args.world < 1 or micro < 1 or global_batch % (args.world * micro):
        raise TokshardError(
            f"samples: a global batch of {global_batch} does not split into --world {args.world} ranks of "
            f"--micro-batch {micro}; give sizes whose product divides it"
        )
    return Layout(args.world, micro)


class ChangedInputs:
    """``--origin``: each input an origin names, compared once with what its manifest records
    of it (size and time, ETag, sampled bytes); one that changed since prepare read it is said
    once on stderr, and the origins in it carry ``input_changed``: their places may now hold
    other bytes, and an audit must not take them as fact."""

    def __init__(self) -> None:
        self._checks: dict[tuple[str, str], Callable[[str], str | None]] = {}
        self._found: dict[tuple[str, str, str], str | None] = {}

    def __call__(self, manifest: Manifest, source: str, name: str) -> str | None:
        key = (str(manifest.path), source, name)
        if key not in self._found:
            self._found[key] = self._check(manifest, source, name)
        return self._found[key]

    def _check(self, manifest: Manifest, source: str, name: str) -> str | None:
        try:
            changed = self._source_check(manifest, source)(name)
        except TokshardError as exc:
            say(f"input {name} could not be compared with its record in {manifest.path} ({exc})")
            return None
        if changed is not None:
            say(
                f"{changed}; the places named in it may now hold other bytes (marked input_changed): "
                "restore it as prepared, or prepare the data again to trace its documents"
            )
        return changed

    def _source_check(self, manifest: Manifest, source: str) -> Callable[[str], str | None]:
        """The source's comparison, made once per (manifest, source) from its recorded origin."""
        from pipeline.sources import source_class

        key = (str(manifest.path), source)
        if key not in self._checks:
            record = manifest.data["sources"].get(source) or {}
            kind = source_class(record.get("type"), source, str(manifest.path))
            self._checks[key] = kind.input_check(record.get("origin") or {})
        return self._checks[key]


def say(line: str) -> None:
    print(f"tokshard: samples: {line}", file=sys.stderr, flush=True)


def tokenizer_decoder(run: RunData):
    """``--decode``: the manifest's tokenizer.json (copied beside it by prepare)."""
    from tokenizers import Tokenizer

    path = run.manifests[0].tokenizer_path
    named = utf8_path(path, "samples --decode: the manifest's tokenizer")
    try:
        tok = Tokenizer.from_file(named)
    except Exception as exc:  # tokenizers raises a bare Exception for a missing or unreadable file
        raise DataError(
            f"samples --decode: cannot read the manifest's tokenizer {path} ({exc}); put the tokenizer.json "
            "that prepared the data there, or drop --decode"
        ) from exc
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def describe(rec: dict[str, Any]) -> str:
    docs = " ".join(f"{d['id']}[{d['from']}:{d['to']}]" for d in rec["documents"])
    where = f" rank {rec['rank']} micro {rec['micro']}" if "rank" in rec else ""
    untrained = "" if rec["trained"] else " (not trained)"
    padding = f" | padding {rec['padding']}" if "padding" in rec else ""
    line = (
        f"step {rec['step']}{untrained}{where} | {rec['source']} epoch {rec['epoch']} window {rec['window']} "
        f"| position {rec['position']} | documents {docs}{padding}"
    )
    for d in rec["documents"]:
        if "origin" in d:
            line += "\n    " + describe_origin(d)
    if "text" in rec:
        line += "\n" + "\n".join("    " + t for t in rec["text"].splitlines()) + "\n"
    return line


def describe_origin(doc: dict[str, Any]) -> str:
    """One document's origin as ``samples --origin`` prints it."""
    o = doc["origin"]
    place = next((f"{unit} {o[unit]}" for unit in ("line", "row", "offset") if unit in o), "")
    where = f"{o['input']} {place}" if o["input"] is not None else "(its source names no place)"
    if "file" in o:  # a hub file: the repo at its revision, then where it was read
        where = f"{o['repo']}@{o['revision']} {o['file']} {place} (read from {o['input']})"
    if "input_changed" in o:
        where += " (input changed since prepare)"
    return (
        f"document {doc['id']}[{doc['from']}:{doc['to']}] <- {where} "
        f"| shard {o['shard']} document {o['shard_document']} {o['shard_hash']}"
    )


def untrained_note(run: RunData, first: int, last: int) -> str:
    """What to say of asked steps after the checkpoint's: the run never recorded them trained."""
    lo = max(first, run.trained_to + 1)
    steps = f"step {lo} comes" if lo == last else f"steps {lo}-{last} come"
    planned = run.state.steps
    how = (
        "shown as a --resume with the same settings would train them"
        if planned is None or last <= planned
        else f"shown as a --resume with --steps {last} or more would train them (the run's --steps is {planned})"
    )
    return (
        f"{steps} after the checkpoint ({run.tag}, step {run.trained_to}): not trained as far as the run "
        f"recorded; {how}"
    )


def run(args: argparse.Namespace) -> int:
    from trainer.samples import RunData

    recorded = RunData(args.run_dir, args.manifest, args.data_cache, ChangedInputs() if args.origin else None)
    decode = tokenizer_decoder(recorded) if args.decode else None
    if args.origin:
        recorded.check_origins()
    first, last = args.steps
    if last > recorded.trained_to:
        print(f"tokshard: samples: {untrained_note(recorded, first, last)}", file=sys.stderr, flush=True)
    untraced = 0
    for step in range(first, last + 1):
        if reader_left():  # `| head` has what it wanted: nothing more to find for it
            break
        layout = layout_for(args, recorded.state.step_start(step)[1])
        for rec in recorded.records(step, layout, decode, args.origin):
            if "untraced" in rec:  # refused alone: the other samples are traced as usual
                untraced += 1
                print(
                    f"tokshard: samples: step {step} position {rec['position']}: {rec['untraced']}",
                    file=sys.stderr,
                )
                continue
            print(json.dumps(rec) if args.json else describe(rec))
    return DataError.exit_code if untraced else 0


COMMAND = Command(
    name="samples",
    summary="which samples (sources, windows, documents, text) each training step used, from the checkpoint",
    details="Computed from the checkpointed schedule: nothing is logged during training.",
    example="tokshard samples ckpt --steps 41237 --origin --decode | less",
    add_options=add_options,
    run=run,
)
