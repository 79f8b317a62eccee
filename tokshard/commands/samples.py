"""``tokshard samples RUN_DIR --steps A-B``: its options and output (``trainer.samples`` computes)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.format.errors import DataError, TokshardError, utf8_path
from tokshard.commands.command import Command
from tokshard.usage import LARGEST_WHOLE, add_data_cache_options, folder_arg, path_arg, positive_int
from trainer.console import reader_left

if TYPE_CHECKING:
    from pipeline.format.manifest import Manifest
    from trainer.samples import Layout, RecordedLayout, RunData


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
    p.add_argument(
        "--world",
        type=positive_int,
        metavar="N",
        help="name each sample's rank and micro-step, for N ranks (with --micro-batch alone: the ranks the "
        "checkpoint records for each step, or an older one's run.json)",
    )
    p.add_argument(
        "--micro-batch",
        type=positive_int,
        metavar="M",
        help="samples per rank per micro-step (default: the one the checkpoint records for each step, or an "
        "older one's run.json; where nothing records it, each rank's whole share, said so)",
    )
    p.add_argument(
        "--manifest",
        action="extend",
        nargs="+",
        type=path_arg,
        help="where the manifests are now, one or more (default: the paths the run recorded)",
    )
    add_data_cache_options(p, files="files", limit=False)


class Layouts:
    """Who trained each sample, where ``--world`` or ``--micro-batch`` asks: a value not given
    is the record's for that step (the checkpoint's batch history, else the run.json's, for
    checkpoints that record no layout); where nothing records the step, it is assumed (the
    newest record's, else accumulation 1) and said so. A flag that differs from the record
    wins, and the difference is said. Each note once, in `notes` until said: a refusal of a
    later step comes before any of them (`check`)."""

    def __init__(self, args: argparse.Namespace, records: Sequence[RecordedLayout]) -> None:
        self.world, self.micro = args.world, args.micro_batch
        #: the records, the one to read first first (`RunData.layout_records`)
        self.records = list(records)
        self.notes: dict[str, str] = {}
        self._said: set[str] = set()

    def check(self, steps: Iterable[int], global_batch: Callable[[int], int]) -> None:
        """Refuse now (before any note is said) where a step of ``steps`` has no layout."""
        for step in steps:
            self.for_step(step, global_batch(step))

    def for_step(self, step: int, global_batch: int) -> Layout | None:
        """The layout of ``step`` (``global_batch`` samples), or None where none was asked."""
        from trainer.samples import Layout

        if self.world is None and self.micro is None:
            return None
        rec = next((r for r in self.records if r.covers(step, global_batch)), None)
        basis = rec or (self.records[0] if self.records else None)
        world = self.world or (basis.layout.world if basis is not None else None)
        if world is None:  # --micro-batch alone, and no record says the ranks
            raise TokshardError(
                "samples: --micro-batch says how each rank's samples split into micro-steps, and the run "
                "records no number of ranks (no layout in its checkpoint, no run.json beside it); pass "
                "--world N (the run's ranks) with it"
            )
        micro = self.micro or (
            rec.layout.micro if rec is not None else self._assumed_micro(global_batch, world)
        )
        if global_batch % (world * micro):
            raise TokshardError(
                f"samples: a global batch of {global_batch} does not split into --world {world} ranks of "
                f"--micro-batch {micro}; give sizes whose product divides it"
            )
        if rec is not None:
            self._differences(rec, world, micro)
        else:
            self._assumptions(step, world, micro)
        return Layout(world, micro)

    def unsaid(self) -> list[str]:
        """The notes found and not yet said, now counted as said."""
        new = [line for kind, line in self.notes.items() if kind not in self._said]
        self._said.update(self.notes)
        return new

    def _assumed_micro(self, global_batch: int, world: int) -> int:
        """A micro-batch nothing records for a step: the newest record's where it splits the
        batch, else the whole of each rank's share (accumulation 1)."""
        if self.records and global_batch % (world * self.records[0].layout.micro) == 0:
            return self.records[0].layout.micro
        return max(1, global_batch // world)

    def _differences(self, rec: RecordedLayout, world: int, micro: int) -> None:
        """Note where a flag shows another layout than the one the run recorded."""
        differ = [
            f"{flag} {value} (the record's: {was})"
            for flag, value, was in (
                ("--world", self.world, rec.layout.world),
                ("--micro-batch", self.micro, rec.layout.micro),
            )
            if value is not None and value != was
        ]
        if differ:
            self.notes.setdefault(
                "differ",
                f"shown as the flags ask ({'; '.join(differ)}), not as the run trained, which {rec.path} records "
                f"(--world {rec.layout.world} --micro-batch {rec.layout.micro}); drop them to see its layout",
            )

    def _assumptions(self, step: int, world: int, micro: int) -> None:
        """Note which values nothing recorded for ``step`` were assumed."""
        assumed = [
            f"{flag} {v}"
            for flag, v, given in (("--world", world, self.world), ("--micro-batch", micro, self.micro))
            if given is None
        ]
        if not assumed:
            return
        rec = self.records[0] if self.records else None
        why = (
            f"{rec.path} records the layout of {rec.steps} (global batch {rec.global_batch}) alone"
            if rec is not None
            else "neither the checkpoint nor a run.json records the run's layout"
        )
        self.notes.setdefault(
            "assumed",
            f"{why}: step {step} and any other step it does not record are shown assuming "
            f"{' '.join(assumed)}; pass the values the run trained with if those differ",
        )


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
    recorded.check_from(first)  # every refusal comes before any note, as its one line
    asked = args.world is not None or args.micro_batch is not None
    layouts = Layouts(args, recorded.layout_records if asked else [])
    layouts.check(recorded.layout_steps(first, last), lambda step: recorded.state.step_start(step)[1])
    if last > recorded.trained_to:
        say(untrained_note(recorded, first, last))
    untraced = 0
    for step in range(first, last + 1):
        if reader_left():  # `| head` has what it wanted: nothing more to find for it
            break
        layout = layouts.for_step(step, recorded.state.step_start(step)[1])
        for line in layouts.unsaid():
            say(line)
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
