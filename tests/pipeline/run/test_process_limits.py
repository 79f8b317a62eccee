"""A prepare under the machine's process limits (`ulimit -n`, `ulimit -v`): raised where the
hard limit allows, else one line before anything is made (it was a Dask traceback, a Rust
allocator's abort, or a hang, each after the run had made its folder)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from support import REPO, one_error_line, write_jsonl


def prepare_limited(tmp_path, tokenizer_path, docs, kind: int, soft: int, hard: int, *extra: str):
    """`tokshard prepare` in a fresh process whose ``kind`` limit is (soft, hard), as `ulimit` sets it."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    argv = [sys.executable, "-m", "tokshard", "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path),
            "--out", str(tmp_path / "out"), "--workers", "2", *extra]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: resource.setrlimit(kind, (soft, hard)),
    )  # fmt: skip


def test_too_few_open_files_is_one_line_and_nothing_made(tmp_path, tokenizer_path, docs):
    proc = prepare_limited(tmp_path, tokenizer_path, docs, resource.RLIMIT_NOFILE, 32, 32)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert (
        "open files are limited to 32 here (ulimit -n; hard limit 32); a prepare with 2 local workers" in line
    )
    assert "raise it (ulimit -n 4096)" in line
    assert not (tmp_path / "out").exists()


def test_a_short_soft_open_files_limit_is_raised_and_the_run_goes_on(tmp_path, tokenizer_path, docs):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    proc = prepare_limited(tmp_path, tokenizer_path, docs, resource.RLIMIT_NOFILE, 32, hard)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()


@pytest.mark.parametrize("mib", [300, 600])
def test_too_little_address_space_is_one_line_and_nothing_made(tmp_path, tokenizer_path, docs, mib):
    """At 300 MiB the run spun for good; at 600 MiB the tokenizer's allocator aborted it."""
    proc = prepare_limited(tmp_path, tokenizer_path, docs, resource.RLIMIT_AS, mib << 20, mib << 20)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"address space is limited to {mib} MiB a process here (ulimit -v {mib << 10};" in line
    assert "raise it (ulimit -v unlimited, or at least" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("what", ["tokenizer", "shard"])
def test_a_file_past_the_file_size_limit_is_one_line_naming_it_and_ulimit_f(
    tmp_path, tokenizer_path, gpt2_tokenizer_path, docs, what
):
    """Under `ulimit -f` a write fails with EFBIG: it said "cannot write out/tokenizer.json.tmp:
    File too large", naming a temporary file and no remedy."""
    tokenizer, kib = (gpt2_tokenizer_path, 1000) if what == "tokenizer" else (tokenizer_path, 100)
    if what == "shard":  # a shard of about 290 KiB, its tokenizer.json 54 KiB
        docs = [doc * 5 for doc in docs]
    limit = kib << 10
    proc = prepare_limited(tmp_path, tokenizer, docs, resource.RLIMIT_FSIZE, limit, limit)
    assert proc.returncode == 2
    line = one_error_line(proc)
    named = "tokenizer.json" if what == "tokenizer" else "00000-0000.bin"
    assert (
        f"{named}: it would grow past this process's file size limit of {limit:,} bytes (ulimit -f {kib};"
        in line
    )
    assert ".tmp" not in line and line.endswith("raise it (ulimit -f unlimited) and rerun")
    assert not (tmp_path / "out").exists()  # a fresh run: no "committed work is kept", there is none


def test_too_few_processes_is_one_line_and_nothing_made(tmp_path, gpt2_tokenizer_path, docs):
    """As a user under `ulimit -u 8` a nanny could not start a thread: a chained traceback ("Nanny
    failed to start"), exit 1, and the fresh --out left with its lock, plan and tokenizer."""
    from support import as_a_limited_user

    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    argv = [sys.executable, "-m", "tokshard", "prepare", "--input", str(data), "--tokenizer",
            str(gpt2_tokenizer_path), "--out", str(tmp_path / "out"), "--workers", "2"]  # fmt: skip
    proc = subprocess.run(
        as_a_limited_user(argv, "tokshard-nproc-prep", 8), capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert "processes and threads are limited to 8 for this user here (ulimit -u; hard limit 8)" in line
    assert "a prepare with 2 local workers starts about 22 more: raise it (ulimit -u 4096)" in line
    assert not (tmp_path / "out").exists()


def test_a_refused_thread_or_process_start_is_named_wherever_it_was_met():
    """Dask wraps a nanny's "can't start new thread" in "Nanny failed to start"; gloo's process
    group says only "Resource temporarily unavailable"; EAGAIN from a socket is not it."""
    from pipeline.run.process_limits import processes_exhausted

    def chained(inner: BaseException) -> RuntimeError:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise AssertionError("Status.starting") from exc
        except AssertionError as exc:
            try:
                raise RuntimeError("Nanny failed to start.") from exc
            except RuntimeError as outer:
                return outer

    for refused in (RuntimeError("can't start new thread"), RuntimeError("Resource temporarily unavailable")):
        assert "cannot start another thread or process" in str(processes_exhausted(chained(refused)))
    socket_eagain = BlockingIOError(11, "Resource temporarily unavailable")  # a non-blocking read
    assert processes_exhausted(socket_eagain) is None
    assert processes_exhausted(RuntimeError("something else")) is None
