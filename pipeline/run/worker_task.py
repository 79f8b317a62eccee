"""One Dask task: encode one partition into shards, committing every few seconds.

A commit makes the shards written so far durable (fsync) and then records them together
with the input cursor they cover in the partition's checkpoint; only then do sealed
shards get their final names. A rerun, or Dask retrying the task on another worker after
this one died, resumes from that checkpoint, so at most one commit interval of work is
redone, also inside a single long document. The task returns only the small checkpoint;
token arrays never travel to the driver.

A task whose driver was killed may still be running (on a `dask worker`, or for a moment
on a local one); when a newer `prepare` has taken the folder's lock it stops at its next
commit, releasing the partition for the new run.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.encoding.documents import (
    Bad,
    Batch,
    DocumentEncoder,
    Held,
    LongProgress,
    Spooled,
    byte_level_pre_tokenizer,
)
from pipeline.encoding.spec import EncoderSpec, worker_encoder
from pipeline.format.atomic import DISK_FULL_ERRNOS, UNWRITABLE_ERRNOS, disk_error
from pipeline.format.errors import TokshardError
from pipeline.format.shard_reader import token_dtype
from pipeline.format.shard_writer import ShardSequence, finalize
from pipeline.run.folder_layout import (
    current_run,
    load_checkpoint,
    partition_lock,
    save_checkpoint,
    spool_path,
)
from pipeline.run.records import Checkpoint
from pipeline.sources import build_source
from pipeline.sources.base import Partition, Source, bad_record

#: characters per encoded item (batch, or group of long-document pieces) per encoder thread
ITEM_CHARS = 1 << 18


@dataclass(frozen=True)
class PartitionTask:
    """Everything a worker needs, as plain data (it is pickled to the worker)."""

    out: str
    partition: Partition
    source_config: dict[str, Any]
    #: the encoder the driver chose (`pipeline.encoding.selection.decide`), with the tokenizer
    encoder: EncoderSpec
    eos_id: int
    dtype: str
    shard_tokens: int
    on_bad_record: str
    commit_seconds: float
    run_id: str | None = None
    #: the token written before each document (None: none; a plan older than it has none)
    bos_id: int | None = None
    #: the driver's umask: a worker writes the shards under it, so that they get the mode the
    #: folder and the manifest got (None: the worker's own)
    umask: int | None = None


def warm_up(spec: EncoderSpec) -> None:
    """Build this worker's encoder before its first task: the driver has it done while it
    checks the encoder, so the first task starts encoding at once."""
    with contextlib.suppress(Exception):  # the first task meets the same failure, and reports it
        worker_encoder(spec)


def encode_texts(spec: EncoderSpec, texts: list[str]) -> list[Any]:
    """This worker's encoder's ids for ``texts``: the last comparison of the driver's check
    (`pipeline.encoding.selection.check`) runs on the copy the run itself will use."""
    return worker_encoder(spec).encode_batch(texts)


class Superseded(TokshardError):
    """A newer `prepare` took over the folder; this orphaned task stopped at a commit."""


def run_partition(task: PartitionTask, on_commit: Callable[[Checkpoint], None] | None = None) -> Checkpoint:
    """Encode ``task``'s partition into the local folder ``task.out``, from its last commit on;
    returns the final checkpoint (``on_commit``: told each commit's checkpoint once it is saved)."""
    out = Path(task.out)
    part = task.partition
    with umask_of(task.umask), partition_lock(out, part, wait_seconds=_lock_wait(task), run_id=task.run_id):
        ckpt = load_checkpoint(out, part) or Checkpoint(key=part.key)
        if ckpt.complete:
            finalize(out, ckpt.closed)
            return ckpt
        try:
            return PartitionRun(task, out, part, ckpt, on_commit).run()
        except OSError as exc:
            if exc.errno in (*DISK_FULL_ERRNOS, *UNWRITABLE_ERRNOS, errno.EFBIG):
                raise disk_error(exc, exc.filename or out / part.stem) from exc
            raise


def current_umask() -> int:
    """This process's umask, read without changing it where Linux tells it (setting it to read
    it back would touch every thread's files for a moment)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _SharedUmask:
    """The process's umask, shared by the tasks that run at once on a worker's threads: the
    first task in sets the driver's, the last one out restores the worker's own. A umask
    belongs to the whole process, so a task that set and restored it alone gave another
    task, still writing, the worker's 077 back (shards came out 0600), and the worker kept
    the driver's umask for good. A task of a driver with another umask waits until those of
    the first have ended."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.tasks = 0
        self.mask: int | None = None
        self.before = 0

    def enter(self, mask: int) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.tasks == 0 or self.mask == mask)
            if self.tasks == 0:
                self.before, self.mask = os.umask(mask), mask
            self.tasks += 1

    def leave(self) -> None:
        with self.changed:
            self.tasks -= 1
            if self.tasks == 0:
                os.umask(self.before)
                self.mask = None
                self.changed.notify_all()


