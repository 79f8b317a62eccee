"""Where the Dask workers come from: an embedded local cluster, one that already runs, or
batch jobs on Slurm/PBS.

We never manage machines ourselves: `--scheduler tcp://HOST:PORT` joins a cluster started
with `dask scheduler` / `dask worker`; `--cluster slurm|pbs` asks dask-jobqueue for batch
jobs of CPU workers (see docs/CLUSTER.md); otherwise a `LocalCluster` of worker processes
(one per core, one task each, with a memory limit) lives as long as the run. Workers of
every kind run one task at a time per process: a partition is one single-threaded task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from typing import Any

from pipeline.encoding.backend import REFERENCE
from pipeline.format.errors import TokshardError, counted
from pipeline.run.code_check import check_workers, gated

BATCH_SYSTEMS = ("slurm", "pbs")
#: a local worker's memory limit when none is given (Dask's: the machine's memory split over the workers)
LOCAL_MEMORY_LIMIT = "auto"
#: the least memory a worker is let have (a local --memory-limit, a --cluster job's --memory over
#: its worker processes). Measured: the peak RSS of one local worker encoding an 8 MB corpus of
#: prose (bench/corpus.py) is about 190 MiB with cl100k_base, 220 MiB with Llama 3 and 310-320
#: MiB with o200k_base (1MiB or default partitions alike), and bench/RESULTS.md has GPT-2's
#: default run at 243-271 MiB. A nanny stops its worker at 95% of the limit, so 256 MiB let
#: o200k's (and at times GPT-2's) worker be killed as it started, again and again; 512 MiB
#: (stopped at 486) holds the largest real vocabulary with about 170 MiB for longer texts.
MIN_WORKER_MEMORY = 512 << 20
#: Dask's memory thresholds our workers run without: a worker pauses (starts no task) at 80% of
#: its limit and spills Dask-held data from 60-70%, but ours hold no Dask data (each task writes
#: its shards and returns a small checkpoint), so nothing would ever bring a paused worker back
#: under the mark: a worker whose encoder alone sits above it (Llama 3's, at a 256MiB limit)
#: paused for good and the run hung without a word. Without them, a worker over its limit is
#: stopped by its nanny at 95% (``terminate``, kept), which the driver names (`KilledWorker`).
UNPAUSED = {
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.target": False,
}
#: the longest a run waits for its workers' warm-up before it sends its tasks anyway
WARM_UP_SECONDS = 10.0
#: the longest local workers wait to boot for the number of partitions the run has to do, so
#: that a run smaller than the machine boots no idle ones; a longer plan (many input files)
#: boots them all meanwhile
PLAN_WAIT_SECONDS = 0.25


@dataclass
class BatchJobs:
    """`--cluster slurm|pbs`: what each batch job asks for; unset knobs come from the Dask
    config (``jobqueue.slurm.*`` / ``jobqueue.pbs.*`` in ~/.config/dask/jobqueue.yaml)."""

    system: str
    jobs: int = 1
    cores: int | None = None
    memory: str | None = None
    queue: str | None = None
    account: str | None = None
    walltime: str | None = None
    job_extra: list[str] = field(default_factory=list)
    local_directory: str | None = None


def batch_cluster(spec: BatchJobs, threads: int):
    """A dask-jobqueue cluster (nothing is submitted until it is scaled).

    One worker process per ``threads`` cores with one Dask thread each, so a job of N cores
    runs N // threads partitions at once, each encoder using ``threads`` threads.
    """
    try:
        from dask_jobqueue import PBSCluster, SLURMCluster
    except ImportError as exc:
        raise TokshardError(
            "--cluster needs dask-jobqueue: pip install 'tokshard[hpc]' (or dask-jobqueue)"
        ) from exc
    import dask

    if spec.system not in BATCH_SYSTEMS:
        raise TokshardError(f"--cluster {spec.system}: choose one of {', '.join(BATCH_SYSTEMS)}")
    cores = spec.cores or dask.config.get(f"jobqueue.{spec.system}.cores", None)
    memory = spec.memory or dask.config.get(f"jobqueue.{spec.system}.memory", None)
    if not cores or not memory:
        raise TokshardError(
            f"--cluster {spec.system} needs --cores and --memory per job (or jobqueue.{spec.system}.cores "
            "and .memory in your Dask config), e.g. --cores 32 --memory 120GB"
        )
    processes = max(1, int(cores) // threads)
    check_memory_per_worker(spec.system, memory, processes)
    extra_args = ["--nthreads", "1"] if threads > 1 else []  # the last --nthreads wins
    cls = SLURMCluster if spec.system == "slurm" else PBSCluster
    kwargs = {
        "cores": int(cores),
        "memory": memory,
        "processes": processes,
        "queue": spec.queue,
        "account": spec.account,
        "walltime": spec.walltime,
        "local_directory": spec.local_directory,
        "job_name": "tokshard",
        "job_script_prologue": [
            f"export {k}={v}" for k, v in {**MALLOC_ENV, **worker_env(threads), **unpaused_env()}.items()
        ],
    }
    if spec.job_extra:
        kwargs["job_extra_directives"] = list(spec.job_extra)
    if extra_args:
        kwargs["worker_extra_args"] = extra_args
    try:
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
    except ValueError as exc:
        raise TokshardError(f"--cluster {spec.system}: {exc}") from exc


def submit_jobs(cluster, spec: BatchJobs) -> None:
    """Submit the jobs now, in this thread, so that a job the batch system refuses stops the run
    in one line quoting it. (`scale` submits from the cluster's event loop, where a refusal is
    only logged as a traceback and the run then waits for workers that never come.)"""
    while len(cluster.worker_spec) < spec.jobs:
        cluster.worker_spec.update(cluster.new_worker_spec())
    try:
        cluster.sync(cluster._correct_state)
    except RuntimeError as exc:  # dask-jobqueue's: the command, its exit code, stdout and stderr
        forget_unsubmitted(cluster)
        said = str(exc).rpartition("stderr:")[2].strip() or str(exc).strip()
        submit = "sbatch" if spec.system == "slurm" else "qsub"
        raise TokshardError(
            f"--cluster {spec.system}: {submit} refused the job ({' '.join(said.split())}); check "
            "--queue, --account, --walltime and --job-extra (--print-job-script shows the script)"
        ) from None


def forget_unsubmitted(cluster) -> None:
    """Drop the jobs that were never submitted, which the cluster's close cannot close (it
    would fail on them); the ones submitted are still cancelled as it closes."""
    from distributed.core import Status

    for name, job in list(cluster.workers.items()):
        if job.status == Status.created:
            job.status = Status.failed  # what it is: the cluster's close checks each job it made
            del cluster.workers[name]
            cluster.worker_spec.pop(name, None)


def check_memory_per_worker(system: str, memory: str, processes: int) -> None:
    """A job's memory split over its worker processes leaves each enough (`MIN_WORKER_MEMORY`):
    --cores 1000 --memory 8GB would give each 8 MiB, and its nanny would kill it as it starts."""
    from dask.utils import parse_bytes

    try:
        each = parse_bytes(memory) / processes
    except (TypeError, ValueError) as exc:
        raise TokshardError(f"--cluster {system}: memory {memory!r} is not a size, such as 120GB") from exc
    if each < MIN_WORKER_MEMORY:
        raise TokshardError(
            f"--cluster {system}: memory {memory} over {processes} worker processes is {each / 2**20:.1f} MiB "
            f"each, below the {MIN_WORKER_MEMORY >> 20} MiB a worker process needs; give more --memory or "
            "fewer --cores per job (or more --threads)"
        )


def require_batch_system(system: str) -> None:
    """Fail before any work where jobs cannot be submitted (not on a login node)."""
    submit = "sbatch" if system == "slurm" else "qsub"
    if shutil.which(submit) is None:
        raise TokshardError(
            f"--cluster {system}: `{submit}` is not on PATH; run prepare on a login node of the "
            "batch system (--print-job-script shows what would be submitted)"
        )


def job_script(spec: BatchJobs, threads: int) -> str:
    """The batch script each job would run, rendered without submitting anything."""
    cluster = batch_cluster(spec, threads)
    try:
        return cluster.job_script()
    finally:
        cluster.close()


#: glibc's allocator in each worker process, set before it starts: a worker allocates and frees
#: buffers of 1-40 MB all the time (lines read, texts, encoder output, a long document's ids),
#: and a JSON line of a 20 MB document becomes a str of up to 80 MB (four bytes a character
#: where one is outside the BMP). Dask sets MALLOC_TRIM_THRESHOLD_ to 64 KiB, and glibc
#: serves such sizes by mmap, so each one would come back as fresh pages to fault in, in the
#: kernel's time. Kept in the heap, and the heap not given back below 1 GiB free, freed memory
#: is reused: a worker stays at its peak RSS instead of shrinking after a long document.
#: Values already in the environment win.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def unpaused_env() -> dict[str, str]:
    """`UNPAUSED` as the environment a batch job's `dask worker` reads its config from."""
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(v) for key, v in UNPAUSED.items()}


