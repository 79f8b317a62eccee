"""Crash points inside a partition: whatever instant a kill lands on, the checkpoint and the
files on disk agree, and resuming from the checkpoint gives the uninterrupted bytes."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from support import REPO, plain_encode

from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.documents import (
    DocumentEncoder,
    Held,
    LongProgress,
    Spooled,
    byte_level_pre_tokenizer,
)
from pipeline.format.content_hash import file_hash
from pipeline.format.errors import TokshardError
from pipeline.format.shard_writer import ShardRecord, ShardSequence
from pipeline.run.folder_layout import partition_lock
from pipeline.sources.base import Partition, Record

EOS = 0
SHARD = 20  # tokens per shard: four 5-token documents


def docs(first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents first..last-1, each four copies of its number and EOS."""
    tokens = np.array([t for i in range(first, last) for t in (i, i, i, i, EOS)], dtype=np.uint16)
    return tokens, np.full(last - first, 5, dtype=np.int32)


def uninterrupted(folder, n: int) -> list[ShardRecord]:
    seq = ShardSequence(folder, "p", "uint16", SHARD)
    seq.add(*docs(1, n))
    return seq.finish()


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_kill_after_rotation_before_the_checkpoint_resumes_from_the_last_commit(tmp_path):
    seq = ShardSequence(tmp_path / "a", "p", "uint16", SHARD)
    seq.add(*docs(1, 3))
    committed = seq.commit()  # the checkpoint: shard 0 open with 2 documents
    seq.add(*docs(3, 10))  # fills shards 0 and 1 (sealed) and opens shard 2 ...
    seq.current.abandon()  # ... and the process dies before the next checkpoint
    assert not list((tmp_path / "a").glob("*.bin")), "a sealed shard is not visible before its checkpoint"
    again = ShardSequence(tmp_path / "a", "p", "uint16", SHARD, closed=[], open_shard=committed)
    again.add(*docs(3, 14))
    records = again.finish()
    assert records == uninterrupted(tmp_path / "b", 14)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_kill_after_the_checkpoint_before_the_renames_finishes_them_on_resume(tmp_path):
    seq = ShardSequence(tmp_path / "a", "p", "uint16", SHARD)
    seq.add(*docs(1, 7))  # shard 0 sealed, shard 1 open
    committed = seq.commit()
    closed = list(seq.closed)  # the checkpoint lists shard 0 ...
    seq.current.abandon()  # ... and the process dies before renaming it
    assert (tmp_path / "a" / "p-0000.bin.tmp").exists() and not (tmp_path / "a" / "p-0000.bin").exists()
    again = ShardSequence(tmp_path / "a", "p", "uint16", SHARD, closed=closed, open_shard=committed)
    assert file_hash(tmp_path / "a" / "p-0000.bin") == closed[0].hash
    again.add(*docs(7, 14))
    again.finish()
    uninterrupted(tmp_path / "b", 14)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_a_finished_shard_deleted_behind_the_checkpoints_back_is_named(tmp_path):
    seq = ShardSequence(tmp_path, "p", "uint16", SHARD)
    seq.add(*docs(1, 7))
    committed = seq.commit()
    seq.finalize()  # after its checkpoint listed shard 0
    (tmp_path / "p-0000.bin").unlink()
    with pytest.raises(TokshardError, match=r"p-0000\.bin: a finished shard is missing"):
        ShardSequence(tmp_path, "p", "uint16", SHARD, closed=seq.closed, open_shard=committed)


def long_encoder(tokenizer_path, spool) -> DocumentEncoder:
    return DocumentEncoder(
        TokenizersEncoder(str(tokenizer_path)),
        eos_id=0,
        dtype=np.dtype("<u2"),
        spool_path=spool,
        pre_tokenizer=lambda: byte_level_pre_tokenizer(str(tokenizer_path)),
        batch_chars=40_000,
        long_doc_chars=50_000,
        piece_chars=8_000,
    )


def test_long_document_resumes_inside_itself_from_a_commit_point(tmp_path, docs, tokenizer_path):
    text = "\n\n".join(docs[:60])
    assert len(text) > 200_000
    record = Record(text, {"i": 1}, "test")
    spool = tmp_path / "doc.spool"
    first = long_encoder(tokenizer_path, spool)
    items = first.run([record], commit_points=True)
    point = next(items)
    point = next(items)  # the second commit point: some way into the document
    assert isinstance(point, LongProgress) and 0 < point.chars < len(text)
    first.sync_spool()  # what a commit does before recording the point
    next(items)  # more tokens reach the spool after the commit, then the process dies
    items.close()
    assert spool.stat().st_size > point.tokens * 2
    resumed = long_encoder(tokenizer_path, spool).run([record], resume=point, commit_points=True)
    *progress, done = list(resumed)
    assert isinstance(done, Spooled) and all(p.chars > point.chars for p in progress)
    assert np.array_equal(np.fromfile(done.path, dtype="<u2"), plain_encode(tokenizer_path, [text]))