_shared_umask = _SharedUmask()


@contextlib.contextmanager
def umask_of(mask: int | None) -> Iterator[None]:
    """The files and folders made in the block get the driver's umask (``mask``; None: this
    process's): a `dask worker` started under `umask 077` wrote the shards 0600 into a folder
    the driver had made 0755, with its manifest 0644, so nobody else could read them. Safe
    for tasks that overlap on a worker's threads (`_SharedUmask`)."""
    if mask is None:
        yield
        return
    _shared_umask.enter(mask)
    try:
        yield
    finally:
        _shared_umask.leave()


def _lock_wait(task: PartitionTask) -> float:
    """How long a new attempt waits for an old one still writing the partition: the old one
    stops at its next commit, so a few commit intervals (at least two minutes, at most an hour)."""
    return min(max(120.0, 20 * task.commit_seconds), 3600.0)


class CommitClock:
    """When to commit so that a kill loses at most about ``interval`` seconds of work.

    Commits happen between items (a batch of documents, or a piece of a long document), so
    waiting for ``interval`` to pass would lose up to interval + one item. Instead commit
    as soon as the *next* item (timed like the recent ones) would carry the uncommitted
    work past the interval.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last_commit = self.last_item = time.monotonic()
        self.item_seconds: float | None = None

    def item_done(self) -> bool:
        """Record that an item finished; True if it is time to commit."""
        now = time.monotonic()
        took = now - self.last_item
        self.item_seconds = took if self.item_seconds is None else 0.5 * (self.item_seconds + took)
        self.last_item = now
        return now - self.last_commit + self.item_seconds >= self.interval

    def committed(self) -> None:
        self.last_commit = self.last_item = time.monotonic()


class PartitionRun:
    """One attempt at a partition, from its checkpoint to the end (or to a crash)."""

    def __init__(
        self,
        task: PartitionTask,
        out: Path,
        part: Partition,
        ckpt: Checkpoint,
        on_commit: Callable[[Checkpoint], None] | None = None,
    ) -> None:
        self.task, self.out, self.part, self.ckpt = task, out, part, ckpt
        self.on_commit = on_commit
        self.source: Source | None = None
        self.started = time.monotonic()
        # from the start of the attempt: loading the encoder and reopening shards count too
        self.clock = CommitClock(task.commit_seconds)
        self.busy_before = ckpt.busy_seconds
        self.commit_before, self.commit_spent = ckpt.commit_time, 0.0
        if ckpt.cursor is not None or ckpt.long is not None or ckpt.open:
            ckpt.resumed_from.append(
                {
                    "progress": ckpt.progress,
                    "tokens": ckpt.tokens,
                    "long_chars": ckpt.long.chars if ckpt.long else None,
                    "time": time.time(),
                }
            )
        self.spool = spool_path(out, part)
        try:
            self.spool.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, self.spool) from exc
        if ckpt.long is None:
            self.spool.unlink(missing_ok=True)
        spec = task.encoder
        self.doc_encoder = DocumentEncoder(
            worker_encoder(spec),
            task.eos_id,
            token_dtype(task.dtype),
            self.spool,
            functools.partial(_pre_tokenizer, spec),
            # small items per thread: fine-grained commit points, and no slower than bigger
            # batches (encode_batch's cost is per character)
            batch_chars=ITEM_CHARS * max(1, spec.threads),
            bos_id=task.bos_id,
        )
        self.shards = ShardSequence(
            out,
            part.stem,
            task.dtype,
            task.shard_tokens,
            closed=ckpt.closed,
            open_shard=ckpt.open,
        )

    def run(self) -> Checkpoint:
        task, ckpt = self.task, self.ckpt
        source = self.source = build_source(self.part.source, task.source_config)
        resume = ckpt.long
        clock = self.clock
        try:
            items = self.doc_encoder.run(source.read(self.part, ckpt.cursor), resume, commit_points=True)
            for item in items:
                if isinstance(item, LongProgress):
                    ckpt.long = item
                else:
                    self._add(item)
                    ckpt.long = None  # a whole document: any long one has ended
                    if self.spool.exists():  # ... from its spool: no checkpoint may point into it
                        self.commit()
                        clock.committed()
                        self.spool.unlink()
                        continue
                if clock.item_done():
                    self.commit()
                    clock.committed()
            began = time.monotonic()
            records = self.shards.finish(finalize=False)
        except BaseException:
            self.shards.current.abandon()
            raise
        ckpt.closed = list(records)
        ckpt.open = None
        ckpt.long = None
        ckpt.complete = True
        ckpt.progress = self.part.size
        ckpt.busy_seconds = self.busy_before + time.monotonic() - self.started
        ckpt.commit_time = self.commit_before + self.commit_spent + time.monotonic() - began
        save_checkpoint(self.out, self.part, ckpt)
        self.shards.finalize()
        return ckpt

    def _add(self, item: Batch | Held | Spooled | Bad) -> None:
        ckpt = self.ckpt
        if isinstance(item, Bad):
            if self.task.on_bad_record == "error":
                self.commit()
                raise bad_record(item.where, item.reason, source=self.part.source)
            ckpt.skipped[item.reason] = ckpt.skipped.get(item.reason, 0) + 1
        elif isinstance(item, Spooled | Held):
            if isinstance(item, Spooled):
                self.shards.add_spooled(item.path, item.tokens, item.origin)
            else:
                self.shards.add_parts(item.parts, item.origin)
            ckpt.documents += 1
            ckpt.tokens += item.tokens
            ckpt.routed += item.routed
        else:
            self.shards.add(item.tokens, item.lengths, item.origins)
            ckpt.documents += len(item.lengths)
            ckpt.tokens += len(item.tokens)
            ckpt.dropped_empty += item.dropped_empty
            ckpt.routed += item.routed
        ckpt.cursor, ckpt.progress = item.cursor, item.progress

    def commit(self) -> None:
        """Shards durable, then the checkpoint that lists them, then final names for sealed ones;
        first, the input read so far is still the one planned (nothing of a file edited while it
        was read is committed)."""
        if self.source is not None:
            self.source.check_read()
        ckpt = self.ckpt
        began = time.monotonic()
        open_shard = self.shards.commit()
        if ckpt.long is not None:
            try:
                self.doc_encoder.sync_spool()
            except OSError as exc:
                raise disk_error(exc, self.spool) from exc
        ckpt.closed = list(self.shards.closed)
        ckpt.open = open_shard
        ckpt.busy_seconds = self.busy_before + time.monotonic() - self.started
        ckpt.commit_time = self.commit_before + self.commit_spent + time.monotonic() - began
        self._stop_if_superseded("before this commit")
        save_checkpoint(self.out, self.part, ckpt)
        self.shards.finalize()
        self.commit_spent += time.monotonic() - began
        if self.on_commit is not None:
            self.on_commit(ckpt)
        self._stop_if_superseded("at its last commit")

    def _stop_if_superseded(self, where: str) -> None:
        """A task of a run that ended (refused, or its driver gone) may still run on a shared
        scheduler's worker; once a newer prepare has taken the folder (and may have planned
        afresh, with another recipe), nothing more of the old run's is committed there."""
        newer = current_run(self.out)
        if self.task.run_id and newer and newer != self.task.run_id:
            raise Superseded(
                f"partition {self.part.key}: a newer prepare (run {newer}) took over {self.out}; "
                f"this task stopped {where}"
            )


_pre_tokenizers: dict[str, Any] = {}


def _pre_tokenizer(spec: EncoderSpec):
    """How this worker cuts long documents, found once per tokenizer; where the driver's spec
    says space cuts apply, without opening the tokenizer at all."""
    if spec.sha256 not in _pre_tokenizers:
        _pre_tokenizers[spec.sha256] = byte_level_pre_tokenizer(spec.tokenizer, spec.space_cuts)
    return _pre_tokenizers[spec.sha256]
