"""`RunState`: one interface to a `prepare` run's state, wherever its output lives.

The driver (`pipeline.run.driver.prepare`), `tokshard status` and the demo read and write a
run only through it. Two implementations: `FolderState` (`pipeline.run.folder_state`, a local
or shared folder: POSIX locks, commit points inside partitions) and `StoreState`
(`pipeline.run.store_state`, an object store: a lease object, whole partitions uploaded from a
worker's scratch folder). `pipeline.run.open_state.open_run_state` picks one, once, from the
``--out`` location.

Both keep the same layout, relative to the output location::

    manifest.json, tokenizer.json, SRC/SPLIT/NNNNN-SSSS.{bin,idx}   what readers see
    .tokshard/run.json                   the plan (`Plan`)
    .tokshard/parts/SRC/SPLIT/NNNNN.json a partition's checkpoint (`Checkpoint`)

and what differs (locks, scratch, progress records) is each implementation's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pipeline.encoding.spec import EncoderSpec
from pipeline.encoding.tokenizer import TOKENIZER_FILE, TokenizerInfo
from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import json_bytes
from pipeline.format.errors import TokshardError
from pipeline.run.records import Checkpoint, Holder, Plan
from pipeline.sources.base import Partition
from pipeline.storage.ownership import PREPARE_STATE
from pipeline.storage.place import Place

STATE_DIR = PREPARE_STATE
PLAN_FILE = f"{STATE_DIR}/run.json"
#: the entry that makes an output location a prepare's own (`pipeline.storage.ownership`)
OWN_MARKER = f"{STATE_DIR}/"
#: `RunState.manifest_problem` of an output with no manifest
MANIFEST_MISSING = "missing"

Log = Callable[[str], None]


def inputs_needed(refusal: str, location: str, problem: str) -> str:
    """A rerun's ``refusal`` for an input gone or changed, said for a finished run whose
    manifest is ``problem`` (`RunState.manifest_problem`): writing it needs the inputs as they
    were (the encoder check reads their first documents), so a new --out cannot help."""
    what = refusal.rsplit("; ", 1)[0]
    manifest = "is missing" if problem == MANIFEST_MISSING else f"is not the one the run wrote ({problem})"
    return (
        f"{what}; every partition of {location} is done, but its manifest {manifest}, and writing it "
        "needs the inputs as they were (the encoder check reads their first documents): restore it, "
        "then rerun"
    )


def checkpoint_rel(part: Partition) -> str:
    """Where a partition's checkpoint lives, relative to the output location."""
    return f"{STATE_DIR}/parts/{part.stem}.json"


class HeldRun(Protocol):
    """The driver's hold on a run (lock or lease): it can tell `status` how the run goes."""

    def report(self, tokens_per_s: float, eta_s: float | None) -> None: ...


