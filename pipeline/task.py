"""One Dask task: encode one partition into shards, committing every few seconds.

A commit makes the shards written so far durable (fsync) and then records them together
with the input cursor they cover in the partition's checkpoint. A rerun, or Dask retrying
the task on another worker after this one died, resumes from that checkpoint, so at most
one commit interval of work is redone. The task returns only the small checkpoint; token
arrays never travel to the driver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.encode import Bad, Batch, DocumentEncoder, Spooled, byte_level_pre_tokenizer
from pipeline.encoders import cached_encoder
from pipeline.errors import TokshardError
from pipeline.shard_reader import token_dtype
from pipeline.shard_writer import OpenShard, ShardRecord, ShardSequence
from pipeline.sources import build_source
from pipeline.sources.base import Partition
from pipeline.state import Checkpoint, load_checkpoint, partition_lock, save_checkpoint, spool_path


@dataclass(frozen=True)
class PartitionTask:
    """Everything a worker needs, as plain data (it is pickled to the worker)."""

    out: str
    partition: dict[str, Any]
    source_config: dict[str, Any]
    tokenizer_path: str
    tokenizer_sha256: str
    eos_id: int
    dtype: str
    shard_tokens: int
    encoder: str
    threads: int
    on_bad_record: str
    commit_seconds: float


def run_partition(task: PartitionTask) -> dict[str, Any]:
    out = Path(task.out)
    part = Partition.from_json(task.partition)
    with partition_lock(out, part):
        ckpt = load_checkpoint(out, part) or Checkpoint(key=part.key)
        if ckpt.complete:
            return ckpt.to_json()
        return _encode(task, out, part, ckpt).to_json()


def _encode(task: PartitionTask, out: Path, part: Partition, ckpt: Checkpoint) -> Checkpoint:
    source = build_source(part.source, task.source_config)
    encoder = cached_encoder(task.encoder, task.tokenizer_path, task.tokenizer_sha256, task.threads)
    spool = spool_path(out, part)
    spool.parent.mkdir(parents=True, exist_ok=True)
    spool.unlink(missing_ok=True)
    doc_encoder = DocumentEncoder(
        encoder,
        task.eos_id,
        token_dtype(task.dtype),
        spool,
        _pre_tokenizer(task.tokenizer_path, task.tokenizer_sha256),
    )
    shards = ShardSequence(
        out,
        part.stem,
        task.dtype,
        task.shard_tokens,
        closed=[ShardRecord(**r) for r in ckpt.closed],
        open_shard=OpenShard(**ckpt.open) if ckpt.open else None,
    )
    started = time.monotonic()
    last_commit = started
    busy_before = ckpt.busy_seconds

    def commit() -> None:
        open_shard = shards.commit()
        ckpt.closed = [r.to_json() for r in shards.closed]
        ckpt.open = {"seq": open_shard.seq, "tokens": open_shard.tokens, "documents": open_shard.documents}
        ckpt.busy_seconds = busy_before + time.monotonic() - started
        save_checkpoint(out, part, ckpt)

    try:
        for item in doc_encoder.run(source.read(part, ckpt.cursor)):
            if isinstance(item, Bad):
                if task.on_bad_record == "error":
                    commit()
                    raise TokshardError(
                        f"{item.where}: bad record ({item.reason}); fix it, or rerun with "
                        "--on-bad-record skip (work done so far is kept)"
                    )
                ckpt.skipped[item.reason] = ckpt.skipped.get(item.reason, 0) + 1
            elif isinstance(item, Spooled):
                shards.add_spooled(item.path, item.tokens)
                item.path.unlink()
                ckpt.documents += 1
                ckpt.tokens += item.tokens
            elif isinstance(item, Batch):
                shards.add(item.tokens, item.lengths)
                ckpt.documents += len(item.lengths)
                ckpt.tokens += len(item.tokens)
                ckpt.dropped_empty += item.dropped_empty
            ckpt.cursor, ckpt.progress = item.cursor, item.progress
            now = time.monotonic()
            if now - last_commit >= task.commit_seconds:
                commit()
                last_commit = now
        records = shards.finish()
    except BaseException:
        shards.current.abandon()
        raise
    ckpt.closed = [r.to_json() for r in records]
    ckpt.open = None
    ckpt.complete = True
    ckpt.progress = part.size
    ckpt.busy_seconds = busy_before + time.monotonic() - started
    save_checkpoint(out, part, ckpt)
    return ckpt


_pre_tokenizers: dict[str, Any] = {}


def _pre_tokenizer(path: str, sha256: str):
    if sha256 not in _pre_tokenizers:
        _pre_tokenizers[sha256] = byte_level_pre_tokenizer(path)
    return _pre_tokenizers[sha256]
