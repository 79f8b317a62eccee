"""The `prepare` driver: plan once, run unfinished partitions on Dask, write the manifest.

One driver for every output location: it works on a `RunState`
(`pipeline.run.run_state`), a folder's or a store's, chosen once from ``--out``. It holds
the run (lock or lease), fixes the plan on the first run (partitions, pinned origins,
tokenizer), checks the shards a rerun keeps, submits one task per unfinished partition and
only ever receives small checkpoints back. The manifest is written last, from the
checkpoints, so it appears exactly when every partition is done, whatever happened in
between.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.encoding import check_cache, tokenizer
from pipeline.encoding.equivalence import SAMPLE_DOC_CHARS
from pipeline.encoding.selection import Decision, decide, warm_likely
from pipeline.encoding.spec import EncoderSpec
from pipeline.format import manifest
from pipeline.format.atomic import DiskFullError, FileTooLargeError
from pipeline.format.errors import DataError, TokshardError, counted
from pipeline.recipe import Recipe
from pipeline.run import process_limits
from pipeline.run.cluster import (
    ClusterLost,
    EarlyStart,
    connect,
    killed_advice,
    scheduler_address,
    scheduler_lost,
)
from pipeline.run.code_check import check_workers, gated, refusal
from pipeline.run.open_state import open_run_state
from pipeline.run.progress import CostModel, Progress, human, stderr_log
from pipeline.run.records import Checkpoint, Plan
from pipeline.run.run_state import MANIFEST_MISSING, HeldRun, RunState, inputs_needed
from pipeline.run.worker_task import PartitionTask, current_umask, encode_texts
from pipeline.sources import build_source
from pipeline.sources.base import (
    BadRecord,
    Partition,
    check_folder_names_differ,
    check_path_name,
    check_read_once,
    gc_paused,
)
from pipeline.sources.files import TextPieces
from pipeline.sources.hub import HubUnreachable

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    workers: int | None = None
    scheduler: str | None = None
    memory_limit: str | None = None
    dashboard: bool = False  # local workers only: a --scheduler has its own
    client: Any = None  # an existing distributed.Client (tests, notebooks)
    progress_interval: float = 10.0
    batch: Any = None  # pipeline.run.cluster.BatchJobs for --cluster slurm|pbs
    #: tasks submitted and not yet finished, at most (None: `in_flight` of the cluster's threads)
    max_in_flight: int | None = None


#: tasks kept submitted per worker thread, and at least: enough to keep every worker busy
#: while the driver and the scheduler hold per-task state for these only, not for every
#: partition of a run (hundreds of thousands for 10 TB)
IN_FLIGHT_PER_THREAD = 4
MIN_IN_FLIGHT = 256


def prepare(
    recipe: Recipe,
    out: str | os.PathLike | RunState,
    options: RunOptions | None = None,
    log: Log = stderr_log,
) -> Path | str:
    """Run (or resume) a recipe into ``out`` (a folder, a store URL, or its `RunState`);
    returns where the manifest is (a `Path` for a folder, a URL for a store)."""
    options = options or RunOptions()
    settings = recipe.settings
    # before the output is touched: a wrong --tokenizer leaves no folder behind
    src, tok = check_cache.resolve_tokenizer(
        settings.tokenizer, settings.eos_token, settings.dtype, settings.bos_token
    )
    if options.scheduler is not None:  # a mistyped address too, without waiting on a connection
        scheduler_address(options.scheduler)
    process_limits.check(_local_workers(options), settings.threads)
    state = open_run_state(out)
    state.open_for_writing()
    run_id = uuid.uuid4().hex[:12]
    with state.hold(run_id, log) as held:
        leftovers = state.remove_leftovers()
        if leftovers:
            log(f"removed {leftovers} temporary files of interrupted writes")
        recipe.pin_tokenizer(tok)
        plan = state.load_plan()
        fresh = plan is None
        sub: Submission | None = None  # the tasks, once submitted
        try:
            # a fresh run needs its workers: they boot while the driver plans (many small files:
            # planning is most of the time before the first task), and build the likely encoder
            early = _early_workers(options, settings.threads) if plan is None else None
            try:
                if early is not None:  # a fresh run: its tokenizer goes in now, for the workers
                    state.install_tokenizer(src, tok)
                    warm_likely(
                        settings.encoder,
                        state.worker_tokenizer(tok.sha256),
                        tok.sha256,
                        settings.threads,
                        EarlyWorkers(early, state.warm),
                    )
                try:
                    plan = _checked_or_new_plan(plan, recipe, state, tok, log)
                except BaseException:
                    if early is not None:  # a fresh run that could not be planned leaves none behind
                        with contextlib.suppress(Exception):  # (the planning's error is the one to say)
                            state.remove_tokenizer()
                    raise
                if early is None:  # a rerun's, once its plan is found to be this recipe's
                    state.install_tokenizer(src, tok)
                checkpoints = state.load_checkpoints(plan)
                problem = state.manifest_problem(plan)
                rewrite = problem is not None and all(
                    ck is not None and ck.complete for ck in checkpoints.values()
                )
                if rewrite:
                    _say_manifest_rewrite(state, problem, checkpoints, log)
                if problem is None:
                    damaged = state.kept_problems(plan, checkpoints, hashes=False)
                    if not damaged:
                        log(
                            f"{state.location} is already complete ({state.manifest_location}); nothing to do"
                        )
                        _say_untraced([ck for ck in checkpoints.values() if ck is not None], log)
                        return state.manifest_location
                    log(
                        f"{state.location} is complete, but {len(damaged)} partitions' shards are missing or "
                        f"cut since ({next(iter(damaged.values()))}); redoing them and writing the manifest again"
                    )
                _redo_damaged(state, plan, checkpoints, log, hashes=state.hashes_locally or rewrite)
                _restart_untraced(state, plan, checkpoints, log)
                todo = [
                    p for p in plan.partitions if not (checkpoints[p.key] and checkpoints[p.key].complete)
                ]
                resumed = sum(1 for p in todo if checkpoints[p.key] is not None)
                if early is None and todo:
                    early = _early_workers(options, settings.threads)
                if early is not None:
                    early.planned(len(todo))
                sha256 = plan.tokenizer["sha256"]
                decision = decide(
                    settings.encoder,
                    state.worker_tokenizer(sha256),
                    lambda: _samples(plan, recipe),
                    sha256=sha256,
                    threads=settings.threads,
                    workers=EarlyWorkers(early, state.warm) if early is not None else None,
                )
                log(decision.log_line())
                if tok.bos_unused:  # said once the run goes on: a refusal is its one line
                    log(
                        f"note: tokenizer {settings.tokenizer} starts each text with {tok.bos_unused!r}; documents "
                        "here start with their own text (encode(doc) + [EOS]): pass --bos-token auto to write it"
                    )
                if todo:
                    log(
                        f"{counted(len(plan.partitions), 'partition')}: {len(plan.partitions) - len(todo)} done, "
                        f"{resumed} to resume, {len(todo) - resumed} to start"
                    )
                    tasks = [_task(recipe, state, plan, p, run_id, decision.spec) for p in todo]
                    if early is not None:
                        early.wait_ready()
                    sub = Submission(tasks, todo, checkpoints, plan, state, held)
                    with _heap_frozen():
                        _run(sub, options, log, early)
            finally:
                if early is not None:
                    early.discard()
            finished = state.finished_checkpoints(plan)
            state.restore_tokenizer(src, tok, log)  # deleted or replaced while the run went on
            doc = manifest_doc(recipe, plan, finished, decision)
            path = state.write_manifest(doc)
            log(f"wrote {path}")
            _say_untraced(finished, log)
            return path
        except Exception as exc:
            refused = exc if isinstance(exc, TokshardError) else process_limits.processes_exhausted(exc)
            if refused is None:
                raise
            if plan is not None and fresh and (sub is None or sub.settled):
                _take_back_if_empty(state, plan)
            if (
                fresh
                and isinstance(refused, FileTooLargeError | DiskFullError)
                and (plan is None or _committed_nothing(state, plan))
            ):  # a fresh run's first writes: no committed work to speak of
                raise refused.committed_nothing() from exc
            if isinstance(refused, BadRecord):
                raise _bad_record_advice(refused, recipe, state, plan) from None
            if isinstance(refused, HubUnreachable) and (advice := recipe.mirror_advice(refused.repo)):
                raise refused.advising(advice) from exc
            if refused is exc:
                raise
            raise refused from exc


def _bad_record_advice(refused: BadRecord, recipe: Recipe, state: RunState, plan: Plan | None) -> BadRecord:
    """The stop at a bad record as the driver can say it: the rerun's --out (whether any work
    was committed) and the settings to change (a recipe file's, where the run came from one)."""
    if plan is not None and refused.kept is None and _committed_nothing(state, plan):
        refused = refused.committed_nothing()
    return refused.in_recipe(recipe.file) if recipe.file else refused


def _say_manifest_rewrite(
    state: RunState, problem: str, checkpoints: dict[str, Checkpoint | None], log: Log
) -> None:
    """One line for a rerun of a run whose partitions are all done but whose manifest is not the
    one it wrote (missing, cut short, edited since): the rerun writes it from the checkpoints,
    after checking the shards' contents against them (those that differ are redone, and said).
    A store's shards are downloaded for that, once: the line says how much."""
    found = "is missing" if problem == MANIFEST_MISSING else f"is not the one the run wrote ({problem})"
    check = ""
    if not state.hashes_locally:
        shards = [rec for ck in checkpoints.values() if ck is not None for rec in ck.closed]
        size = human(sum(rec.bytes + rec.idx_bytes + (rec.origin_bytes or 0) for rec in shards))
        check = (
            f"checking the contents of its {counted(len(shards), 'shard')} against them first (a repair: "
            f"each is read from the store once, {size}B in all), then "
        )
    log(
        f"{state.location}: every partition is done, but {state.manifest_location} {found}; {check}writing "
        f"it {'' if problem == MANIFEST_MISSING else 'again '}from the run's records"
    )


def _take_back_if_empty(state: RunState, plan: Plan) -> None:
    """A fresh run refused before it wrote a token (an encoder that would change the ids, a
    scheduler out of reach, a first record without the text field, inputs without text) takes
    back its state, plan and tokenizer, so that the lock's release leaves a new --out as the run
    found it. A run that wrote tokens keeps them for its rerun. Called only once no task of the
    run can still write (none submitted, or `Submission.settled`)."""
    with contextlib.suppress(Exception):  # the refusal is the error to say
        checkpoints = state.load_checkpoints(plan)
        if any(ck is not None and (ck.tokens or ck.closed) for ck in checkpoints.values()):
            return
        state.discard_run(plan)
        state.remove_tokenizer()


def _committed_nothing(state: RunState, plan: Plan) -> bool:
    """Whether no partition of the run holds committed work (or the run was taken back), so
    that a rerun on the same --out, with another recipe or a fixed input, plans afresh
    (`_checked_or_new_plan`) instead of being refused; False where that cannot be read."""
    try:
        checkpoints = state.load_checkpoints(plan)
        return not any(ck and ck.holds_work for ck in checkpoints.values()) and state.manifest_doc() is None
    except TokshardError:
        return False


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """What this process holds before the tasks run (modules, the plan, the encoder check's
    tables) is left out of the collections made while they run: the local scheduler
    unpickles every task's partition (a dict per input file) in this process, and each full
    collection those allocations set off would walk all of it again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _redo_damaged(
    state: RunState, plan: Plan, checkpoints: dict[str, Checkpoint | None], log: Log, hashes: bool
) -> None:
    """Check every shard this rerun keeps against its checkpoint (there, of its size, and with
    ``hashes`` of its content hash: `RunState.hashes_locally`) and redo the partitions of those
    that differ: a shard deleted, truncated or edited since would otherwise go into the manifest
    as if whole."""
    problems = state.kept_problems(plan, checkpoints, hashes=hashes)
    _redo(
        state,
        plan,
        checkpoints,
        {key: f"{why}; redoing that partition" for key, why in problems.items()},
        log,
    )


def _say_untraced(finished: list[Checkpoint], log: Log) -> None:
    """A note on the finished shards that carry no provenance (an older tokshard wrote them, and
    a rerun keeps them rather than encode them again): their documents cannot be traced."""
    shards = [rec for ck in finished for rec in ck.closed]
    untraced = sum(rec.origin_hash is None for rec in shards)
    if untraced:
        log(
            f"note: {untraced:,} of the run's {counted(len(shards), 'shard')} carry no provenance (written by an older "
            "tokshard, which recorded no places), so `tokshard samples --origin` cannot name where their "
            "documents came from; to trace them, prepare into a new --out"
        )


def _restart_untraced(
    state: RunState, plan: Plan, checkpoints: dict[str, Checkpoint | None], log: Log
) -> None:
    """Redo from its start each partial partition an older tokshard began without provenance:
    resumed, the documents it committed would be listed with no place although their source
    names one, and its shards would differ from a clean run's; redone, they equal them."""
    untraced = state.untraced_partials(plan, checkpoints)
    why = {key: f"{work}; redoing it from its start to record it" for key, work in untraced.items()}
    _redo(state, plan, checkpoints, why, log, prefix="note: ")


def _redo(
    state: RunState,
    plan: Plan,
    checkpoints: dict[str, Checkpoint | None],
    why: dict[str, str],
    log: Log,
    prefix: str = "",
) -> None:
    """Forget each partition ``why`` names (its key -> the reason, said), so the run does it again."""
    for part in plan.partitions:
        if part.key in why:
            log(f"{prefix}partition {part.key}: {why[part.key]}")
            state.forget_partition(part)
            checkpoints[part.key] = None


def _local_workers(options: RunOptions) -> int:
    """The worker processes this machine starts for the run (0: a scheduler's or jobs' run them)."""
    if options.client is not None or options.scheduler is not None or options.batch is not None:
        return 0
    return options.workers or os.cpu_count() or 1


def _early_workers(options: RunOptions, threads: int) -> EarlyStart | None:
    """Boot the local workers (or join the scheduler) now, while the driver plans and checks
    the encoder; told the number of partitions to run (`EarlyStart.planned`), they boot no
    more than that: a small input, or a resume with one partition left, on a 64-core node
    would boot dozens of idle processes."""
    if options.client is not None or options.batch is not None:
        return None
    return EarlyStart(
        options.workers, options.scheduler, threads, options.memory_limit, options.dashboard, planning=True
    )


@dataclass(frozen=True)
class EarlyWorkers:
    """`pipeline.encoding.selection.Workers` over the workers booting for this run: each builds
    a spec with the run state's warm-up task (``warm_task``), and the run's own local workers
    encode the check's documents on the copy they built (a shared scheduler's may be busy)."""

    early: EarlyStart
    warm_task: Callable[[EncoderSpec], None]

    def warm(self, spec: EncoderSpec) -> None:
        self.early.warm(self.warm_task, spec)

    def probe(self, spec: EncoderSpec, texts: list[str]) -> list | None:
        return self.early.run_on_one(encode_texts, spec, texts) if self.early.local else None


def _checked_or_new_plan(
    plan: Plan | None, recipe: Recipe, state: RunState, tok: tokenizer.TokenizerInfo, log: Log
) -> Plan:
    """The folder's plan, checked against the recipe, or a new one saved there. A plan whose
    run committed nothing (stopped at its first record: the wrong --text-field) holds no work,
    so another recipe replaces it: the fix was refused as "a different recipe"."""
    if plan is not None:
        try:
            check_same_recipe(plan, recipe, state.location)
            check_same_framing(plan, tok, state.location)
            try:
                check_same_inputs(plan, recipe)
            except DataError as exc:
                raise _inputs_needed(state, plan, exc) from None
            return plan
        except TokshardError as exc:
            checkpoints = state.load_checkpoints(plan)
            if any(ck and ck.holds_work for ck in checkpoints.values()) or state.manifest_doc() is not None:
                raise
            reason = str(exc).rsplit("; ", 1)[0].removeprefix(f"{state.location} ")
            log(f"note: {state.location}: planned again, since its earlier run committed nothing ({reason})")
            for part in plan.partitions:
                if checkpoints[part.key] is not None:
                    state.forget_partition(part)
    with gc_paused():  # the sources' listings are freed here, by reference counts
        plan = make_plan(recipe, tok, log)
    state.save_plan(plan)
    return plan


def check_same_recipe(plan: Plan, recipe: Recipe, out: Path | str) -> None:
    """A rerun continues only the recipe (and pinned sources) the folder was started with."""
    changes = recipe.identity_changes(plan.identity, resolved_elsewhere=FRAMING_SETTINGS)
    if changes:
        raise TokshardError(
            f"{out} holds a run of a different recipe ({'; '.join(changes[:3])}); "
            "use a new --out, or delete the folder to start over"
        )


def check_same_inputs(plan: Plan, recipe: Recipe) -> None:
    """A rerun reads the inputs its plan pinned: none gone or changed since."""
    for name, cfg in recipe.sources.items():
        source = build_source(name, cfg)
        source.check_unchanged(plan.origins[name])
        source.check_partitions_unchanged([p for p in plan.partitions if p.source == name])


def _inputs_needed(state: RunState, plan: Plan, exc: DataError) -> DataError:
    """An input gone or changed (``exc``), said for the run it stops: a finished run whose
    manifest is not its own still needs its inputs as they were, for the manifest is written
    only after the encoder's check reads their first documents (and a partition whose shards
    differ is encoded again), so "use a new --out" cannot help there."""
    checkpoints = state.load_checkpoints(plan)
    if not all(ck is not None and ck.complete for ck in checkpoints.values()):
        return exc
    problem = state.manifest_problem(plan)
    if problem is None:
        return exc
    return DataError(inputs_needed(str(exc), state.location, problem))


#: the tokenizer's facts that frame each document, which a run keeps from its plan
FRAMING = ("eos_id", "eos_token", "bos_id", "bos_token")
#: the recipe's settings that choose them: a rerun compares what they resolved to (FRAMING)
FRAMING_SETTINGS = ("eos_token", "bos_token")


def check_same_framing(plan: Plan, tok: tokenizer.TokenizerInfo, out: Path | str) -> None:
    """A rerun finds the EOS and BOS its plan recorded. The tokenizer.json's content is in the
    recipe's identity, but the tokenizer_config.json beside it (which may name the EOS, or set
    ``add_bos_token``) is not: edited since, it would be ignored without a word. The
    --eos-token/--bos-token given are compared here too, by what they resolve to."""
    now = tok.to_json()
    changes = [
        f"{k}: {plan.tokenizer.get(k)!r} -> {now[k]!r}" for k in FRAMING if plan.tokenizer.get(k) != now[k]
    ]
    if changes:
        raise TokshardError(
            f"{out} holds a run whose tokenizer framed documents otherwise ({'; '.join(changes)}: the "
            f"--eos-token/--bos-token given, or the {tokenizer.CONFIG_FILE} beside the tokenizer, changed "
            "since it was planned); use a new --out, or delete the folder to start over"
        )


def make_plan(recipe: Recipe, tok: tokenizer.TokenizerInfo, log: Log) -> Plan:
    """A new run's plan: partitions in output order, origins pinned, the tokenizer's facts."""
    identity = recipe.identity()
    log("planning partitions")
    origins: dict[str, dict[str, Any]] = {}
    splits: dict[str, list[str]] = {}
    partitions: list[Partition] = []
    sources = {name: build_source(name, cfg) for name, cfg in recipe.sources.items()}
    check_read_once(
        {(name, split): files for name, s in sources.items() for split, files in s.named_inputs().items()},
        recipe.where,
        frozenset(name for name, s in sources.items() if s.splits_may_share_inputs()),
        {path: inode for s in sources.values() for path, inode in s.linked_inputs().items()},
    )
    for name, source in sources.items():
        origins[name] = source.origin()
        # a hub repo's card or file names may name splits too: each becomes a folder of `out`
        splits[name] = [
            check_path_name("split", s, f"{recipe.where}: source {name}") for s in source.splits()
        ]
        check_folder_names_differ("split", splits[name], f"{recipe.where}: source {name}")
        order = {s: i for i, s in enumerate(splits[name])}
        planned = sorted(source.partitions(), key=lambda p: (order[p.split], p.index))
        if (note := source.plan_note(planned)) is not None:
            log(f"note: {note}")
        partitions += planned
    if not partitions:
        raise TokshardError(f"{recipe.where}: the sources hold no input data")
    plan = Plan(
        identity=identity,
        identity_hash=recipe.identity_hash(),
        recipe=recipe.to_json(),
        tokenizer=tok.to_json(),
        origins=origins,
        splits=splits,
        partitions=partitions,
    )
    return plan


def _samples(plan: Plan, recipe: Recipe, limit: int = 64) -> list[str]:
    """The run's first documents, for back ends that check their equivalence before use."""
    part = plan.partitions[0]
    source = build_source(part.source, recipe.sources[part.source])
    texts = (
        r.text if isinstance(r.text, str) else r.text.head(SAMPLE_DOC_CHARS)
        for r in source.read(part, None)
        if isinstance(r.text, (str, TextPieces))
    )
    return list(itertools.islice(texts, limit))


def _task(
    recipe: Recipe,
    state: RunState,
    plan: Plan,
    part: Partition,
    run_id: str,
    encoder: EncoderSpec,
) -> PartitionTask:
    s = recipe.settings
    return PartitionTask(
        out=state.task_out,
        partition=part,
        source_config=recipe.sources[part.source],
        encoder=encoder,
        eos_id=plan.tokenizer["eos_id"],
        dtype=s.dtype,
        shard_tokens=s.shard_tokens,
        on_bad_record=s.on_bad_record,
        commit_seconds=float(s.commit_seconds),
        run_id=run_id,
        bos_id=plan.tokenizer.get("bos_id"),
        umask=current_umask(),
    )


@dataclass
class Submission:
    """What the driver follows while the tasks run: each task's partition, every partition's
    latest checkpoint (updated as tasks commit and end), and where to report progress."""

    tasks: list[PartitionTask]
    todo: list[Partition]
    checkpoints: dict[str, Checkpoint | None]
    plan: Plan
    state: RunState
    held: HeldRun
    #: whether no task of it can run any more (each one ended, or the run's own local workers
    #: closed): only then may a refused fresh run take its state back
    settled: bool = False


def _run(sub: Submission, options: RunOptions, log: Log, early: EarlyStart | None = None) -> None:
    """Run the tasks on the cluster (each is ``state.work`` on a worker)."""
    if options.client is not None:
        _submit_and_wait(options.client, sub, options, log)
        return
    own = options.scheduler is None and options.batch is None  # local workers, closed with it
    connected = False
    try:
        with connect(
            workers=options.workers,
            scheduler=options.scheduler,
            threads=sub.tasks[0].encoder.threads,
            memory_limit=options.memory_limit,
            dashboard=options.dashboard,
            log=log,
            batch=options.batch,
            early=early,
        ) as client:
            connected = True
            _submit_and_wait(client, sub, options, log)
    finally:
        # no workers to be had (a job the batch system refused, a scheduler out of reach): no
        # task was submitted, so none can write, and a fresh run may take its state back
        sub.settled = sub.settled or own or not connected


def in_flight(client, options: RunOptions, nthreads: dict | None = None) -> int:
    """How many tasks to keep submitted: ``options.max_in_flight``, or a few per worker thread
    (``nthreads``: the cluster's, if already asked)."""
    if options.max_in_flight is not None:
        return options.max_in_flight
    nthreads = client.nthreads() if nthreads is None else nthreads
    return max(MIN_IN_FLIGHT, IN_FLIGHT_PER_THREAD * sum(nthreads.values()))


#: how long a shared scheduler or batch jobs may have no worker before a line says so (then
#: again each as long while it lasts); the run keeps waiting, as workers may still come
NO_WORKERS_SAY_SECONDS = 60.0
#: how long the run's own local workers may all be gone before it stops: their nannies bring a
#: killed worker back within seconds, so longer means none is left to do so (generous: a
#: machine busy with other work boots a worker slowly)
LOCAL_WORKERS_GONE_SECONDS = 120.0


@dataclass
class WorkerWatch:
    """Notices a cluster with no worker while tasks wait: said in a line for a shared
    scheduler or batch jobs (workers may join later), an error for the run's own local workers
    (nobody will start more). Without it, the run waits without a word, its rate falling."""

    local: bool
    where: str
    log: Log
    since: float | None = None
    said: float | None = None

    def seen(self, workers: int, now: float) -> None:
        if workers:
            self.since = self.said = None
            return
        self.since = now if self.since is None else self.since
        gone = now - self.since
        if self.local and gone >= LOCAL_WORKERS_GONE_SECONDS:
            raise ClusterLost(
                f"all local Dask workers are gone for {int(gone)} s (killed, or out of memory?); rerun "
                "with fewer --workers or a larger --memory-limit: it resumes from the last commit"
            )
        if (
            not self.local
            and gone >= NO_WORKERS_SAY_SECONDS
            and (self.said is None or now - self.said >= NO_WORKERS_SAY_SECONDS)
        ):
            self.said = now
            self.log(
                f"no Dask workers connected to {self.where} for {int(gone)} s; start some (dask worker "
                f"{self.where}) or stop with Ctrl-C: it resumes"
            )


def worker_watch(client, options: RunOptions, log: Log) -> WorkerWatch:
    """The `WorkerWatch` of a run on ``client``: its own local workers, or a scheduler's."""
    local = options.client is None and options.scheduler is None and options.batch is None
    if options.batch is not None:
        where = f"{client.scheduler.address} (are the {options.batch.system} jobs still queued?)"
    else:
        where = options.scheduler or client.scheduler.address
    return WorkerWatch(local, where, log)


class Tally:
    """What a run's partitions have done by their latest checkpoints (``checkpoints``, updated by
    `record`): input units read, tokens written, partitions done (each one under way as the
    fraction of its input read), and what each finished one cost (for the ETA). Kept up to
    date as checkpoints come, never summed again: a run may have 100,000 partitions."""

    def __init__(self, plan: Plan, checkpoints: dict[str, Checkpoint | None]) -> None:
        self.checkpoints = checkpoints
        self.sizes = {p.key: p.size for p in plan.partitions}
        self.total = sum(self.sizes.values())
        self.units, self.tokens, self.partitions = 0, 0, 0.0
        self.costs = CostModel()
        for key, ck in checkpoints.items():
            if ck is not None and key in self.sizes:
                self._count(key, ck, 1)

    def record(self, key: str, ck: Checkpoint) -> None:
        """``ck``, the latest checkpoint of partition ``key``, in place of the one before."""
        before = self.checkpoints.get(key)
        if before is not None:
            self._count(key, before, -1)
        self.checkpoints[key] = ck
        self._count(key, ck, 1, learn=before is None or not before.complete)

    def _count(self, key: str, ck: Checkpoint, sign: int, learn: bool = True) -> None:
        size = self.sizes[key]
        units = size if ck.complete else ck.progress
        self.units += sign * units
        self.tokens += sign * ck.tokens
        if ck.complete or size:
            self.partitions += sign * (1.0 if ck.complete else min(units / size, 1.0))
        if sign > 0 and learn and ck.complete:
            self.costs.add(size, ck.busy_seconds)


def _submit_and_wait(client, sub: Submission, options: RunOptions, log: Log = stderr_log) -> None:
    """Submit the tasks, largest first, keeping `in_flight` of them submitted (the driver and
    the scheduler hold state per submitted task), then follow them: each finished one the
    moment it ends (a callback queue, constant cost per task however many there are; a next
    task is submitted in its place), and the running ones by their latest commit every
    ``state.poll_seconds``, for the progress line and for `status` (``held.report``)."""
    checkpoints, plan, state = sub.checkpoints, sub.plan, sub.state
    run_id = sub.tasks[0].run_id
    tally = Tally(plan, checkpoints)
    progress = Progress(
        tally.total,
        done=tally.units,
        tokens=tally.tokens,
        interval=options.progress_interval,
        partitions=len(plan.partitions),
        partitions_done=tally.partitions,
        costs=tally.costs,
    )
    finished: queue.SimpleQueue = queue.SimpleQueue()
    pending: dict[str, tuple[Any, Partition]] = {}
    # largest first: the last task to start is a small one, so workers finish together
    waiting = iter(sorted(zip(sub.tasks, sub.todo, strict=True), key=lambda tp: tp[1].size, reverse=True))
    limit = in_flight(client, options)
    watch = worker_watch(client, options, log)
    own_limit = options.memory_limit if watch.local else None
    libraries = sub.tasks[0].encoder.libraries
    if not watch.local:
        _check_before_submitting(client, sub, libraries)

    def submit_more() -> None:
        while len(pending) < limit and (item := next(waiting, None)) is not None:
            task, part = item
            key = f"tokshard-{part.source}-{part.split}-{part.index:05d}-{run_id}"
            # another's workers (a scheduler's, batch jobs') run it only if their tokshard is ours,
            # those that joined since the run's start among them
            fn, args = (state.work, (task,)) if watch.local else gated(state.work, task, libraries=libraries)
            fut = client.submit(fn, *args, key=key, retries=0, priority=part.size)
            pending[fut.key] = (fut, part)
            fut.add_done_callback(finished.put)

    submit_more()
    next_poll = time.monotonic() + state.poll_seconds
    try:
        while pending:
            with contextlib.suppress(queue.Empty):
                ended = [finished.get(timeout=max(0.0, next_poll - time.monotonic()))]
                while not finished.empty():
                    ended.append(finished.get())
                for fut in ended:
                    if fut.key in pending:
                        _, part = pending.pop(fut.key)
                        ck = _checkpoint_of(fut, part, state, plan, sub.tasks[0].dtype, own_limit)
                        tally.record(part.key, ck)
                submit_more()
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + state.poll_seconds
                nthreads = client.nthreads()
                progress.waiting(not nthreads)
                watch.seen(len(nthreads), time.monotonic())
                limit = in_flight(client, options, nthreads)  # workers may have come or gone
                submit_more()
                for key in itertools.chain.from_iterable(client.processing().values()):
                    if key in pending and (ck := state.read_progress(pending[key][1])) is not None:
                        tally.record(ck.key, ck)
                sub.held.report(progress.rate(), progress.eta())
            progress.update(tally.units, tally.tokens, tally.partitions)
    except BaseException as exc:
        if scheduler_lost(client, exc):
            address = options.scheduler or client.scheduler.address
            raise ClusterLost(
                f"lost the Dask scheduler at {address}; rerun: it resumes from the last commit"
            ) from None
        if isinstance(exc, TokshardError) and not watch.local:  # (own workers: closed with the run)
            _let_running_end(client, pending, exc, log)
        client.cancel([fut for fut, _ in pending.values()])
        raise
    finally:
        sub.settled = not pending  # each task submitted has ended (one still pending may run on)
        progress.close()


def _check_before_submitting(client, sub: Submission, libraries: tuple[str, ...]) -> None:
    """Refuse the run if a worker connected now runs another tokshard or another version of the
    encoder ``libraries`` (the encoder is chosen only now; a scheduler's workers were checked
    for tokshard and `tokenizers` when it was joined). Nothing is submitted yet: a fresh run
    refused here takes its state back (`Submission.settled`)."""
    try:
        check_workers(client, libraries)
    except BaseException:
        sub.settled = True
        raise


def _let_running_end(
    client, pending: dict[str, tuple[Any, Partition]], reason: TokshardError, log: Log
) -> None:
    """On a task's error (``reason``, said first: the wait can be long, and a Ctrl-C during it
    said only "interrupted"), cancel the tasks no worker has started and wait for those
    running to end (taken out of ``pending`` as they do). A cancelled task that runs goes on
    writing on its worker, out of the driver's sight: a fresh run refused by a worker that
    joined late (`gated`) then kept its plan and tokenizer in --out, as if it had written
    something, or took them back under a task still writing. Ctrl-C ends the wait (what is
    committed stays; the tasks still running are cancelled and left in ``pending``), and the
    run ends on ``reason`` all the same."""
    from distributed import wait

    for key in [key for key, (fut, _) in pending.items() if fut.done()]:  # refused or ended meanwhile
        pending.pop(key)
    running = _executing(client)
    client.cancel([pending.pop(key)[0] for key in list(pending) if key not in running])
    if not pending:
        return
    log(str(reason))
    log(
        f"waiting for the {counted(len(pending), 'task')} other workers are running to end (what they "
        "commit is kept: a rerun resumes it; Ctrl-C stops waiting)"
    )
    try:
        wait([fut for fut, _ in pending.values()])
    except KeyboardInterrupt:
        client.cancel([fut for fut, _ in pending.values()])
        return
    pending.clear()


def _executing(client) -> set[str]:
    """The keys of the tasks the cluster's workers are running now: not those only queued on
    a worker (`client.processing` lists both), which a cancel stops before they start. A
    worker that cannot say (another Dask) counts everything it was given."""
    processing = client.processing()
    try:
        said = client.run(
            lambda dask_worker: [ts.key for ts in dask_worker.state.executing], on_error="return"
        )
    except Exception:  # the refusal is the error to say: wait for all the workers were given
        return set(itertools.chain.from_iterable(processing.values()))
    keys: set[str] = set()
    for address, executing in said.items():
        keys.update(processing.get(address, ()) if isinstance(executing, BaseException) else executing)
    return keys


def _checkpoint_of(
    fut, part: Partition, state: RunState, plan: Plan, dtype: str, memory_limit: str | None = None
) -> Checkpoint:
    """A finished task's final checkpoint, or its error as the user should read it
    (``memory_limit``: the run's own local workers' --memory-limit, if given)."""
    from distributed import KilledWorker

    try:
        return fut.result()
    except KilledWorker as exc:
        raise TokshardError(
            f"Dask workers died repeatedly on partition {part.key} (out of memory?); {killed_advice(memory_limit)}"
        ) from exc
    except DiskFullError as exc:
        raise exc.with_needed(_bytes_to_write(state, plan, dtype)) from None
    except RuntimeError as exc:  # a worker of another tokshard refused it (`gated`)
        refused = refusal(exc)
        if refused is None:
            raise
        raise refused from None


def manifest_doc(
    recipe: Recipe,
    plan: Plan,
    finished: list[Checkpoint],
    decision: Decision,
) -> dict[str, Any]:
    """The manifest of a run whose partitions all finished (``finished``: in plan order)."""
    refuse_empty_run(recipe, finished)
    shards: list[dict[str, Any]] = []
    sources: dict[str, Any] = {
        name: {
            "type": cfg["type"],
            "origin": plan.origins[name],
            "splits": {split: manifest.empty_split_stats() for split in plan.splits[name]},
        }
        for name, cfg in recipe.sources.items()
    }
    for part, ck in zip(plan.partitions, finished, strict=True):
        stats = sources[part.source]["splits"][part.split]
        manifest.add_partition(stats, ck.documents, ck.tokens, ck.dropped_empty, ck.skipped, len(ck.closed))
        shards += [manifest.shard_entry(rec, part.source, part.split) for rec in ck.closed]
    return manifest.build(
        recipe=plan.recipe,
        recipe_hash=plan.identity_hash,
        dtype=recipe.settings.dtype,
        tokenizer=plan.tokenizer,
        encoder=decision.manifest_entry(sum(ck.routed for ck in finished)),
        sources=sources,
        shards=shards,
    )


def refuse_empty_run(recipe: Recipe, finished: list[Checkpoint]) -> None:
    """A run that found no text at all is a mistake (an empty file, the wrong --text-field
    with --on-bad-record skip), not a corpus: say so instead of publishing an empty manifest."""
    if any(ck.tokens for ck in finished):
        return
    empty = sum(ck.dropped_empty for ck in finished)
    bad = sum(sum(ck.skipped.values()) for ck in finished)
    raise DataError(
        f"{recipe.where}: the inputs hold no text to encode ({empty} empty documents, {bad} bad "
        "records skipped); check the input files and --text-field (no manifest was written)"
    )


def _bytes_to_write(state: RunState, plan: Plan, dtype: str) -> int:
    """Estimate of the shard bytes the run still has to write, from its committed rate."""
    from pipeline.format.shard_reader import token_dtype

    tokens = units = 0
    total = sum(p.size for p in plan.partitions)
    for part, ck in zip(plan.partitions, state.load_checkpoints(plan).values(), strict=True):
        if ck is not None:
            tokens += ck.tokens
            units += part.size if ck.complete else ck.progress
    if not units or not tokens:
        return 0
    return int(tokens / units * (total - units) * token_dtype(dtype).itemsize * 1.05)