def worker_env(threads: int) -> dict[str, str]:
    """Encoder threads per worker process, fixed before the tokenizer's thread pool starts."""
    return {
        "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
        "RAYON_NUM_THREADS": str(threads),
        "FASTOKENS_BPE_THREADS": str(threads),
    }


def killed_advice(memory_limit: str | None) -> str:
    """What to do about local workers killed again and again on a task: with a --memory-limit
    given, it is what killed them (a nanny stops its worker at 95% of it; pausing is off,
    `UNPAUSED`), so a larger one, about twice, is what to give; else fewer workers, each of
    which then gets more of the machine's memory."""
    if memory_limit is None or memory_limit.strip().lower() in ("auto", "0"):
        return "rerun to resume from its last commit, with fewer --workers or more memory"
    from dask.utils import parse_bytes

    mib = 2 * parse_bytes(memory_limit) >> 20  # 0 for a fraction of the machine's memory (0.5)
    twice = f", such as --memory-limit {mib}MiB" if mib else ""
    return (
        f"a worker is stopped at 95% of its --memory-limit {memory_limit}, too little for this tokenizer "
        f"and text; rerun with a larger --memory-limit{twice}: it resumes from its last commit"
    )


class ClusterLost(TokshardError):
    """The run's scheduler or all of its workers went away mid-run (killed, a node lost): exit
    1, a fault of the run's machines rather than of the command; the rerun resumes."""

    exit_code = 1


