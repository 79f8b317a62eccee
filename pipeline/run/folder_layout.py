"""The run state's files in a local output folder: run lock, plan, checkpoints, spools.

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
`remove_leftovers` deletes it before a rerun starts. The driver reaches these files through
`pipeline.run.folder_state.FolderState`; a worker's task writes its checkpoints and takes its
partition's lock here directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.format.atomic import (
    TMP_SUFFIX,
    disk_error,
    held_by_another,
    lock_file,
    take_back_folders,
    try_exclusive,
    write_bytes,
    write_json,
)
from pipeline.format.errors import TokshardError, name_too_long
from pipeline.format.shard_writer import finalize
from pipeline.run.records import Checkpoint, Holder, holder_text
from pipeline.run.run_state import STATE_DIR, checkpoint_rel
from pipeline.sources.base import Partition

RUN_ID_FILE = "run-id"
#: the run lock's file in the state folder: the first file a run makes there
LOCK_NAME = "lock"
#: least seconds between two rewrites of a running driver's progress into its lock record
HOLDER_UPDATE_SECONDS = 2.0


def state_dir(out: Path) -> Path:
    return out / STATE_DIR


def checkpoint_path(out: Path, part: Partition) -> Path:
    return out / checkpoint_rel(part)


def load_checkpoint(out: Path, part: Partition) -> Checkpoint | None:
    path = checkpoint_path(out, part)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if name_too_long(exc):
            return None
        raise TokshardError(
            f"{path}: unreadable checkpoint ({exc}); delete it to redo that partition"
        ) from exc
    return Checkpoint.parse(data, part, str(path))


def save_checkpoint(out: Path, part: Partition, ckpt: Checkpoint) -> None:
    path = checkpoint_path(out, part)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise disk_error(exc, path) from exc
    ckpt.updated = time.time()
    write_bytes(path, ckpt.to_bytes())


# --- locks -----------------------------------------------------------------------------

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def read_holder(path: Path) -> Holder | None:
    """What a lock file says about its last holder (None if unreadable or being rewritten)."""
    try:
        return Holder.parse(path.read_bytes())
    except OSError:
        return None


def _write_holder(fd: int, path: Path, holder: Holder, written: int = 0) -> int:
    """Write the holder's record over the lock file's content (the lock stays held: the file
    is rewritten in place, padded over a longer old record); returns the bytes written."""
    data = holder.to_bytes()
    try:
        os.pwrite(fd, data.ljust(written), 0)
        if written <= len(data):
            os.ftruncate(fd, len(data))
    except OSError as exc:
        raise disk_error(exc, path) from exc
    return max(written, len(data))


class RunLock:
    """The held lock of a folder's run: its holder record can be updated while it is held."""

    def __init__(self, fd: int, path: Path, holder: Holder) -> None:
        self.fd, self.path, self.holder = fd, path, holder
        self._written = _write_holder(fd, path, holder)
        self._last = time.monotonic()

    def report(self, tokens_per_s: float, eta_s: float | None) -> None:
        """Record the driver's rate and ETA for `tokshard status`: the first rate at once, then
        at most every `HOLDER_UPDATE_SECONDS`."""
        first = not self.holder.tokens_per_s and tokens_per_s > 0
        if not first and time.monotonic() - self._last < HOLDER_UPDATE_SECONDS:
            return
        self._last = time.monotonic()
        self.holder = self.holder.updated(tokens_per_s=tokens_per_s, eta_s=eta_s)
        with contextlib.suppress(TokshardError):  # progress is advisory: never stop a run for it
            self._written = _write_holder(self.fd, self.path, self.holder, self._written)


