"""Loading a checkpoint into a DeepSpeed engine, on the same or another number of ranks.

The sample sequence is global (``trainer.sampler``), so only DeepSpeed's partitioned
optimizer state stands in the way of a resume on another number of data-parallel ranks. When
the checkpoint holds a different number of partitions than there are ranks now, rank 0
converts it once with DeepSpeed's own ``ds_to_universal`` into ``TAG_universal`` and every
rank loads that with ``"checkpoint": {"load_universal": true}``.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from pipeline.format.errors import DataError, TokshardError
from trainer.checkpoint.state import CLIENT_KEY, TrainerState, other_checkpoints

_PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
UNIVERSAL = "_universal"


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
    target = f"{tag}{UNIVERSAL}"
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


def load_into(engine, save_dir: Path, tag: str) -> TrainerState:
    """Load checkpoint ``tag``'s weights and optimizer state into ``engine``; returns its
    trainer state. Weights of another shape are one line (a checkpoint older than the model
    check in ``trainer.checkpoint.resume`` gets here)."""
    try:
        _, client = engine.load_checkpoint(str(save_dir), tag=tag)
    except RuntimeError as exc:
        text = str(exc)
        if "size mismatch" not in text and "key(s) in state_dict" not in text:
            raise damaged(save_dir, tag, exc) from exc
        first = next((ln.strip() for ln in text.splitlines() if "size mismatch" in ln), text.splitlines()[0])
        raise TokshardError(
            f"--resume: {save_dir / tag} holds another model's weights ({first[:200]}); resume with the "
            "--model and --vocab-size it was trained with, or start a new run in another --save"
        ) from exc
    except (OSError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise damaged(save_dir, tag, exc) from exc
    if client is None or CLIENT_KEY not in client:
        raise DataError(
            f"--resume: {save_dir / tag} holds no tokshard data position; {other_checkpoints(save_dir, tag)}"
        )
    return TrainerState.from_json(client[CLIENT_KEY])


def damaged(save_dir: Path, tag: str, exc: BaseException) -> DataError:
    """One line for a checkpoint whose weights or optimizer state cannot be read: which files
    are cut short (a torch file is a zip archive, its directory at the end), what to do."""
    folder = save_dir / tag
    cut = sorted(p.name for p in folder.glob("*.pt") if not zipfile.is_zipfile(p))
    what = f"{', '.join(cut)} cut short or damaged" if cut else " ".join(str(exc).split())[:200]
    return DataError(
        f"--resume: {folder} cannot be loaded ({what}); {other_checkpoints(save_dir, tag.removesuffix(UNIVERSAL))}"
    )
