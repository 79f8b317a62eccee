"""Saving a checkpoint atomically: DeepSpeed's files and the trainer's state, whole or not at all.

DeepSpeed writes into ``TAG.partial``; rank 0 renames it to ``TAG`` and only then points
``latest`` at it (a temporary file renamed over it). A kill or a full disk at any moment
leaves ``latest`` naming a whole checkpoint; a failed save removes its partial folder.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pipeline.format.atomic import disk_error, file_size_limit, fsync_dir, largest_file, write_bytes
from pipeline.format.errors import TokshardError
from trainer.checkpoint.state import (
    CLIENT_KEY,
    LATEST,
    PARTIAL,
    TrainerState,
    interrupted_saves,
    latest_tag,
    write_state,
)
from trainer.distributed import RankLost, lost_a_rank, lost_rank_reason
from trainer.run_folders import run_record_files, same_folder

#: less free space than this after a failed torch.save: the disk ran full
FULL_BELOW = 1 << 20


def write_checkpoint(
    engine,
    save_dir: Path,
    tag: str,
    state: TrainerState,
    is_main: bool,
    barrier: Callable[[], None],
    run_dir: Path | None = None,
) -> None:
    """A DeepSpeed checkpoint, published whole or not at all (see the module's docstring);
    ``run_dir`` holds the run's record, which a failed first save tells to remove."""
    partial = save_dir / (tag + PARTIAL)
    try:
        if is_main:
            clear_interrupted_saves(save_dir)
            partial.mkdir(parents=True)
            write_state(save_dir, partial.name, state)
        barrier()
        engine.save_checkpoint(
            str(save_dir), tag=partial.name, client_state={CLIENT_KEY: state.to_json()}, save_latest=False
        )
        if is_main:
            publish(save_dir, partial, save_dir / tag)
    except (OSError, RuntimeError, TokshardError) as exc:
        lost = lost_a_rank(exc)
        error = None if lost else save_error(exc, save_dir, tag, run_dir)  # before the cleanup frees space
        if is_main:
            shutil.rmtree(partial, ignore_errors=True)
        raise (lost_during_save(exc, save_dir, tag, run_dir) if lost else error) from exc
    barrier()


def clear_interrupted_saves(save_dir: Path) -> None:
    """Remove the partial folders of saves a kill interrupted: ours only (``TAG.partial``), as
    the folder may hold a user's files beside the checkpoints."""
    for stale in interrupted_saves(save_dir):
        shutil.rmtree(save_dir / stale, ignore_errors=True)


def publish(save_dir: Path, partial: Path, final: Path) -> None:
    """Rename the finished checkpoint into place, then point ``latest`` at it (both durable)."""
    for f in partial.iterdir():  # DeepSpeed does not fsync what torch.save wrote
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(partial)
    old = final.with_name(final.name + ".old")
    if final.exists():  # saved once by a run that died before naming it 'latest'
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(partial, final)
    fsync_dir(save_dir)
    write_bytes(save_dir / LATEST, final.name.encode())
    shutil.rmtree(old, ignore_errors=True)


def save_error(exc: BaseException, save_dir: Path, tag: str, run_dir: Path | None = None) -> TokshardError:
    """One line for a checkpoint that could not be written: where, why, what is still there."""
    latest = latest_tag(save_dir)
    kept = f"the last whole checkpoint, {latest}, is kept" if latest else "no earlier checkpoint exists"
    then = (
        f"rerun with --resume to continue from {latest}"
        if latest
        else start_again(run_dir, save_dir, tag + PARTIAL)
    )
    if _past_file_size_limit(exc, save_dir):
        bound = largest_file()[0]
        return TokshardError(
            f"checkpoint not saved: cannot write {save_dir / tag}: it would grow past {bound}; nothing of it "
            f"was kept and {kept}; raise it (ulimit -f unlimited), then {then}"
        )
    if isinstance(exc, OSError):
        reason = str(disk_error(exc, save_dir / tag)).split(";")[0]
    elif isinstance(exc, TokshardError):
        reason = str(exc).split(";")[0]
    else:  # torch.save reports a full disk as "unexpected pos ..." or "file write failed"
        free = shutil.disk_usage(save_dir).free if save_dir.is_dir() else None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if free is not None and free < FULL_BELOW:
            reason = f"disk full writing {save_dir / tag} ({free / 2**20:.1f} MiB free)"
        else:
            where = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
            reason = f"cannot write {save_dir / tag} ({first}; {where})"
    return TokshardError(
        f"checkpoint not saved: {reason}; nothing of it was kept and {kept}; free space there, then {then}"
    )


def _past_file_size_limit(exc: BaseException, save_dir: Path) -> bool:
    """Whether a failed save met this process's file size limit (``ulimit -f``): an OSError
    says so (EFBIG), torch.save only that a write fell short ("unexpected pos"), as on a full
    disk, which a disk with room left rules out."""
    if file_size_limit() is None:
        return False
    if isinstance(exc, OSError):
        return exc.errno == errno.EFBIG
    return not isinstance(exc, TokshardError) and (
        not save_dir.is_dir() or shutil.disk_usage(save_dir).free >= FULL_BELOW
    )


def lost_during_save(exc: BaseException, save_dir: Path, tag: str, run_dir: Path | None) -> RankLost:
    """One line for a save that another rank's loss cut short (said after the cleanup, which
    only rank 0 does: what is on disk is looked at, not assumed): what happened, what of the
    save is left, and how the run goes on (every rank started again)."""
    partial = save_dir / (tag + PARTIAL)
    left = (
        f"its unfinished {partial} is left (the next save or start removes it)"
        if partial.exists()
        else "nothing of it was kept"
    )
    latest = latest_tag(save_dir)
    kept = f"the last whole checkpoint, {latest}, is kept" if latest else "no earlier checkpoint exists"
    then = f"rerun with --resume to continue from {latest}" if latest else start_again(run_dir, save_dir)
    return RankLost(
        f"checkpoint not saved: another rank of the run was lost during the save of {save_dir / tag} "
        f"({lost_rank_reason(exc)}); {left} and {kept}; {then}"
    )


def start_again(run_dir: Path | None, save_dir: Path, gone: str | None = None) -> str:
    """How to start over after a failed first save: the same command, which replaces this
    run's record and the unfinished saves left in --save (`trainer.run_folders.start_over`);
    ``gone``: the one this failure's cleanup removes."""
    record = run_record_files(run_dir) if run_dir is not None else []
    if run_dir is None or not record:
        return "run the same command again"
    saves = [name for name in interrupted_saves(save_dir) if name != gone]
    if same_folder(run_dir, save_dir):
        left = f"{', '.join(record + saves)} in {run_dir}"
    else:
        left = f"{', '.join(record)} in {run_dir}" + (
            f" and {', '.join(saves)} in {save_dir}" if saves else ""
        )
    return f"run the same command again (it starts over, replacing {left})"