@contextlib.contextmanager
def run_lock(out: Path, run_id: str | None = None, made: Sequence[Path] = ()) -> Iterator[RunLock]:
    """Only one `prepare` per folder: a second one is refused, naming the holder.

    The holder then records its ``run_id`` in ``run-id`` (a separate file: reading the lock
    file itself in the holder's process would drop the lock), so that workers still busy
    for a driver that was killed see a newer run take over and stop at their next commit.
    ``made``: the folders this run made, the output and its parents, deepest first
    (`atomic.missing_folders`: `_unmade` takes them back if the run fails at once).
    """
    path = state_dir(out) / LOCK_NAME
    made_state = not state_dir(out).exists()
    fd = lock_file(path)
    try:
        if not try_exclusive(fd, path):
            raise TokshardError(
                f"another `tokshard prepare` ({holder_text(read_holder(path))}) is running on {out}; "
                "wait for it to finish or stop it, then rerun"
            )
        lock = RunLock(fd, path, Holder.of_this_process(run_id))
        if run_id:
            write_json(state_dir(out) / RUN_ID_FILE, {"run": run_id})
        try:
            yield lock
        except BaseException:
            if made_state:
                _unmade(out, made)
            raise
    finally:
        os.close(fd)


def _unmade(out: Path, made: Sequence[Path]) -> None:
    """Take back the run state a run that failed before its plan made (its lock and run id),
    and the folders it made (``made``: the output and its parents) while they are empty: a
    mistyped glob or a usage error on a new --out, deep/nested/x too, leaves no folder behind. A
    run that planned keeps everything (a rerun goes on)."""
    folder = state_dir(out)
    with contextlib.suppress(OSError):
        if not {p.name for p in folder.iterdir()} <= {LOCK_NAME, RUN_ID_FILE}:
            return
        for name in (LOCK_NAME, RUN_ID_FILE):
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()
        take_back_folders(list(made))  # only while empty: anything the run left there stays


def current_run(out: Path) -> str | None:
    """The run id of the `prepare` that last took the folder's lock (None if unknown)."""
    try:
        data = json.loads((state_dir(out) / RUN_ID_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return data.get("run") if isinstance(data, dict) else None


def lock_holder(out: Path) -> Holder | None:
    """Who holds the run lock now (None if nobody), without disturbing them.

    (`held_by_another`: never call this in the process that holds the run lock.)
    """
    path = state_dir(out) / LOCK_NAME
    return _settled_holder(path) if held_by_another(path) else None


def _settled_holder(path: Path, tries: int = 5) -> Holder:
    """The held lock's record, read again if it was caught being rewritten (the holder writes
    its progress into it in place, so a read may land in the middle of a write)."""
    for _ in range(tries):
        holder = read_holder(path)
        if holder is not None:
            return holder
        time.sleep(0.01)
    return Holder()


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
        fd = lock_file(path)
        try:
            deadline = time.monotonic() + wait_seconds
            while not try_exclusive(fd, path):
                if time.monotonic() > deadline:
                    raise TokshardError(
                        f"partition {part.key} is still being written by {holder_text(read_holder(path))} "
                        f"after {wait_seconds:.0f} s; stop that process, then rerun"
                    )
                time.sleep(0.2)
            _write_holder(fd, path, Holder.of_this_process(run_id))
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


def spool_path(out: Path, part: Partition) -> Path:
    return state_dir(out) / "spool" / f"{part.source}-{part.split}-{part.index:05d}.spool"


def finish_complete(out: Path, part: Partition, ckpt: Checkpoint) -> None:
    """Complete the renames of a finished partition whose task was killed right after its
    last checkpoint (the driver calls this before it lists the shards in the manifest)."""
    with partition_lock(out, part):
        finalize(out, ckpt.closed)


def remove_work_folders(out: Path, parts: list[Partition]) -> None:
    """Remove the run state's partition and spool folders, and the shard folders the
    partitions would have filled where they are empty (a discarded run's, no task running)."""
    for name in ("parts", "spool"):
        shutil.rmtree(state_dir(out) / name, ignore_errors=True)
    for folder in sorted({(out / p.stem).parent for p in parts}, reverse=True):
        for empty in (folder, folder.parent):
            with contextlib.suppress(OSError):
                if empty != out:
                    empty.rmdir()


def forget_partition(out: Path, part: Partition) -> None:
    """Delete a partition's checkpoint, shards and spool, so that the run redoes it whole."""
    with partition_lock(out, part):
        checkpoint_path(out, part).unlink(missing_ok=True)
        spool_path(out, part).unlink(missing_ok=True)
        stem = out / part.stem
        for path in stem.parent.glob(f"{stem.name}-*"):
            path.unlink(missing_ok=True)