def test_a_held_long_document_spills_to_the_spool_only_when_a_commit_points_into_it(
    tmp_path, docs, tokenizer_path
):
    text = "\n\n".join(docs[:60])
    spool = tmp_path / "doc.spool"
    held = long_encoder(tokenizer_path, spool)
    *progress, done = list(held.run([Record(text, {"i": 1}, "test")], commit_points=True))
    assert len(progress) > 2 and isinstance(done, Held) and not spool.exists()
    assert np.array_equal(np.concatenate(done.parts), plain_encode(tokenizer_path, [text]))
    spilled = long_encoder(tokenizer_path, spool)
    items = spilled.run([Record(text, {"i": 1}, "test")], commit_points=True)
    point = next(items)
    spilled.sync_spool()
    assert spool.stat().st_size == point.tokens * 2
    *_, done = list(items)
    assert isinstance(done, Spooled)
    assert np.array_equal(np.fromfile(done.path, dtype="<u2"), plain_encode(tokenizer_path, [text]))


def test_no_checkpoint_after_a_long_document_points_into_the_next_one(
    tmp_path, docs, tokenizer_path, monkeypatch
):
    from distributed import Client, LocalCluster
    from support import run_prepare, stream_of, write_jsonl

    from pipeline.encoding.documents import LONG_DOC_CHARS
    from pipeline.run import worker_task

    def of_chars(parts: list[str], n: int) -> str:
        body = "\n\n".join(parts)
        return (body * (1 + n // len(body)))[:n]

    first = of_chars(docs, LONG_DOC_CHARS * 13 // 10)  # both long, the second shorter
    second = of_chars(docs[::-1], LONG_DOC_CHARS * 11 // 10)
    texts = [first, second, docs[0]]
    write_jsonl(tmp_path / "long.jsonl", texts)
    saved = []
    real = worker_task.save_checkpoint

    def recording(out, part, ckpt):
        saved.append((ckpt.documents, ckpt.long.chars if ckpt.long else None))
        real(out, part, ckpt)

    monkeypatch.setattr(worker_task, "save_checkpoint", recording)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "commit_seconds": 0.001,  # a commit after every item: between the two documents too
        "sources": {
            "d": {"type": "files", "paths": [str(tmp_path / "long.jsonl")], "partition_bytes": 1 << 30}
        },
    }
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c,
        Client(c) as cl,
    ):
        out = run_prepare(recipe, tmp_path / "out", cl)
    assert any(documents == 1 for documents, _ in saved)
    # a resume skips ``long`` characters of the document at the checkpoint's cursor
    assert all(chars is None or chars <= len(texts[documents]) for documents, chars in saved), saved
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, texts))


def test_a_task_whose_run_a_newer_prepare_took_over_commits_nothing_more(
    tmp_path, docs, tokenizer_path, monkeypatch
):
    """A refused run's task on a shared scheduler ran on and committed into the newer run that
    planned the folder afresh (another tokenizer's ids published under its manifest): a task
    now looks for a newer run before each commit, not only after it."""
    import json

    from distributed import Client, LocalCluster
    from support import run_prepare, write_jsonl

    from pipeline.format.errors import TokshardError
    from pipeline.run import folder_layout, worker_task

    write_jsonl(tmp_path / "in.jsonl", docs * 4)
    out = tmp_path / "out"
    saved, looks = [], []
    real_save, real_current = worker_task.save_checkpoint, worker_task.current_run

    def recorded(out_, part, ckpt):
        real_save(out_, part, ckpt)
        saved.append(ckpt.documents)

    def taken_over_after_the_first_commit(out_):
        looks.append(out_)
        if len(saved) == 1 and len(looks) == 3:  # between the first commit and the second
            (folder_layout.state_dir(out) / folder_layout.RUN_ID_FILE).write_text(
                json.dumps({"run": "newer"})
            )
        return real_current(out_)

    monkeypatch.setattr(worker_task, "save_checkpoint", recorded)
    monkeypatch.setattr(worker_task, "current_run", taken_over_after_the_first_commit)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "commit_seconds": 0.001,  # a commit after every item
        "sources": {
            "d": {"type": "files", "paths": [str(tmp_path / "in.jsonl")], "partition_bytes": 1 << 30}
        },
    }
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c,
        Client(c) as cl,
        pytest.raises(
            TokshardError, match=r"a newer prepare \(run newer\) took over .*stopped before this commit"
        ),
    ):
        run_prepare(recipe, out, cl)
    assert len(saved) == 1, saved


def test_a_partition_held_by_another_process_is_waited_for_then_named(tmp_path):
    part = Partition("src", "train", 0, "k", 1)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pipeline.run.folder_layout import partition_lock;"
            "from pipeline.sources.base import Partition\n"
            "with partition_lock(Path(sys.argv[1]), Partition('src', 'train', 0, 'k', 1)):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with (
            pytest.raises(TokshardError, match=rf"still being written by pid {holder.pid} .* after 1 s"),
            partition_lock(tmp_path, part, wait_seconds=1.0),
        ):
            pass
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    with partition_lock(tmp_path, part, wait_seconds=5.0):  # the kernel released the dead holder's lock
        pass