def scheduler_lost(client, exc: BaseException) -> bool:
    """Whether ``exc`` comes of the client's connection to its scheduler closing: Dask cancels
    every future ("scheduler-connection-lost") and its calls fail with a closed comm."""
    from asyncio import CancelledError

    if isinstance(exc, CancelledError) and getattr(exc, "reason", None) == "scheduler-connection-lost":
        return True
    return isinstance(exc, Exception) and client.status not in ("running", "newly-created")


class _ConnectionFaultsUnlogged(logging.Filter):
    """Drop Dask's client log records of a broken connection (each a traceback; a reconnect
    cancelled as the client closes among them): the run says it once, in one line
    (`ClusterLost`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from asyncio import CancelledError

        if record.exc_info and isinstance(record.exc_info[1], (OSError, CancelledError)):
            return False
        # a driver slow to notice (a busy machine) finds the client's give-up logged first
        return not record.getMessage().startswith("Failed to reconnect to scheduler")


@contextlib.contextmanager
def connection_faults_unlogged() -> Iterator[None]:
    log = logging.getLogger("distributed.client")
    quiet = _ConnectionFaultsUnlogged()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


@contextlib.contextmanager
def connect(
    *,
    workers: int | None,
    scheduler: str | None,
    threads: int,
    memory_limit: str | None,
    log: Callable[[str], None],
    dashboard: bool = False,
    batch: BatchJobs | None = None,
    early: EarlyStart | None = None,
) -> Iterator[object]:
    from distributed import Client

    if batch is not None:
        require_batch_system(batch.system)
        with batch_cluster(batch, threads) as cluster:
            submit_jobs(cluster, batch)
            with Client(cluster) as client:
                log(
                    f"submitted {batch.jobs} {batch.system} job(s) of worker processes; tasks start as "
                    f"the jobs do; scheduler {cluster.scheduler_address}, dashboard {client.dashboard_link}"
                )
                yield client
        return
    cluster, client = (early or EarlyStart(workers, scheduler, threads, memory_limit, dashboard)).take()
    with connection_faults_unlogged(), closed_at_exit(cluster), client:
        if cluster is not None:
            shown = (
                f"dashboard {client.dashboard_link}" if dashboard else "--dashboard serves Dask's dashboard"
            )
            log(
                f"Dask: {counted(len(cluster.workers), 'local worker process', 'local worker processes')}; {shown}"
            )
        else:
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            log(f"Dask scheduler {scheduler}: {counted(n, 'worker')}; dashboard {client.dashboard_link}")
            if n == 0:
                log("no workers are connected yet; tasks wait until `dask worker` processes join")
        yield client


@contextlib.contextmanager
def closed_at_exit(cluster: Any) -> Iterator[None]:
    """The local workers closed when the block ends. On a loaded machine Dask's close can time
    out joining a worker process it has already killed (`TimeoutError`, after the run's work is
    done): that is no failure of the run, which would otherwise end in a traceback without its
    manifest. The killed process is reaped when this one exits."""
    if cluster is None:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(TimeoutError):
            cluster.close()


class EarlyStart:
    """The workers made ready in a background thread while the driver plans partitions and
    checks the encoder: local worker processes booted (interpreter, imports) or the scheduler
    joined, then each worker given what its first task needs (`warm`), so that this start-up
    overlaps the driver's own instead of coming before the first token.

    ``planning``: the caller is still planning and will say how many partitions the run has
    (`planned`); local workers wait briefly for that number, and boot no more than it."""

    def __init__(
        self,
        workers: int | None,
        scheduler: str | None,
        threads: int,
        memory_limit: str | None,
        dashboard: bool = False,
        planning: bool = False,
    ) -> None:
        #: the run's own worker processes (not a shared scheduler's, which may be busy for long)
        self.local = scheduler is None
        self._partitions: Future[int | None] = Future()
        if not planning:
            self._partitions.set_result(None)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokshard-workers")
        self._ready: Future = self._pool.submit(
            _start, workers, scheduler, threads, memory_limit, dashboard, self._partitions
        )
        self._taken = False

    def planned(self, partitions: int) -> None:
        """The number of partitions the run has to do, once known: local workers not yet booted
        boot no more than that (`PLAN_WAIT_SECONDS`)."""
        if not self._partitions.done():
            self._partitions.set_result(partitions)

    def warm(self, fn: Callable[..., None], *args: object) -> None:
        """Run ``fn(*args)`` as a task on each worker connected once they are ready, still in
        the background. A task, not ``Client.run``: it then runs on the thread the worker's
        tasks run on, which keeps what it builds in that thread's memory arena (built on the
        event loop's thread, an encoder would take a second arena's memory per worker)."""

        def run_everywhere() -> None:
            from distributed import wait

            with contextlib.suppress(Exception):  # best effort: the first task does it anyway
                client = self._ready.result()[1]
                workers = client.scheduler_info(n_workers=-1)["workers"]
                # another's workers: checked (the encoder is not chosen yet: its reference library)
                call = (fn, args) if self.local else gated(fn, *args, libraries=(REFERENCE,))
                futures = [
                    client.submit(call[0], *call[1], workers=[w], allow_other_workers=False, pure=False)
                    for w in workers
                ]
                # bounded: on a shared cluster a worker may be busy (or die) for a long time
                wait(futures, timeout=WARM_UP_SECONDS)

        self._pool.submit(run_everywhere)

    def run_on_one(self, fn: Callable[..., object], *args: object) -> object:
        """``fn(*args)`` as a task on any one worker once they are up, and its result; raises
        whatever went wrong, a wait past WARM_UP_SECONDS included. On a worker's one task
        thread, like `warm`: what either builds there, the other finds."""
        client = self._ready.result()[1]
        future = client.submit(fn, *args, pure=False)
        try:
            return future.result(timeout=WARM_UP_SECONDS)
        finally:
            future.release()

    def wait_ready(self) -> None:
        """Wait until the workers are up; raises why they could not start (a scheduler out of
        reach, a scratch folder that cannot be made) before any task is sent."""
        self._ready.result()

    def take(self) -> tuple[object | None, object]:
        """(local cluster or None, client), once ready and warm; the caller owns and closes both.

        Tasks sent before the warm-up ended would only build the same encoder a second time."""
        self._taken = True
        self._pool.shutdown(wait=True)
        return self._ready.result()

    def discard(self) -> None:
        """Close what nobody took (the run failed before it needed workers, or had no task)."""
        if not self._taken:
            self._taken = True
            self.planned(0)  # workers still waiting for the plan boot none
            self._pool.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(Exception):
                cluster, client = self._ready.result()
                client.close()
                if cluster is not None:
                    cluster.close()


#: local worker processes per CPU beyond which --workers is taken for a typo: each worker
#: encodes on one core, so more only add memory (a few hundred MiB each) and contention
WORKERS_PER_CPU = 4


def check_local_workers(workers: int | None, threads: int = 1) -> None:
    """Refuse a local --workers or --threads far beyond this machine's CPUs before any process
    starts (a typed 1000 for 10 would start a thousand Python processes, or threads)."""
    cpus = os.cpu_count() or 1
    if workers and workers > WORKERS_PER_CPU * cpus:
        raise TokshardError(
            f"--workers {workers} is more than {WORKERS_PER_CPU} per CPU on this machine ({cpus} CPUs); "
            f"each local worker encodes on one core: use at most {WORKERS_PER_CPU * cpus}, or a cluster "
            "(--scheduler, --cluster) for more"
        )
    if threads > WORKERS_PER_CPU * cpus:
        raise TokshardError(
            f"--threads {threads} is more than {WORKERS_PER_CPU} per CPU on this machine ({cpus} CPUs); "
            f"use at most {WORKERS_PER_CPU * cpus} encoder threads per local worker"
        )


def _start(
    workers: int | None,
    scheduler: str | None,
    threads: int,
    memory_limit: str | None,
    dashboard: bool,
    partitions: Future[int | None],
):
    from distributed import Client

    if scheduler:
        client = _join(scheduler)
        try:
            # before any task: a worker of another tokshard (or `tokenizers`) is refused here
            check_workers(client, (REFERENCE,))
        except BaseException:
            client.close()
            raise
        return None, client
    keep_ctrl_c_from_workers()
    n = workers or os.cpu_count() or 1
    with contextlib.suppress(TimeoutError):
        if (planned := partitions.result(timeout=PLAN_WAIT_SECONDS)) is not None:
            n = min(n, planned)
    cluster = _local_cluster(n, threads, memory_limit, dashboard)
    try:
        return cluster, Client(cluster)
    except BaseException:
        cluster.close()
        raise


def keep_ctrl_c_from_workers() -> None:
    """Block SIGINT and SIGHUP in this thread, so in the event-loop thread it starts for the
    local cluster and in every worker process that thread spawns (a blocked signal stays
    blocked across fork and exec). A terminal sends both to the whole process group (Ctrl-C;
    the terminal closing); this way only the driver's main thread takes them, stops the
    workers itself and says one line, where each worker would print a traceback of its own or
    die mid-write. SIGTERM, which stops a worker, is left as it is.

    multiprocessing's resource tracker is started between the two: it ignores SIGINT itself,
    but would die of a SIGHUP it had not inherited blocked (and a tracker started again
    prints a traceback for each semaphore it was never told of); the thread that starts it
    has SIGINT unblocked again afterwards, which would undo this in the thread that spawns
    the workers."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


