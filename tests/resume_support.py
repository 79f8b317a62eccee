"""Helpers for the crash/resume tests: a corpus worth killing, real `prepare` processes,
and the byte-for-byte comparison of two output folders."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import REPO, write_jsonl

from pipeline import recipe as recipe_mod
from pipeline.run.driver import RunOptions, prepare
from pipeline.run.state import STATE_DIR


def files_recipe(path: Path, tokenizer: Path, data: Path, partition_bytes: int, **settings: Any) -> Path:
    """A recipe file for one files source, as a user writes it."""
    top = {"tokenizer": str(tokenizer), **settings}
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    lines += [
        "[sources.text]",
        'type = "files"',
        f"paths = [{json.dumps(str(data))}]",
        f"partition_bytes = {partition_bytes}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def corpus(path: Path, docs: list[str], copies: int, long_doc_copies: int = 0) -> Path:
    """Real text, repeated; with ``long_doc_copies`` one document that long in the middle
    (over 1M characters it is encoded piece by piece, with commit points inside it)."""
    texts = docs * copies
    if long_doc_copies:
        texts.insert(len(texts) // 2, "\n\n".join(docs * long_doc_copies))
    return write_jsonl(path, texts)


def reference(recipe_path: Path, out: Path, client) -> Path:
    """The uninterrupted run every interrupted one must equal (same recipe file)."""
    r = recipe_mod.load(recipe_path)
    return prepare(r, out, RunOptions(client=client), log=lambda m: None)


def start_prepare(recipe_path: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`tokshard prepare` as its own process group (so a test can kill it like a machine)."""
    cmd = [sys.executable, "-m", "tokshard.cli", "prepare", str(recipe_path), "--out", str(out), *extra]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc: no extra dependency)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def dask_worker_pids(driver_pid: int) -> list[int]:
    """The local Dask worker processes a `prepare` driver spawned."""
    pids = []
    for pid in children(driver_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            pids.append(pid)
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def checkpoints(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / STATE_DIR / "parts").rglob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now
    return found


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc=None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def output_files(folder: Path) -> list[str]:
    """Every file a reader may see (the run state under .tokshard/ excluded)."""
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and STATE_DIR not in p.parts
    )


def assert_same_output(ref: Path, out: Path, context: str = "") -> None:
    """Shards, indexes, tokenizer byte for byte; the manifest equal but for its creation time."""
    assert output_files(out) == output_files(ref), context
    for rel in output_files(ref):
        a, b = (ref / rel).read_bytes(), (out / rel).read_bytes()
        if rel == "manifest.json":
            a_doc, b_doc = json.loads(a), json.loads(b)
            for doc in (a_doc, b_doc):
                del doc["created"], doc["checksum"]
            assert a_doc == b_doc, f"manifest differs {context}"
        else:
            assert a == b, f"{rel} differs {context}"


def leftovers(out: Path) -> list[Path]:
    """Temporary files and spools that must not survive a completed run."""
    return [*out.rglob("*.tmp"), *(out / STATE_DIR / "spool").glob("*")]
