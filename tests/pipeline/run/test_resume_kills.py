"""SIGKILL real `prepare` processes at random moments, rerun, and compare every byte with an
uninterrupted run. The seed is printed (rerun one with TOKSHARD_KILL_SEED=N)."""

from __future__ import annotations

import os
import random
import re
import signal
import time

import numpy as np
import pytest
from support import (
    alive,
    assert_same_output,
    checkpoints,
    cli,
    corpus,
    dask_worker_pids,
    files_recipe,
    kill_group,
    leftovers,
    plain_encode,
    reference,
    start_prepare,
    stream_of,
    wait_for,
    write_jsonl,
)

from pipeline.format.verify import verify
from pipeline.run.run_state import STATE_DIR
from pipeline.run.status import status

#: one round of each kind of kill (the whole machine, the driver alone), in a random order and
#: at random moments: the seed picks when, not whether each kind is tried
KILL_KINDS = ("machine", "driver")


@pytest.fixture(scope="module")
def kill_setup(tmp_path_factory, docs, tokenizer_path, dask_client):
    """4 MB of real text with one 1.3M-character document; small partitions, tiny shards and a
    0.2 s commit interval, so kills land mid-partition, mid-rotation and mid-document."""
    d = tmp_path_factory.mktemp("kills")
    data = corpus(d / "in.jsonl", docs, copies=5, long_doc_copies=2)
    recipe = files_recipe(
        d / "kill.toml",
        tokenizer_path,
        data,
        partition_bytes=1_200_000,
        shard_tokens=50_000,
        commit_seconds=0.2,
    )
    ref = reference(recipe, d / "ref", dask_client)
    return recipe, ref.parent


def work_since(out, started: float) -> bool:
    """Some partition has written shard data or a checkpoint since ``started``."""
    for path in (*out.rglob("*.bin.tmp"), *(out / STATE_DIR / "parts").rglob("*.json")):
        try:
            if path.stat().st_mtime > started:
                return True
        except FileNotFoundError:
            continue
    return False


def test_sigkill_at_random_moments_then_rerun_gives_identical_bytes(kill_setup, tmp_path):
    recipe, ref = kill_setup
    seed = int(os.environ.get("TOKSHARD_KILL_SEED", random.randrange(1 << 31)))
    print(f"TOKSHARD_KILL_SEED={seed}")
    rng = random.Random(seed)
    out = tmp_path / "out"
    history: list[str] = []
    for kind in rng.sample(KILL_KINDS, len(KILL_KINDS)):
        started = time.time()
        proc = start_prepare(recipe, out, "--workers", "2")
        if rng.random() < 0.25:  # anywhere, start-up and planning included
            delay = rng.uniform(0.2, 3.0)
            time.sleep(delay)
            moment = f"{delay:.2f}s after start"
        else:  # while partitions are being written
            wait_for(lambda: work_since(out, started), 60, "work to start", proc)  # noqa: B023
            delay = rng.uniform(0.0, 1.5)
            time.sleep(delay)
            moment = f"{delay:.2f}s into the work"
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            history.append(f"finished before the kill ({moment}, exit {proc.returncode})")
            assert proc.returncode == 0, f"seed {seed} {history}: {stderr}"
            break
        if kind == "machine":
            kill_group(proc)  # the whole machine: driver and workers at once
            history.append(f"machine at {moment}")
        else:
            workers = dask_worker_pids(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its workers are orphaned
            proc.communicate()
            waited = time.monotonic()
            wait_for(lambda: not any(map(alive, workers)), 20, "orphaned local workers to exit")  # noqa: B023
            history.append(f"driver at {moment} (orphans gone in {time.monotonic() - waited:.1f}s)")
        if (out / STATE_DIR / "run.json").exists():
            s = status(out)
            counts = s["splits"]["text/train"]
            assert s["running"] is None, history
            assert counts["done"] + counts["partial"] + counts["pending"] == len(checkpoints(ref)), history
            assert s["complete"] or "manifest" in s["rerun"], history
    # the last run: one local worker is killed mid-task, the run itself must still finish
    started = time.time()
    proc = start_prepare(recipe, out, "--workers", "2")
    if wait_for(lambda: work_since(out, started) and dask_worker_pids(proc.pid), 60, "work", proc):
        os.kill(rng.choice(dask_worker_pids(proc.pid)), signal.SIGKILL)
        history.append("one worker killed in the last run")
    _, stderr = proc.communicate(timeout=240)
    print("\n".join(history))
    assert proc.returncode == 0, f"seed {seed} {history}: {stderr}"
    assert_same_output(ref, out, f"(seed {seed}: {history})")
    assert not leftovers(out), leftovers(out)
    assert verify(out / "manifest.json")[0] == []


def test_a_partition_whose_workers_keep_dying_stops_the_run_with_a_clear_error(kill_setup, tmp_path):
    recipe, _ = kill_setup
    out = tmp_path / "out"
    started = time.time()
    # no second chance (Dask's default is 3): the first death of a worker busy with it is fatal
    proc = start_prepare(
        recipe, out, "--workers", "1", env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    )
    (worker,) = wait_for(lambda: work_since(out, started) and dask_worker_pids(proc.pid), 60, "work", proc)
    os.kill(worker, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert re.fullmatch(
        r"tokshard: error: Dask workers died repeatedly on partition \S+ \(out of memory\?\); rerun to "
        r"resume from its last commit, with fewer --workers or more memory",
        stderr.strip().splitlines()[-1],
    ), stderr
    assert "Traceback" not in stderr


def test_a_kill_inside_a_long_document_resumes_inside_it(tmp_path, docs, tokenizer_path):
    text = "\n\n".join(docs * 3)  # 2M characters: committed piecewise, about every 1M
    data = write_jsonl(tmp_path / "long.jsonl", [docs[0], text, docs[1]])
    recipe = files_recipe(
        tmp_path / "r.toml", tokenizer_path, data, partition_bytes=1 << 30, commit_seconds=0.2
    )
    out = tmp_path / "out"
    # the reference encoder: slow enough that a commit interval passes inside the document
    # (fastokens encodes its 2 M characters in a fraction of one)
    proc = start_prepare(recipe, out, "--workers", "1", "--encoder", "tokenizers")
    inside = wait_for(
        lambda: any(c["long"] for c in checkpoints(out)), 120, "a commit inside the long document", proc
    )
    kill_group(proc)
    assert inside, f"prepare ended before committing inside the document: {proc.stderr}"
    (ckpt,) = checkpoints(out)
    chars = ckpt["long"]["chars"]
    assert 0 < chars < len(text)
    cli("prepare", str(recipe), "--out", str(out), "--workers", "1", check=True)
    (final,) = checkpoints(out)
    assert final["resumed_from"][0]["long_chars"] == chars, "the rerun did not start inside the document"
    expected = plain_encode(tokenizer_path, [docs[0], text, docs[1]])
    assert np.array_equal(stream_of(out / "manifest.json"), expected)
    assert not leftovers(out)