#: how long a listening port has to start Dask's handshake: a scheduler sends its own at once,
#: while an HTTP server (Dask's dashboard among them) waits for a request and says nothing
HANDSHAKE_SECONDS = 10.0


def _join(scheduler: str):
    """A client of a running scheduler (``tcp://HOST:PORT`` or a scheduler file)."""
    from distributed import Client

    address = scheduler_address(scheduler)
    check_speaks_dask(address)
    try:
        return Client(address, timeout="15s")
    except (OSError, TimeoutError, ValueError, KeyError) as exc:
        raise TokshardError(
            f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one with "
            "`dask scheduler` and `dask worker`, or drop --scheduler to use local workers"
        ) from exc
    except TypeError as exc:  # tls:// without Dask's TLS settings: no SSL context to connect with
        raise TokshardError(
            f"--scheduler {address}: {exc}; set distributed.comm.tls.* in your Dask config for a "
            "tls:// scheduler, or give its tcp:// address"
        ) from exc


def scheduler_address(scheduler: str) -> str:
    """The address --scheduler names (itself, or the one in the scheduler file it names),
    checked without connecting (`check_scheduler_address`): cheap enough to call before a run
    makes anything, so that a mistyped address leaves no --out behind."""
    if "://" not in scheduler:
        scheduler = os.path.expanduser(scheduler)  # quoted, or --scheduler=~/...: not the shell's
    looks_like_a_file = "://" not in scheduler and (scheduler.endswith(".json") or os.sep in scheduler)
    if looks_like_a_file and not os.path.isfile(scheduler):
        raise TokshardError(
            f"--scheduler {scheduler}: no scheduler file there; give the file that "
            "`dask scheduler --scheduler-file FILE` writes, or tcp://HOST:PORT"
        )
    address = scheduler_file_address(scheduler) if os.path.isfile(scheduler) else scheduler
    check_scheduler_address(address)
    return address


