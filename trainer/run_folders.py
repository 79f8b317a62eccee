"""The folders a run writes: ``--save`` (checkpoints) and the run folder (its record).

The run folder is ``--run-dir``, else ``--save``, else a new ``runs/TIME``. It holds
``run.json`` (how each part of the run was started), ``metrics.jsonl`` (``trainer.metrics``)
and, with ``--log-samples``, ``samples-rankR.jsonl``. Both folders are checked before any
work: local, writable, and holding nothing a fresh run would overwrite.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.format.atomic import check_writable_dir
from pipeline.format.errors import TokshardError
from pipeline.format.store import refuse_url
from trainer.checkpoint.state import latest_tag
from trainer.settings import TrainSettings

RUN_FILE = "run.json"
#: where a run without --run-dir and --save keeps its record
RUNS = Path("runs")


def check_outputs(settings: TrainSettings) -> None:
    """``--save`` and ``--run-dir`` are local folders this process can write, and a fresh run
    finds no checkpoints in ``--save`` (before any work)."""
    save, run_dir = settings.checkpoint.save, settings.log.run_dir
    refuse_url(save, "--save")  # checkpoints go to a (shared) filesystem
    refuse_url(run_dir, "--run-dir")
    if settings.checkpoint.resume and not save:
        raise TokshardError("--resume needs --save DIR: the folder holding the checkpoints")
    if save:
        check_writable_dir(Path(save), "--save")
    if run_dir:
        check_writable_dir(Path(run_dir), "--run-dir")
    latest = latest_tag(Path(save)) if save else None
    if latest and not settings.checkpoint.resume:
        raise TokshardError(
            f"--save {save} already holds checkpoints (latest: {latest}); "
            "pass --resume to continue that run, or choose another --save"
        )


def run_folder(settings: TrainSettings, is_main: bool, broadcast: Callable[[Any], Any]) -> Path:
    """--run-dir, else --save, else runs/TIMESTAMP (rank 0's clock, the same on every rank:
    ``broadcast`` gives rank 0's value to all)."""
    chosen = settings.log.run_dir or settings.checkpoint.save
    if chosen is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        chosen = broadcast(str(RUNS / stamp) if is_main else None)
    run_dir = Path(chosen)
    check_writable_dir(run_dir, "--run-dir")
    return run_dir


def run_record(settings: TrainSettings, **facts: Any) -> dict[str, Any]:
    """RUN_DIR/run.json: how this run (or this part of it) was started."""
    return {"settings": settings.to_json(), **facts}


def recorded_save(run_json: dict[str, Any]) -> str | None:
    """The ``--save`` folder a run.json names (also one written by an older tokshard)."""
    settings = run_json.get("settings")
    if isinstance(settings, dict):
        return (settings.get("checkpoint") or {}).get("save")
    return (run_json.get("args") or {}).get("save")