class RunState(ABC):
    """The state of one `prepare` output location: plan, checkpoints, lock, shards, manifest."""

    place: Place
    #: whether a partition's partial checkpoint is resumed from (True) or redone whole (False)
    resumes_partials: bool = True
    #: whether hashing the shards a rerun keeps reads local files (a folder: every rerun, and
    #: `status`, hash them) or downloads each (a store: only a rerun that writes the manifest
    #: again hashes them, since that manifest vouches for their content; it says so)
    hashes_locally: bool = True
    #: how often the driver reads running partitions' progress for its progress line
    poll_seconds: float = 0.5
    #: the manifest this object wrote, sealed, as written (None: none yet): what `prepare`
    #: reports without reading back, and checking again, the file it has just written
    written_manifest: dict[str, Any] | None = None

    @property
    def location(self) -> str:
        """How messages name the output (a path or URL)."""
        return self.place.url

    @property
    @abstractmethod
    def manifest_location(self) -> Path | str:
        """Where the manifest is (a `Path` for a folder, a URL for a store)."""

    # --- opening and holding --------------------------------------------------------------

    @abstractmethod
    def open_for_writing(self) -> None:
        """Check, before anything is written, that a prepare may write here (a new or empty
        location, or one holding its own run state); make the folder."""

    @abstractmethod
    def check_readable(self) -> None:
        """Check that the location can be read (a folder that exists, a store that answers)."""

    @abstractmethod
    def hold(self, run_id: str, log: Log) -> contextlib.AbstractContextManager[HeldRun]:
        """Hold the run for its duration; a second `prepare` meanwhile is refused."""

    @abstractmethod
    def holder(self) -> Holder | None:
        """Who holds the run now (None if nobody), without disturbing them."""

    def remove_leftovers(self) -> int:
        """Delete what interrupted writes left (called while holding the run); how many."""
        return 0

    # --- the plan ------------------------------------------------------------------------

    def load_plan(self) -> Plan | None:
        data = self.place.read_bytes(PLAN_FILE)
        return None if data is None else Plan.parse(data, self.place.where(PLAN_FILE), self.location)

    def save_plan(self, plan: Plan) -> None:
        self.place.write_bytes(PLAN_FILE, json_bytes(plan.to_json(), compact=True))

    def discard_run(self, plan: Plan) -> None:
        """Delete the checkpoints, the partitions' files and the plan of a fresh run refused
        before it wrote a token (no task of it runs any more). A partition stopped before its
        first commit has no checkpoint, but may have left shard files (``.tmp``) or a progress
        record: those go too."""
        for part in plan.partitions:
            if self.load_checkpoint(part) is not None:
                self.forget_partition(part)
        self._delete_partition_files(plan.partitions)
        self.remove_leftovers()
        self.place.delete(PLAN_FILE)

    def _delete_partition_files(self, parts: list[Partition]) -> None:
        """Every file named after one of ``parts`` (``NNNNN-*`` in its output folder): one
        listing per folder, however many partitions."""
        stems: dict[str, set[str]] = {}
        for part in parts:
            folder, _, name = part.stem.rpartition("/")
            stems.setdefault(folder, set()).add(f"{name}-")
        for folder, prefixes in stems.items():
            for rel in self.place.list(folder):
                parent, _, name = rel.rpartition("/")
                if parent == folder and name[: name.find("-") + 1] in prefixes:
                    self.place.delete(rel)

    # --- checkpoints ---------------------------------------------------------------------

    def load_checkpoint(self, part: Partition) -> Checkpoint | None:
        rel = checkpoint_rel(part)
        data = self.place.read_bytes(rel)
        return None if data is None else Checkpoint.parse(data, part, self.place.where(rel))

    def load_checkpoints(self, plan: Plan) -> dict[str, Checkpoint | None]:
        """Every partition's checkpoint (None: not started)."""
        return {p.key: self.load_checkpoint(p) for p in plan.partitions}

    def read_progress(self, part: Partition) -> Checkpoint | None:
        """A running partition's latest commit, for the progress line (None: none yet)."""
        return self.load_checkpoint(part)

    def load_progress(self, plan: Plan, finished: bool = False) -> dict[str, Checkpoint | None]:
        """Every partition's latest known state, finished or running (for `status`);
        ``finished``: the run wrote its manifest, so every partition has its checkpoint."""
        return self.load_checkpoints(plan)

    @abstractmethod
    def kept_problems(
        self, plan: Plan, checkpoints: dict[str, Checkpoint | None], hashes: bool = True
    ) -> dict[str, str]:
        """Partition key -> what is wrong with a shard its checkpoint keeps (missing, another
        size, with ``hashes`` other content: see `hashes_locally`), for every partition where
        something is."""

    def untraced_partials(self, plan: Plan, checkpoints: dict[str, Checkpoint | None]) -> dict[str, str]:
        """Partition key -> why, for each partial partition whose committed work carries no
        provenance (begun by an older tokshard): resumed, its documents would have no places,
        so the run redoes it whole. None here: only a state that `resumes_partials` has any."""
        return {}

    @abstractmethod
    def forget_partition(self, part: Partition) -> None:
        """Delete a partition's checkpoint and shards, so that the run redoes it whole."""

    @abstractmethod
    def finished_checkpoints(self, plan: Plan) -> list[Checkpoint]:
        """Every partition's final checkpoint, in plan order, each of its shards in place."""

    # --- what workers need ---------------------------------------------------------------

    @property
    @abstractmethod
    def task_out(self) -> str:
        """The output as a worker's task names it (a resolved path or the URL)."""

    #: what a worker runs for one task (a module-level function: Dask sends it by name)
    work: Callable[[Any], Checkpoint]
    #: what a booting worker runs to build its encoder (an `EncoderSpec`) ahead of the first task
    warm: Callable[[EncoderSpec], None]

    @abstractmethod
    def install_tokenizer(self, src: Path, tok: TokenizerInfo) -> Path:
        """Put the run's tokenizer.json beside the manifest; returns a local copy's path."""

    def tokenizer_problem(self, sha256: str, hashes: bool = True) -> str | None:
        """What is wrong with the run's tokenizer.json beside the manifest: "missing", or (with
        ``hashes``, which reads it whole) "changed" from the plan's ``sha256``; None if nothing."""
        if not hashes:
            return None if self.place.exists(TOKENIZER_FILE) else "missing"
        data = self.place.read_bytes(TOKENIZER_FILE)
        if data is None:
            return "missing"
        return "changed" if hashlib.sha256(data).hexdigest() != sha256 else None

    def restore_tokenizer(self, src: Path, tok: TokenizerInfo, log: Log) -> None:
        """Before the manifest is written: the run's tokenizer.json there, with the content the
        plan records (deleted or replaced while the run went on, it is put back from ``src``,
        the tokenizer the run was given), so that no manifest is published beside a tokenizer
        `verify` would call missing or wrong."""
        where = self.place.where(TOKENIZER_FILE)
        problem = self.tokenizer_problem(tok.sha256)
        if problem is None:
            return
        happened = "was deleted" if problem == "missing" else "was replaced by another file"
        log(f"{where} {happened} while the run went on; putting the run's tokenizer back")
        self.install_tokenizer(src, tok)
        problem = self.tokenizer_problem(tok.sha256)
        if problem is not None:
            raise TokshardError(
                f"{where} is {problem} again right after it was put back, so no manifest was written; "
                "stop whatever else writes to the output, then rerun"
            )

    def remove_tokenizer(self) -> None:
        """Take back the tokenizer put beside the manifest for a run that could not be planned
        (a fresh run puts it there first, for its workers to build from while it plans)."""
        self.place.delete(TOKENIZER_FILE)

    @abstractmethod
    def worker_tokenizer(self, sha256: str) -> str:
        """The path a worker of this machine builds its encoder from."""

    # --- the manifest --------------------------------------------------------------------

    def holds_its_manifest(self, plan: Plan) -> bool:
        """Whether the output holds this run's own manifest, as the run wrote it (a rerun after
        the end; one that is missing, damaged, edited, or another run's, is written again)."""
        return self.manifest_problem(plan) is None

    def manifest_problem(self, plan: Plan) -> str | None:
        """What keeps the manifest here from being the one this run wrote ("missing", cut short,
        edited since: `manifest_mod.seal_problem`, or another run's); None if it is that one."""
        data = self.place.read_bytes(manifest_mod.MANIFEST_NAME)
        if data is None:
            return MANIFEST_MISSING
        try:
            doc = json.loads(data)
        except ValueError:
            return "not readable JSON: cut short or damaged"
        problem = manifest_mod.seal_problem(doc)
        if problem is None and doc.get("recipe_hash") != plan.identity_hash:
            problem = "another run's (its recipe_hash is not this run's)"
        return problem

    def manifest_doc(self) -> dict[str, Any] | None:
        """The manifest's content (None: none, or not readable as JSON)."""
        data = self.place.read_bytes(manifest_mod.MANIFEST_NAME)
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def write_manifest(self, doc: dict[str, Any]) -> Path | str:
        """Seal and write the manifest whole, last; returns where it is."""
        sealed = manifest_mod.sealed(doc)
        self.place.write_bytes(manifest_mod.MANIFEST_NAME, json_bytes(sealed))
        self.written_manifest = sealed
        self.after_manifest()
        return self.manifest_location

    @abstractmethod
    def after_manifest(self) -> None:
        """Clean what the run kept only while it was unfinished."""
