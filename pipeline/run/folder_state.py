"""`FolderState`: the `RunState` of a prepare into a folder (local, or shared by every worker).

Workers write shards and checkpoints straight into the folder, committing inside partitions
(`pipeline.run.worker_task`), so a rerun resumes a partial partition from its last commit. The
files and locks are those of `pipeline.run.folder_layout`.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.encoding import tokenizer
from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import disk_error, missing_folders
from pipeline.format.errors import TokshardError
from pipeline.format.shard_writer import kept_problem, untraced_work
from pipeline.run import folder_layout
from pipeline.run.records import Checkpoint, Holder, Plan
from pipeline.run.run_state import OWN_MARKER, HeldRun, Log, RunState
from pipeline.run.worker_task import run_partition, warm_up
from pipeline.sources.base import Partition
from pipeline.storage.local_folder import LocalFolder
from pipeline.storage.ownership import claim_folder

#: threads hashing kept shards at a rerun's start (the work is mostly reading)
HASH_THREADS = 4


class FolderState(RunState):
    """The run state under ``OUT/.tokshard/`` of a local (or shared) folder."""

    resumes_partials = True
    poll_seconds = 0.5
    work = staticmethod(run_partition)
    warm = staticmethod(warm_up)

    def __init__(self, place: LocalFolder) -> None:
        self.place = place
        self.out: Path = place.path("")
        #: the folders this run made, the output and its missing parents, deepest first (a run
        #: that fails at once takes them back)
        self.made: list[Path] = []

    @property
    def manifest_location(self) -> Path:
        return self.out / manifest_mod.MANIFEST_NAME

    def open_for_writing(self) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise TokshardError(f"output {self.out} is a file, not a folder; choose another --out")
        claim_folder(self.place, "--out", "prepare", OWN_MARKER, proof=folder_layout.LOCK_NAME)
        self.made = missing_folders(self.out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, self.manifest_location) from exc

    def check_readable(self) -> None:
        if not self.out.exists():
            raise TokshardError(f"{self.out} does not exist; pass the --out folder of a prepare run")
        if not self.out.is_dir():
            raise TokshardError(f"{self.out} is not a folder; pass the --out folder of a prepare run")

    def hold(self, run_id: str, log: Log) -> contextlib.AbstractContextManager[HeldRun]:
        return folder_layout.run_lock(self.out, run_id, self.made)

    def holder(self) -> Holder | None:
        return folder_layout.lock_holder(self.out)

    def remove_leftovers(self) -> int:
        return len(folder_layout.remove_leftovers(self.out))

    def manifest_doc(self) -> dict[str, Any] | None:
        """The manifest's content if it loads as a whole manifest (None otherwise)."""
        if not self.manifest_location.is_file():
            return None
        try:
            return manifest_mod.load(self.manifest_location).data
        except TokshardError:
            return None

    def load_checkpoint(self, part: Partition) -> Checkpoint | None:
        return folder_layout.load_checkpoint(self.out, part)

    def kept_problems(
        self, plan: Plan, checkpoints: dict[str, Checkpoint | None], hashes: bool = True
    ) -> dict[str, str]:
        kept = [(key, ck) for key, ck in checkpoints.items() if ck is not None and ck.closed]
        if not kept:
            return {}
        with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
            problems = pool.map(lambda item: kept_problem(self.out, item[1].closed, hashes), kept)
            return {key: p for (key, _), p in zip(kept, problems, strict=True) if p is not None}

    def untraced_partials(self, plan: Plan, checkpoints: dict[str, Checkpoint | None]) -> dict[str, str]:
        """Each partial checkpoint's shards read as they are now: one that changed meanwhile is
        being written by a live task (this tokshard's), whose rotation deleted the open shard's
        logs the checkpoint read before named, so it is not counted."""
        found = {}
        for part in plan.partitions:
            ck = checkpoints[part.key]
            if ck is not None and not ck.complete:
                why = untraced_work(self.out, part.stem, ck.closed, ck.open)
                if why is not None and self.load_checkpoint(part) == ck:
                    found[part.key] = why
        return found

    def forget_partition(self, part: Partition) -> None:
        folder_layout.forget_partition(self.out, part)

    def discard_run(self, plan: Plan) -> None:
        super().discard_run(plan)
        folder_layout.remove_work_folders(self.out, plan.partitions)

    def finished_checkpoints(self, plan: Plan) -> list[Checkpoint]:
        finished = []
        for part in plan.partitions:
            ck = self.load_checkpoint(part)
            if ck is None or not ck.complete:
                raise TokshardError(f"partition {part.key} did not finish; rerun to resume")
            if not all((self.out / rec.path).exists() for rec in ck.closed):
                # its task was killed between the checkpoint and the renames
                folder_layout.finish_complete(self.out, part, ck)
            finished.append(ck)
        return finished

    @property
    def task_out(self) -> str:
        return str(self.out.resolve())

    def install_tokenizer(self, src: Path, tok: tokenizer.TokenizerInfo) -> Path:
        return tokenizer.install(src, tok, self.out)

    def worker_tokenizer(self, sha256: str) -> str:
        return str((self.out / tokenizer.TOKENIZER_FILE).resolve())

    def after_manifest(self) -> None:
        for stray in folder_layout.state_dir(self.out).glob("spool/*"):
            stray.unlink(missing_ok=True)
