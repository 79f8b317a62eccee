"""Which samples each optimizer step trained on, from a run's checkpoint (``tokshard samples``).

Nothing is logged during training for this: the checkpoint's schedule (segments of weights and
per-source offsets, ``trainer.schedule``), the seed and the global batch of each stretch of
steps map any step to its positions, positions to (source, epoch, window), and a window (or a
packed window, with the checkpoint's packing) to the documents that fill it through the shards'
Megatron ``.idx`` lengths: each as (source, split, document id, token range within it), so a
document's origin is named from the piece alone. ``--decode`` adds the text, decoded with the
manifest's tokenizer; ``--origin`` each document's input and line, row or offset, from the
shards' provenance sidecars (``trainer.origins``). Steps count from 1, as ``metrics.jsonl``
counts them.
The command's options are in ``tokshard/commands/samples.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.format.errors import DataError, TokshardError
from pipeline.format.manifest import Manifest
from pipeline.storage.data_cache import view_cache, view_source
from trainer import remote
from trainer.checkpoint.state import BatchSpan, latest_tag, read_state, state_path
from trainer.data import Samples, check_shards_whole, sources_with_split
from trainer.origins import InputCheck, StreamOrigins, UntracedShard
from trainer.packed import open_samples
from trainer.run_folders import RUN_FILE, recorded_save, same_folder
from trainer.schedule import Schedule, window_sources

_GIVE_MANIFESTS = "pass --manifest with the manifests the run trained on"


@dataclass(frozen=True)
class Layout:
    """How a global batch is split: ``world`` ranks of ``micro`` samples per micro-step."""

    world: int
    micro: int


@dataclass(frozen=True)
class RecordedLayout:
    """A layout as a record states it for a stretch of steps: those after ``after`` (up to
    ``until``; None: on), while their global batch is ``global_batch``. ``path`` is the record:
    the checkpoint's state file (a span of its batch history), or a run.json (the part of the
    run that wrote it, for checkpoints that record no layout)."""

    layout: Layout
    global_batch: int
    after: int
    path: Path
    until: int | None = None

    def covers(self, step: int, global_batch: int) -> bool:
        """Whether ``step`` (of ``global_batch`` samples) was trained by the part recorded."""
        within = step > self.after and (self.until is None or step <= self.until)
        return within and global_batch == self.global_batch

    @property
    def steps(self) -> str:
        """The steps it records, in words."""
        if self.until is None:
            return f"steps {self.after + 1} on"
        return (
            f"step {self.until}" if self.until == self.after + 1 else f"steps {self.after + 1}-{self.until}"
        )


def span_layouts(batches: tuple[BatchSpan, ...], path: Path) -> list[RecordedLayout]:
    """The layouts a checkpoint's batch history records (``path``: its state file), newest
    first; a span of an older tokshard's, which recorded none, has none."""
    found = []
    for span, after in zip(batches, [*batches[1:], None], strict=True):
        if span.world is not None and span.micro_batch is not None:
            until = after.step if after is not None else None
            found.append(
                RecordedLayout(
                    Layout(span.world, span.micro_batch), span.global_batch, span.step, path, until
                )
            )
    return found[::-1]


