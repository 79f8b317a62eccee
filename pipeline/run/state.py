"""The output folder's private state: run lock, run plan, per-partition checkpoints.

Layout under ``OUT/.tokshard/``::

    lock                 held (POSIX lock) by the one `prepare` driving this folder
    run-id               the id of the run that holds (or last held) the lock
    run.json             the plan: recipe identity, tokenizer, pinned origins, partitions
    parts/SRC/SPLIT/NNNNN.json   a partition's last commit point (its checkpoint)
    parts/SRC/SPLIT/NNNNN.lock   held by the worker writing that partition
    spool/SRC-SPLIT-NNNNN.spool  tokens of a long document being encoded (its checkpoint
                                 may point into it: commits happen inside long documents)

A checkpoint is replaced atomically; the shard files it names are durable before it is
written. Everything a rerun needs to resume is here, so any crash is followed by a rerun.
Anything else named ``*.tmp`` under the folder is a write that a crash interrupted:
`remove_leftovers` deletes it before a rerun starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline.encoding.documents import LongProgress
from pipeline.format.atomic import TMP_SUFFIX, disk_error, write_json
from pipeline.format.errors import TokshardError
from pipeline.format.shard_writer import OpenShard, ShardRecord
from pipeline.sources.base import Partition

STATE_DIR = ".tokshard"
RUN_ID_FILE = "run-id"
PLAN_VERSION = 1


def state_dir(out: Path) -> Path:
    return out / STATE_DIR


@dataclass
class Checkpoint:
    """A partition's progress at its last commit point."""

    key: str
    complete: bool = False
    cursor: dict[str, Any] | None = None
    documents: int = 0
    tokens: int = 0
    dropped_empty: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    #: documents the encoder sent to the reference (fastokens' routed class)
    routed: int = 0
    progress: int = 0
    closed: list[ShardRecord] = field(default_factory=list)
    open: OpenShard | None = None
    updated: float = 0.0
    busy_seconds: float = 0.0
    #: of which spent making work durable (fsyncs, checkpoints, renames): the price of commits
    commit_time: float = 0.0
    #: progress inside the long document that starts at ``cursor``
    long: LongProgress | None = None
    #: where each later attempt picked up: {"progress", "tokens", "long_chars", "time"}
    resumed_from: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The checkpoint file's content (the one place its records become plain data)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        """The inverse of `to_json` (the one place plain data become its records again)."""
        return cls(
            **{
                **data,
                "closed": [ShardRecord(**r) for r in data.get("closed", [])],
                "open": OpenShard(**data["open"]) if data.get("open") else None,
                "long": LongProgress(**data["long"]) if data.get("long") else None,
            }
        )


def checkpoint_path(out: Path, part: Partition) -> Path:
    return state_dir(out) / "parts" / f"{part.stem}.json"


def load_checkpoint(out: Path, part: Partition) -> Checkpoint | None:
    path = checkpoint_path(out, part)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise TokshardError(
            f"{path}: unreadable checkpoint ({exc}); delete it to redo that partition"
        ) from exc
    if data.get("key") != part.key:
        raise TokshardError(
            f"{path}: checkpoint is for {data.get('key')!r}, not {part.key!r}; use a new --out"
        )
    return Checkpoint.from_json(data)


def save_checkpoint(out: Path, part: Partition, ckpt: Checkpoint) -> None:
    path = checkpoint_path(out, part)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise disk_error(exc, path) from exc
    ckpt.updated = time.time()
    write_json(path, ckpt.to_json())


# --- locks -----------------------------------------------------------------------------

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _holder_text(path: Path) -> str:
    info = read_holder(path)
    if not info:
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"


