"""One process group for every way of starting: plain ``python``, ``deepspeed``, ``torchrun``.

Launchers set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``; a plain
single process gets the same defaults here (a free local port), so there is one code path.
CPU runs use gloo, GPUs nccl.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import resource
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.format.errors import TokshardError
from pipeline.format.os_limits import raised, shown, user_threads

_MPI_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched_local_world() -> int:
    """The ranks the launcher started on this host (they share its memory)."""
    for key in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def launched_world() -> int:
    """The number of ranks the launcher started, read before any process group exists."""
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def single_process_env() -> None:
    """Give a process started without a launcher the environment of a world of one."""
    if "RANK" in os.environ or any(k in os.environ for k in _MPI_ENV):
        return  # a launcher (or mpirun, which DeepSpeed discovers itself) set it up
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


#: what DeepSpeed's import says on a machine without a GPU (`import_deepspeed` leaves it out)
CPU_WARNING = "Setting accelerator to CPU"
#: what DeepSpeed's WarmupCosineLR warns at every start: its own constructor asks for the rate
#: before step 0, and sets the first step's rate (0, as it should) from the answer
SCHEDULER_START_WARNING = "Attempting to get learning rate from scheduler before it has started"


class LeavingOut(logging.Filter):
    """Drops a logger's records that contain ``text`` (a warning about nothing wrong)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def import_deepspeed() -> Any:
    """DeepSpeed, its loggers writing to stderr: stdout is the run's console.

    Its loggers take ``sys.stdout`` when they are made, on import, and the import itself warns
    "Setting accelerator to CPU" on a machine without a GPU (the run's own first line says where
    it runs). So the import runs with stdout caught: the loggers are then pointed at stderr, and
    what the import said, but for that warning, goes there too."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            import deepspeed
            from deepspeed.utils import logger
    finally:  # what it said goes to stderr even where the import failed
        for each in [logging.root, *logging.root.manager.loggerDict.values()]:
            for handler in getattr(each, "handlers", ()):
                if isinstance(handler, logging.StreamHandler) and handler.stream is said:
                    handler.setStream(sys.stderr)
        rest = [line for line in said.getvalue().splitlines(keepends=True) if CPU_WARNING not in line]
        sys.stderr.write("".join(rest))
    logger.setLevel(logging.WARNING)  # our own log line per step is the readable record
    logger.addFilter(LeavingOut(SCHEDULER_START_WARNING))
    return deepspeed


#: open files of each rank: torch's and DeepSpeed's own, the shards' memory maps (each holds a
#: descriptor), the logs; measured with the tiny model on 2 shards, a world of one failed at
#: `ulimit -n 28` (a socket of gloo's) and ran at 32 (the need below, then). Under 24 torch's
#: TCPStore retried for ten minutes, deaf to SIGTERM, and ended in a traceback.
OPEN_FILES_BASE = 28
#: and for each rank of the world: gloo's connections to it and the store's
OPEN_FILES_PER_RANK = 4
#: the soft limit a short one is raised to, at most (within the hard limit)
OPEN_FILES_WANTED = 4096


def check_open_files() -> None:
    """Raise a short soft limit of open files to what a rank needs (within the hard limit, as a
    shell user would) or refuse in one line, before the process group starts."""
    need = OPEN_FILES_BASE + OPEN_FILES_PER_RANK * launched_world()
    soft, hard = raised(resource.RLIMIT_NOFILE, need, max(need, OPEN_FILES_WANTED))
    if soft != resource.RLIM_INFINITY and soft < need:
        raise TokshardError(
            f"open files are limited to {soft} here (ulimit -n; hard limit {shown(hard)}); train needs about {need} "
            f"in each process of a world of {launched_world()}: raise it (ulimit -n {OPEN_FILES_WANTED}) and rerun"
        )


#: threads of each rank beyond torch's intra-op pool (one a thread of it): gloo's, the data
#: loader's, the logs'; a world of one on 2 cores peaked at 11. Under `ulimit -u 8` gloo's
#: process group could not start (a traceback), or a native thread pool aborted the process.
THREADS_BASE = 10
#: the soft limit a short one is raised to, at most (within the hard limit)
PROCESSES_WANTED = 4096


def check_processes() -> None:
    """Raise a short soft limit of processes and threads (``ulimit -u``, which counts every
    thread of this user's processes) to what this machine's ranks need, within the hard limit,
    or refuse in one line before torch starts its threads."""
    if resource.getrlimit(resource.RLIMIT_NPROC)[0] == resource.RLIM_INFINITY or os.getuid() == 0:
        return  # root is never held to it
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    need = ranks * (THREADS_BASE + torch.get_num_threads()) + user_threads()
    soft, hard = raised(resource.RLIMIT_NPROC, need, max(need, PROCESSES_WANTED))
    if soft != resource.RLIM_INFINITY and soft < need:
        raise TokshardError(
            f"processes and threads are limited to {soft} for this user here (ulimit -u; hard limit {shown(hard)}); "
            f"train needs about {need} with what runs already ({ranks} local rank(s), {torch.get_num_threads()} "
            f"threads each): raise it (ulimit -u {PROCESSES_WANTED}) and rerun"
        )


def init(cuda: bool) -> Dist:
    single_process_env()
    deepspeed = import_deepspeed()
    if not cuda:
        # the shared-memory all-reduce is a JIT-compiled extension (a minute) that gloo does not need
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # before the process group, so NCCL binds this GPU
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    return Dist(rank, world, local_rank, device)


def finish(dist: Dist) -> None:
    """Take the process group down once every rank is done with it.

    Left to interpreter exit, gloo's worker threads can still hold finished work whose
    tensors are freed after Python is gone, which aborts the process (SIGABRT) after a run
    that succeeded. Only the normal end comes here: after a failure a peer may never reach
    the barrier, and the exit code already says what happened.
    """
    if dist.world > 1:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def abandon() -> None:
    """Take this rank's process group down after a run stopped by a signal or an error, without
    waiting for the other ranks (one may never come). Left to interpreter exit, the group's gloo
    threads abort the process now and then (SIGABRT, "terminate called without an active
    exception") after its one line was said, and the exit code a job's scheduler reads is lost."""
    if torch.distributed.is_initialized():
        with contextlib.suppress(Exception):  # the run's own stop or error is what to report
            torch.distributed.destroy_process_group()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


#: how gloo and NCCL say that the other end of a connection between ranks went away
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "ncclremoteerror",
    "communicator was aborted",
)


class RankLost(TokshardError):
    """Another rank of the run went away (killed, out of memory, its node lost): exit 1, as a
    run that failed where it ran, not a command line to fix (exit 2), so a job script can tell
    "rerun it" from "fix it"."""

    exit_code = 1


def lost_a_rank(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure because another rank went away: torch's
    network or backend errors, and gloo's or NCCL's runtime errors, that name a closed or reset
    connection. Any other error (a bug's, too) is not, and keeps its own report."""
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    # a network error that names no peer gone (a store it cannot reach at start, no file
    # descriptor left) is not a lost rank: it keeps its own report
    named = isinstance(exc, torch.distributed.DistNetworkError | torch.distributed.DistBackendError) or any(
        lib in text for lib in ("gloo", "nccl")
    )
    return named and any(gone in text for gone in _PEER_GONE)


def lost_rank_reason(exc: BaseException) -> str:
    """The part of a lost rank's error that says what happened, without gloo's source path
    ("[.../pair.cc:553] ") or its advice: "gloo: Connection closed by peer [127.0.0.1]:9139"."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    backend = "nccl" if "nccl" in str(exc).lower() else "gloo" if "gloo" in str(exc).lower() else "torch"
    said = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0].rstrip(".")
    return f"{backend}: {said}"