def read_recorded_layout(path: Path, save_dir: Path) -> RecordedLayout | None:
    """``path`` (a run.json) read as the record of the run saved in ``save_dir``: its world size
    and DeepSpeed config's micro-batch (None: no such file, another run's, or one without them)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    save = recorded_save(record)
    config = record.get("deepspeed_config")
    if not save or not same_folder(Path(save), save_dir) or not isinstance(config, dict):
        return None
    values = (
        record.get("world_size"),
        config.get("train_micro_batch_size_per_gpu"),
        config.get("train_batch_size"),
        record.get("start_step", 0),
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or min(values[:3]) < 1:
        return None
    world, micro, global_batch, after = values
    return RecordedLayout(Layout(world, micro), global_batch, after, path)


class RunData:
    """A run's checkpointed data position: schedule, seed, batches, manifests, seq-len, split."""

    def __init__(
        self,
        run_dir: str | Path,
        manifests: list[str] | None = None,
        data_cache: str | None = None,
        input_check: InputCheck | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.save_dir = find_save_dir(self.run_dir)
        self.tag, self.state = read_state(self.save_dir)
        if self.state.schedule is None:
            raise TokshardError(
                f"{self.save_dir / self.tag}: the checkpoint has no schedule (written by an older tokshard); "
                "resume it once with this version to record one"
            )
        self.schedule: Schedule = self.state.schedule
        self.seq_len = self.state.data.seq_len
        self.split = self.state.data.train_split
        self.packing = self.state.data.packing
        self.manifest_paths = manifests or list(self.state.data.manifests)
        self.given = bool(manifests)
        self.data_cache = data_cache  # where a manifest URL's files are fetched (None: the default)
        self._origins: dict[int, StreamOrigins] = {}
        self.input_check = input_check  # what changed in an input an origin names (None: not asked)

    @cached_property
    def manifests(self) -> list[Manifest]:
        """The run's manifests: local ones as they are, a URL's in the node's data cache (its shards
        and sidecars fetched and hash-checked as they are read), as `train` opens them. A run
        trained on a URL recorded its cache's view of it: that is opened from its URL again, in
        that cache (unless ``data_cache`` names another), since the view holds only the shards
        the run had fetched."""
        specs, cache = [], self.data_cache
        for i, path in enumerate(self.manifest_paths):
            viewed = view_source(path) or (None if self.given else self._recorded_url(i, path))
            if viewed is not None:
                path, cache = viewed[0], cache or str(viewed[1])
            specs.append(path)
        try:
            return remote.open_manifests(specs, cache, None)[0]
        except TokshardError as exc:
            raise type(exc)(f"samples: {exc}" + ("" if self.given else f"; {_GIVE_MANIFESTS}")) from exc

    def _recorded_url(self, i: int, path: str) -> tuple[str, Path] | None:
        """The URL the checkpoint records for a view deleted since (its data cache removed),
        to be fetched again into that cache."""
        urls, cache = self.state.data.urls, view_cache(path)
        if cache is None or i >= len(urls) or urls[i] is None:
            return None
        return urls[i], cache

    @cached_property
    def dataset(self) -> Samples:
        """The run's samples, on manifests holding exactly the data it trained on: the checks
        ``train --resume`` makes (``Schedule.changed_sources``), so no step shows other documents."""
        where = _GIVE_MANIFESTS
        manifests = self.manifests
        held = sources_with_split(manifests, self.split)
        missing = [s for s in self.schedule.sources if s not in held]
        if missing:
            one = len(self.manifest_paths) == 1
            raise DataError(
                f"samples: the run trained on {', '.join(repr(s) for s in missing)}, which "
                f"{', '.join(self.manifest_paths)} {'holds' if one else 'hold'} no {self.split!r} split of "
                f"({'its' if one else 'their'} sources: {', '.join(held) or 'none'}); {where}"
            )
        for m in manifests:  # as `train --resume` checks them: a cut shard showed other tokens
            check_shards_whole(m)
        dataset = open_samples(manifests, self.split, self.seq_len, self.schedule.sources, self.packing)
        changes = self.schedule.changed_sources(window_sources(dataset), self.schedule.sources)
        if changes:
            raise DataError(
                f"samples: the manifests hold other data than the run trained on ({'; '.join(changes)}); "
                f"its samples there would be other documents, as `train --resume` refuses too; {where}"
            )
        return dataset

    @cached_property
    def recorded_layout(self) -> RecordedLayout | None:
        """The ranks and micro-batch the run's run.json records (None: none records them): the
        one in the folder the checkpoint's part of the run logged into, else the given folder's."""
        logged_in = Path(self.state.run_dir) if self.state.run_dir else self.save_dir
        for folder in (logged_in, self.run_dir):
            found = read_recorded_layout(folder / RUN_FILE, self.save_dir)
            if found is not None:
                return found
        return None

    @cached_property
    def layout_records(self) -> list[RecordedLayout]:
        """Every record of who trained the run's steps, the one to read first first: the
        checkpoint's batch history (newest span first), then, for the steps it records no
        layout of (an older tokshard's), the run.json's."""
        found = span_layouts(self.state.batches, state_path(self.save_dir, self.tag))
        return found + ([self.recorded_layout] if self.recorded_layout is not None else [])

    def layout_steps(self, first: int, last: int) -> list[int]:
        """One step of each stretch of ``first``..``last`` whose global batch and layout record
        stay the same: checking those checks every step's layout."""
        starts = [b.step + 1 for b in self.state.batches] + [r.after + 1 for r in self.layout_records]
        starts += [r.until + 1 for r in self.layout_records if r.until is not None]
        return sorted({first} | {s for s in starts if first < s <= last})

    @property
    def trained_to(self) -> int:
        """The last step the checkpoint records as trained."""
        return self.state.step

    def check_from(self, step: int) -> None:
        """Raise now, before anything is said, what showing the steps from ``step`` on would: a
        step before a data change, or manifests that hold other data than the run trained on."""
        self.step_positions(step)
        _ = self.dataset

    def step_positions(self, step: int) -> np.ndarray:
        replaced = self.state.data_replaced_at
        if step <= replaced:  # the schedule and manifests recorded are the data's after the change
            raise DataError(
                f"samples: step {step} trained on data the run replaced after step {replaced} "
                f"(`train --resume --allow-data-change`); the checkpoint fixes the samples of steps "
                f"{replaced + 1} on, so ask for those"
            )
        start, global_batch = self.state.step_start(step)
        return np.arange(start, start + global_batch, dtype=np.int64)

    def origins(self, source: int) -> StreamOrigins:
        """Document id -> origin for a source of the run (DataError: prepared without provenance)."""
        if source not in self._origins:
            dataset = self.dataset
            name = dataset.sources[source]
            self._origins[source] = StreamOrigins(dataset.owners[source], name, self.split, self.input_check)
        return self._origins[source]

    def check_origins(self) -> None:
        """Raise before any output if a source of the run has no provenance."""
        for source in range(len(self.schedule.sources)):
            self.origins(source)

    def _trace(self, rec: dict[str, Any], source: int) -> None:
        """Each document of a sample with its origin; a sample touching a shard without
        provenance gets, instead, ``untraced``: the one line that says so."""
        origins = self.origins(source)
        try:
            found = [origins.origin(doc["id"]) for doc in rec["documents"]]
        except UntracedShard as exc:
            rec["untraced"] = str(exc)
            return
        for doc, where in zip(rec["documents"], found, strict=True):
            doc["origin"] = where

    def records(
        self, step: int, layout: Layout | None = None, decode=None, origin: bool = False
    ) -> Iterator[dict[str, Any]]:
        """One dict per sample of optimizer step ``step``, in position order (``origin``: each
        document with where it came from, or the sample's ``untraced`` line: see `_trace`)."""
        positions = self.step_positions(step)
        draws = self.schedule.draw(positions)
        first = int(positions[0])
        dataset = self.dataset
        for pos, src, epoch, window in zip(
            positions.tolist(),
            draws.sources.tolist(),
            draws.epochs.tolist(),
            draws.windows.tolist(),
            strict=True,
        ):
            rec: dict[str, Any] = {
                "step": step,
                "trained": step <= self.trained_to,
                "position": pos,
                "source": self.schedule.sources[src],
                "epoch": epoch,
                "window": window,
                **dataset.describe(src, window),
                "documents": [p.to_json() for p in dataset.pieces(src, window)],
            }
            if origin:
                self._trace(rec, src)
            if layout is not None:
                rec.update(rank_and_micro(pos - first, layout))
            if decode is not None:
                rec["text"] = decode(dataset.tokens_of(src, window).tolist())
            yield rec


def rank_and_micro(offset: int, layout: Layout) -> dict[str, int]:
    """Inverse of ``sampler.rank_positions``: who trained the ``offset``-th sample of a step."""
    per_micro_step = layout.micro * layout.world
    within = offset % per_micro_step
    return {"rank": within % layout.world, "micro": offset // per_micro_step, "row": within // layout.world}


def find_save_dir(run_dir: Path) -> Path:
    """The folder with the checkpoints: RUN_DIR itself, or the --save its run.json names."""
    if not run_dir.is_dir():
        raise TokshardError(
            f"samples: {run_dir} is not a folder; pass the run's --save folder (or its run dir)"
        )
    if latest_tag(run_dir):
        return run_dir
    run_json = run_dir / RUN_FILE
    if run_json.is_file():
        save = recorded_save(json.loads(run_json.read_text()))
        if save and latest_tag(Path(save)):
            return Path(save)
    raise TokshardError(
        f"samples: {run_dir} holds no checkpoint ('latest') and its run.json names none; "
        "pass the run's --save folder"
    )
