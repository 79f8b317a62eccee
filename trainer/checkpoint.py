"""DeepSpeed checkpoints that carry the data position, and resuming from them.

Each save is a DeepSpeed checkpoint tag ``stepNNNNNNNN`` under ``--save DIR`` whose
``client_state["tokshard"]`` holds the trainer state: step, samples consumed, seed, per-source
epochs, sequence length, mixture, the manifest's fingerprint, the schedule's segments
(``trainer.schedule``) and from which step each global batch size held (``batches``), which
together map any step to its samples (``tokshard samples``). Rank 0 also writes the same
dict to ``DIR/TAG/tokshard.json`` so a resume can check it before any process group or model
exists (and people can read it).

A save is atomic: DeepSpeed writes into ``TAG.partial``, rank 0 renames it to ``TAG`` and only
then points ``latest`` at it (a temporary file renamed over it). A kill or a full disk at any
moment leaves ``latest`` naming a whole checkpoint; a failed save removes its partial folder.

A resume checks, before any model exists, that the model (name and embedding rows) and the
global batch are the checkpoint's: another model cannot load its weights, another batch would
change how many samples each step trains on (``--allow-batch-change`` accepts that).

Changing the number of data-parallel ranks: the sample sequence is global (see
``trainer.sampler``), so only DeepSpeed's partitioned optimizer state is in the way. When the
checkpoint holds a different number of partitions than there are ranks now, rank 0 converts
it once with DeepSpeed's own ``ds_to_universal`` into ``TAG_universal`` and every rank loads
that with ``"checkpoint": {"load_universal": true}``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.format.atomic import disk_error, fsync_dir, write_bytes, write_json
from pipeline.format.errors import TokshardError

STATE_FILE = "tokshard.json"
CLIENT_KEY = "tokshard"
PARTIAL = ".partial"
#: less free space than this after a failed torch.save: the disk ran full
FULL_BELOW = 1 << 20
_PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def latest_tag(save_dir: Path) -> str | None:
    latest = save_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def read_state(save_dir: Path) -> tuple[str, dict[str, Any]]:
    """The tag ``latest`` names and its trainer state; a clear error if there is none."""
    tag = latest_tag(save_dir)
    if tag is None:
        raise TokshardError(
            f"--resume: no checkpoint in {save_dir} (no 'latest' file); drop --resume to start fresh"
        )
    path = save_dir / tag / STATE_FILE
    try:
        return tag, json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TokshardError(
            f"--resume: {path} is missing or damaged, so the data position is unknown; "
            "resume from another tag or start fresh"
        ) from exc


def write_state(save_dir: Path, tag: str, state: dict[str, Any]) -> None:
    write_json(save_dir / tag / STATE_FILE, state)


def check_compatible(
    saved: dict[str, Any], now: dict[str, Any], allow_data_change: bool, source_diffs: list[str] = ()
) -> list[str]:
    """What differs between the checkpoint's data and this run's; an error unless allowed.

    A changed mixture or added sources are not differences here: the schedule continues every
    source (``trainer.schedule``). ``source_diffs`` are the sources whose content changed or that
    are gone. Returns the differences that were allowed, for the log."""
    names = {"seq_len": "--seq-len", "train_split": "--train-split"}
    diffs = [
        f"{label}: checkpoint {saved['data'].get(key)!r}, now {now['data'].get(key)!r}"
        for key, label in names.items()
        if saved["data"].get(key) != now["data"].get(key)
    ]
    diffs += list(source_diffs)
    if diffs and not allow_data_change:
        raise TokshardError(
            "--resume: the checkpoint was trained on different data ("
            + "; ".join(diffs)
            + "); resuming would not continue its sample sequence. Pass --allow-data-change to resume anyway"
        )
    return diffs


def check_model(saved: dict[str, Any], name: str, vocab_size: int) -> None:
    """The checkpoint's weights fit this model: same ``--model`` and embedding rows."""
    was_name, was_vocab = saved.get("model"), saved.get("vocab_size")
    if (was_name is not None and was_name != name) or (was_vocab is not None and was_vocab != vocab_size):
        raise TokshardError(
            f"--resume: the checkpoint holds model {was_name} with {was_vocab or '?'} embedding rows, this run "
            f"builds {name} with {vocab_size}; resume with --model {was_name}"
            + (f" --vocab-size {was_vocab}" if was_vocab else "")
            + ", or start a new run in another --save"
        )