def scheduler_file_address(path: str) -> str:
    """The address in a `dask scheduler --scheduler-file` file; a file of anything else (a
    truncated write, the wrong JSON) is named in one line rather than Dask's assertion."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokshardError(
            f"--scheduler {path}: not a Dask scheduler file ({exc}); give the file that "
            "`dask scheduler --scheduler-file FILE` writes, or tcp://HOST:PORT"
        ) from exc
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or not address:
        raise TokshardError(
            f'--scheduler {path}: not a Dask scheduler file (no "address" string in it); give the '
            "file that `dask scheduler --scheduler-file FILE` writes, or tcp://HOST:PORT"
        )
    return address


#: the protocols a client reaches a scheduler by (Dask's ``inproc`` is within one process,
#: its ``ucx`` needs UCX-Py, which tokshard does not install)
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss")


def split_address(address: str) -> tuple[str, str, str]:
    """(scheme, host, port) of ``[SCHEME://]HOST:PORT`` (an IPv6 host in brackets); a missing
    scheme is Dask's default, tcp, and a missing port is ''."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if rest.startswith("["):
        host, _, after = rest[1:].partition("]")
        return scheme, host, after.removeprefix(":")
    host, colon, port = rest.rpartition(":")
    return (scheme, host, port) if colon else (scheme, rest, "")


def check_scheduler_address(address: str) -> None:
    """Refuse, before any connection, an address Dask would take 15 s to time out on or answer
    with advice for another problem: an unsupported protocol (ucx:// said "Can't instantiate
    abstract class" and to set TLS settings), a port outside 1-65535, no host or an IPv6 one
    without brackets, a host that does not resolve."""
    scheme, host, port = split_address(address)
    if scheme not in SCHEDULER_SCHEMES:
        raise TokshardError(
            f"--scheduler {address}: {scheme}:// is not supported; give a tcp://HOST:PORT address (or "
            f"{', '.join(f'{s}://' for s in SCHEDULER_SCHEMES[1:])}), or the scheduler's file"
        )
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        said = f"port {port!r} is not a port number (1-65535)" if port else "no port given"
        shown = f"[{host}]" if ":" in host else host or "HOST"
        raise TokshardError(
            f"--scheduler {address}: {said}; give the scheduler's HOST:PORT ({scheme}://{shown}:8786 by default)"
        )
    check_scheduler_host(address, scheme, host, port)
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TokshardError(
            f"--scheduler {address}: host {host} does not resolve ({reason}); check the scheduler's host "
            "name, or give its IP address"
        ) from None


def check_scheduler_host(address: str, scheme: str, host: str, port: str) -> None:
    """Refuse a host Dask cannot connect to however long it tries: none at all (":8786" waited
    15 s, then said the scheduler was out of reach), or an IPv6 address without its brackets
    ("::1:8786" failed only once the run had planned)."""
    if not host:
        raise TokshardError(
            f"--scheduler {address}: no host given; give the scheduler's HOST:PORT "
            f"({scheme}://127.0.0.1:{port} on this machine)"
        )
    if ":" in host and not address.split("://", 1)[-1].startswith("["):
        raise TokshardError(
            f"--scheduler {address}: an IPv6 address goes in brackets; give {scheme}://[{host}]:{port}"
        )


def check_speaks_dask(address: str) -> None:
    """Refuse a tcp:// port that accepts connections but never starts Dask's handshake (an HTTP
    server, Dask's own dashboard): Dask's client would wait for it forever. Other protocols,
    and ports nobody listens on, are left to Dask (it says those itself)."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "tcp") or not port.isdigit():
        return
    host = host.strip("[]") or "127.0.0.1"
    try:
        sock = socket.create_connection((host, int(port)), timeout=HANDSHAKE_SECONDS)
    except OSError:
        return  # refused, unreachable: Dask's own error names it
    with sock:
        try:
            sock.settimeout(HANDSHAKE_SECONDS)
            first = sock.recv(8)
        except OSError:  # the timeout among them
            first = b""
    if not first:
        raise TokshardError(
            f"--scheduler {address}: port {port} answers but is not a Dask scheduler (the dashboard's "
            f"port?); give the scheduler's address, tcp://{host}:8786 by default"
        )


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """The variables Dask's nannies set in this process's own environment before they spawn a
    worker (their pre-spawn settings: OMP_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED;
    and Dask's parent-pid mark) as they were before the block: every process the driver
    started later inherited them, so the demo's trainer ran on one thread after a prepare in
    the same process, on the machine's default after a rerun that skipped it, and computed
    otherwise. Only those names: the driver's other threads set variables of their own meanwhile
    (the encoders' thread counts)."""
    import dask
    import distributed  # noqa: F401  (its defaults hold the nannies' settings)

    names = {
        *dask.config.get("distributed.nanny.pre-spawn-environ", {}),
        "PYTHONHASHSEED",
        "__DASK_PARENT_PID",
    }
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def scratch_folder_named() -> Iterator[None]:
    """A local cluster that cannot make or write its scratch folder (Dask's
    ``temporary-directory`` set to a read-only or missing mount) is one line naming the folder
    and the setting, not Dask's "Cluster failed to start" traceback."""
    try:
        yield
    except RuntimeError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.filename:
            raise TokshardError(
                f"Dask's local workers could not use their scratch folder {cause.filename} ({cause.strerror}); "
                "point Dask's temporary-directory at a writable local folder (DASK_TEMPORARY_DIRECTORY=DIR, "
                "or temporary-directory in ~/.config/dask/dask.yaml)"
            ) from exc
        raise


def _local_cluster(n: int, threads: int, memory_limit: str | None, dashboard: bool):
    """The workers of a run without --scheduler. No dashboard unless asked: building it
    (importing bokeh) holds the worker processes' start back. Without it, the workers' event
    loops also wake less often, which the encoder feels on a small node: Dask's statistical
    profiler (only the dashboard shows it) samples every thread's stack each 10 ms, and its
    event-loop tick runs every 20 ms; both are turned down."""
    import dask
    from distributed import LocalCluster

    quiet = (
        {}
        if dashboard
        else {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "100ms"}
    )
    before_spawn = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in MALLOC_ENV.items()}
    with (
        dask.config.set(before_spawn),
        scratch_folder_named(),
        environment_kept(),
    ):  # the nannies read it here
        return LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit or LOCAL_MEMORY_LIMIT,
            dashboard_address=":0",  # any free port, for the dashboard or just /health
            scheduler_kwargs={"dashboard": dashboard},
            # a task's error reaches the driver, which reports it once (one line for a user error)
            silence_logs=logging.CRITICAL,
            env=worker_env(threads),
            config={**quiet, **UNPAUSED},  # the workers' Dask config: this on top of ours
        )
