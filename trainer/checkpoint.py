"""DeepSpeed checkpoints that carry the data position, and resuming from them.

Each save is a DeepSpeed checkpoint tag ``stepNNNNNNNN`` under ``--save DIR`` whose
``client_state["tokshard"]`` holds the trainer state: step, samples consumed, seed, per-source
epochs, sequence length, mixture, the manifest's fingerprint, the schedule's segments
(``trainer.schedule``) and from which step each global batch size held (``batches``), which
together map any step to its samples (``tokshard samples``). Rank 0 also writes the same
dict to ``DIR/TAG/tokshard.json`` so a resume can check it before any process group or model
exists (and people can read it).

Changing the number of data-parallel ranks: the sample sequence is global (see
``trainer.sampler``), so only DeepSpeed's partitioned optimizer state is in the way. When the
checkpoint holds a different number of partitions than there are ranks now, rank 0 converts
it once with DeepSpeed's own ``ds_to_universal`` into ``TAG_universal`` and every rank loads
that with ``"checkpoint": {"load_universal": true}``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.atomic import write_json
from pipeline.errors import TokshardError

STATE_FILE = "tokshard.json"
CLIENT_KEY = "tokshard"
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