def check_batch(saved: dict[str, Any], global_batch: int, how: str, allow: bool) -> None:
    """The global batch is the checkpoint's, unless ``--allow-batch-change`` says otherwise."""
    was = saved.get("train_batch_size")
    if was is None or was == global_batch or allow:
        return
    raise TokshardError(
        f"--resume: the global batch would be {global_batch} ({how}), the checkpoint's is {was}: each step "
        f"would train on another number of samples; pass --global-batch {was} to keep it, or "
        "--allow-batch-change to change it"
    )


def save(
    engine, save_dir: Path, tag: str, state: dict[str, Any], is_main: bool, barrier: Callable[[], None]
) -> None:
    """A DeepSpeed checkpoint, published whole or not at all (see the module's docstring)."""
    partial = save_dir / (tag + PARTIAL)
    try:
        if is_main:
            for stale in save_dir.glob(f"*{PARTIAL}"):  # a save that a kill interrupted
                shutil.rmtree(stale, ignore_errors=True)
            partial.mkdir(parents=True)
            write_state(save_dir, partial.name, state)
        barrier()
        engine.save_checkpoint(
            str(save_dir), tag=partial.name, client_state={CLIENT_KEY: state}, save_latest=False
        )
        if is_main:
            publish(save_dir, partial, save_dir / tag)
    except (OSError, RuntimeError, TokshardError) as exc:
        error = save_error(exc, save_dir, tag)  # before the cleanup frees the space it ran out of
        if is_main:
            shutil.rmtree(partial, ignore_errors=True)
        raise error from exc
    barrier()


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
    write_bytes(save_dir / "latest", final.name.encode())
    shutil.rmtree(old, ignore_errors=True)


def save_error(exc: BaseException, save_dir: Path, tag: str) -> TokshardError:
    """One line for a checkpoint that could not be written: where, why, what is still there."""
    latest = latest_tag(save_dir)
    kept = f"the last whole checkpoint, {latest}, is kept" if latest else "no earlier checkpoint exists"
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
        f"checkpoint not saved: {reason}; nothing of it was kept and {kept}; free space or choose "
        "another --save, then --resume"
    )


def partitions(tag_dir: Path) -> int:
    """Data-parallel partitions of the optimizer state in a checkpoint (0: not partitioned)."""
    ranks = {int(m.group(1)) for p in tag_dir.iterdir() if (m := _PARTITION.match(p.name))}
    return len(ranks)


def universal_tag(save_dir: Path, tag: str, world: int, rank: int, broadcast) -> str | None:
    """If the checkpoint's partitions do not match ``world``, convert it (rank 0) to a
    universal checkpoint and return that tag to load with ``load_universal``; else None.

    ``broadcast(obj)`` returns rank 0's ``obj`` on every rank (a failure reaches all ranks)."""
    parts = partitions(save_dir / tag)
    if parts in (0, world):
        return None
    target = f"{tag}_universal"
    done_marker = save_dir / target / "tokshard-converted"
    error = None
    if rank == 0 and not done_marker.is_file():
        print(
            f"tokshard: checkpoint {tag} was written by {parts} data-parallel ranks, now {world}: "
            "converting it to a DeepSpeed universal checkpoint",
            flush=True,
        )
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
        cmd += ["--input_folder", str(save_dir / tag), "--output_folder", str(save_dir / target)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode == 0:
            done_marker.write_text(f"converted from {tag} for {world} ranks\n")
        else:
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            error = (
                f"--resume: converting {save_dir / tag} for {world} ranks failed ({tail[0]}); "
                f"resume with {parts} ranks instead"
            )
    error = broadcast(error)
    if error:
        raise TokshardError(error)
    return target


def batch_history(saved: dict[str, Any] | None, step: int, samples: int, global_batch: int) -> list[dict]:
    """From which step (and sample) each global batch size held: maps any step to its positions.

    A checkpoint without it had one global batch from step 0."""
    if saved is None:
        return [{"step": 0, "samples": 0, "global_batch": global_batch}]
    history = list(
        saved.get("batches") or [{"step": 0, "samples": 0, "global_batch": saved["train_batch_size"]}]
    )
    if history[-1]["global_batch"] != global_batch:
        if history[-1]["step"] == step:
            history.pop()
        history.append({"step": step, "samples": samples, "global_batch": global_batch})
    return history


def step_start(batches: list[dict], step: int) -> tuple[int, int]:
    """First position and global batch of optimizer step ``step`` (1-based, as metrics.jsonl)."""
    entry = max((b for b in batches if b["step"] < step), key=lambda b: b["step"])
    return entry["samples"] + (step - 1 - entry["step"]) * entry["global_batch"], entry["global_batch"]