def _lock_fd(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise disk_error(exc, path) from exc


def _write_holder(fd: int, path: Path, run_id: str | None) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "time": time.time(),
        "run": run_id,
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as exc:
        raise disk_error(exc, path) from exc


def read_holder(path: Path) -> dict[str, Any]:
    """What a lock file says about its last holder (empty if unreadable or being rewritten)."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


@contextlib.contextmanager
def run_lock(out: Path, run_id: str | None = None) -> Iterator[None]:
    """Only one `prepare` per folder: a second one is refused, naming the holder.

    The holder then records its ``run_id`` in ``run-id`` (a separate file: reading the lock
    file itself in the holder's process would drop the lock), so that workers still busy
    for a driver that was killed see a newer run take over and stop at their next commit.
    """
    path = state_dir(out) / "lock"
    fd = _lock_fd(path)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise TokshardError(
                f"another `tokshard prepare` ({_holder_text(path)}) is running on {out}; "
                "wait for it to finish or stop it, then rerun"
            ) from exc
        _write_holder(fd, path, run_id)
        if run_id:
            write_json(state_dir(out) / RUN_ID_FILE, {"run": run_id})
        yield
    finally:
        os.close(fd)


def current_run(out: Path) -> str | None:
    """The run id of the `prepare` that last took the folder's lock (None if unknown)."""
    return read_holder(state_dir(out) / RUN_ID_FILE).get("run")


def lock_holder(out: Path) -> str | None:
    """Who holds the run lock now (None if nobody), without disturbing them.

    Only a shared lock is tried, on a read-only descriptor: it cannot take the lock away.
    (Never call this in the process that holds the run lock: closing any descriptor of a
    file drops that process's POSIX locks on it.)
    """
    path = state_dir(out) / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder_text(path)
    finally:
        os.close(fd)
    return None


def partition_lock_path(out: Path, part: Partition) -> Path:
    return checkpoint_path(out, part).with_suffix(".lock")


@contextlib.contextmanager
def partition_lock(
    out: Path, part: Partition, wait_seconds: float = 120.0, run_id: str | None = None
) -> Iterator[None]:
    """One writer per partition, also across hosts on a shared filesystem.

    After a driver is killed its old workers may still be finishing a task; a new attempt
    on the same partition waits for them instead of writing the same files at once. They
    stop at their next commit when they see the newer run (see `current_run`), so the wait
    is about one commit interval; ``wait_seconds`` bounds it in any case.
    """
    path = partition_lock_path(out, part)
    with _process_locks_guard:
        local = _process_locks.setdefault(str(path), threading.Lock())
    if not local.acquire(timeout=wait_seconds):
        raise TokshardError(f"partition {part.key} is busy in this process; rerun later")
    try:
        fd = _lock_fd(path)
        try:
            deadline = time.monotonic() + wait_seconds
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise TokshardError(
                            f"partition {part.key} is still being written by {_holder_text(path)} "
                            f"after {wait_seconds:.0f} s; stop that process, then rerun"
                        ) from exc
                    time.sleep(0.2)
            _write_holder(fd, path, run_id)
            yield
        finally:
            os.close(fd)
    finally:
        local.release()


def remove_leftovers(out: Path) -> list[Path]:
    """Delete temporary files of writes a crash interrupted (the driver's and checkpoints').

    Shard ``.tmp`` files are not touched here: each partition's task accounts for its own
    against its checkpoint when it resumes. Call only while holding the run lock.
    """
    found = [*out.glob("*" + TMP_SUFFIX), *state_dir(out).glob("*" + TMP_SUFFIX)]
    found += state_dir(out).glob("parts/**/*.json" + TMP_SUFFIX)
    for path in found:
        path.unlink(missing_ok=True)
    return found


# --- the run plan ----------------------------------------------------------------------


@dataclass
class Plan:
    """Fixed at a folder's first run; every rerun follows it (pinned revisions, partitions)."""

    identity: dict[str, Any]
    identity_hash: str
    recipe: dict[str, Any]
    tokenizer: dict[str, Any]
    origins: dict[str, dict[str, Any]]
    splits: dict[str, list[str]]
    partitions: list[Partition]
    version: int = PLAN_VERSION

    def to_json(self) -> dict[str, Any]:
        """The plan as run.json holds it: its fields as they are (plain data already; a deep
        copy of 100,000 files' entries would cost more than writing them)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["partitions"] = [p.to_json() for p in self.partitions]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        d["partitions"] = [Partition.from_json(p) for p in d["partitions"]]
        return cls(**d)


def plan_path(out: Path) -> Path:
    return state_dir(out) / "run.json"


def load_plan(out: Path) -> Plan | None:
    path = plan_path(out)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise TokshardError(f"{path}: unreadable run plan ({exc}); use a new --out or delete {out}") from exc
    if data.get("version") != PLAN_VERSION:
        raise TokshardError(f"{path}: made by another tokshard version; use a new --out")
    return Plan.from_json(data)


def save_plan(out: Path, plan: Plan) -> None:
    plan_path(out).parent.mkdir(parents=True, exist_ok=True)
    write_json(plan_path(out), plan.to_json())


def spool_path(out: Path, part: Partition) -> Path:
    return state_dir(out) / "spool" / f"{part.source}-{part.split}-{part.index:05d}.spool"
