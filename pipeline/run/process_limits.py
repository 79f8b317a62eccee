"""The process limits a prepare runs under (``ulimit -n``, ``ulimit -v``), checked before it
makes anything.

Below what its processes need, a prepare failed late and badly: with few open files Dask's
nannies could not start (a long traceback), and with little address space the tokenizer's
allocator aborted the process ("memory allocation of 64 bytes failed") or a thread spun
while the main one waited for good; each after the run had made its folder. A soft limit
under the hard one is raised first, as a shell user would; what is still short is one line.
"""

from __future__ import annotations

import errno
import os
import resource

from pipeline.format.errors import TokshardError
from pipeline.format.os_limits import raised, shown, user_threads

#: open files: the driver's own (inputs, the run's state, sockets to the scheduler) and, for
#: each local worker, its nanny's pipes and connections. Measured with Llama 3 on a 280 KB
#: input: one local worker ran at `ulimit -n 40`, two failed at 40 and ran at 48.
OPEN_FILES_BASE = 40
OPEN_FILES_PER_LOCAL_WORKER = 12
#: the soft limit a short one is raised to, at most (the hard limit may be a million)
OPEN_FILES_WANTED = 4096

#: address space of each process (a limit applies to each alone). Measured on 2 cores with two
#: local workers and 1 MB of prose: o200k_base ran at `ulimit -v 800000`, Llama 3 aborted at
#: 1,000,000 KiB and ran at 1,300,000. glibc reserves a 64 MiB arena for each thread that
#: allocates, and the tokenizer's pool has a thread per core, so the need grows with the cores.
ADDRESS_SPACE_BASE = 2 << 30
ADDRESS_SPACE_PER_CPU = 64 << 20


def check(local_workers: int, threads: int = 1) -> None:
    """Raise short soft limits to what the run needs (within the hard ones) or refuse in one
    line; ``local_workers``: the workers this machine starts (0 for a scheduler's or jobs'),
    ``threads``: each one's encoder threads."""
    _open_files(OPEN_FILES_BASE + OPEN_FILES_PER_LOCAL_WORKER * local_workers, local_workers)
    per_worker = PROCESSES_PER_LOCAL_WORKER + max(threads - 1, 0)
    _processes(PROCESSES_BASE + per_worker * local_workers, local_workers)
    _address_space(ADDRESS_SPACE_BASE + ADDRESS_SPACE_PER_CPU * (os.cpu_count() or 1))


def _open_files(need: int, local_workers: int) -> None:
    soft, hard = raised(resource.RLIMIT_NOFILE, need, max(need, OPEN_FILES_WANTED))
    if soft != resource.RLIM_INFINITY and soft < need:
        workers = f" with {local_workers} local workers" if local_workers else ""
        raise TokshardError(
            f"open files are limited to {soft} here (ulimit -n; hard limit {shown(hard)}); a prepare{workers} "
            f"needs about {need}: raise it (ulimit -n 4096) and rerun"
        )


def _processes(need: int, local_workers: int) -> None:
    """Refuse a run whose threads and processes would not fit under ``ulimit -u`` beside those
    this user runs already (``need``: the ones the run starts); a short soft limit is raised
    first."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft == resource.RLIM_INFINITY or os.getuid() == 0:  # root is never held to it
        return
    running = user_threads()
    soft, hard = raised(resource.RLIMIT_NPROC, running + need, max(running + need, PROCESSES_WANTED))
    if soft != resource.RLIM_INFINITY and soft < running + need:
        workers = f" with {local_workers} local workers" if local_workers else ""
        raise TokshardError(
            f"processes and threads are limited to {soft} for this user here (ulimit -u; hard limit "
            f"{shown(hard)}), and {running} run already; a prepare{workers} starts about {need} more: "
            f"raise it (ulimit -u {PROCESSES_WANTED}), or stop other processes of this user, and rerun"
        )


def _address_space(need: int) -> None:
    soft, hard = raised(resource.RLIMIT_AS, need, resource.RLIM_INFINITY)
    if soft != resource.RLIM_INFINITY and soft < need:
        raise TokshardError(
            f"address space is limited to {soft >> 20:,} MiB a process here (ulimit -v {soft >> 10}; hard limit "
            f"{shown(hard, 'KiB')}); a prepare on {os.cpu_count()} cores needs about {need >> 20:,} MiB (its "
            f"tokenizer's threads each reserve memory): raise it (ulimit -v unlimited, or at least "
            f"{need >> 10}) and rerun; to bound memory, use --memory-limit instead"
        )


#: processes and threads a prepare starts: ``ulimit -u`` (RLIMIT_NPROC) counts every thread of
#: every process of the user (root is never held to it). Measured with GPT-2 on 2 cores, 12
#: partitions, the user's threads at their peak: the shell and the driver 7, each local worker
#: (its nanny's threads, its process's) 7 more. Under it a nanny failed to start (a chained
#: traceback), or a worker came up unable to run its task and the run hung.
PROCESSES_BASE = 6
#: and for each local worker, one spare; each encoder thread past the first (--threads) adds one
PROCESSES_PER_LOCAL_WORKER = 8
#: the soft limit a short one is raised to, at most (within the hard limit)
PROCESSES_WANTED = 4096
#: what a thread or process start says when the kernel refuses it: Python's `threading`, and
#: C++'s std::thread (gloo's, at process-group start: std::system_error of EAGAIN)
THREAD_REFUSED = "can't start new thread"
#: the Python functions a fork, clone or spawn is refused in (EAGAIN, os.fork's and
#: os.posix_spawn's BlockingIOError): subprocess's and multiprocessing's starts of a child. EAGAIN
#: anywhere else (a non-blocking socket) is not this
PROCESS_STARTS = frozenset({"_execute_child", "_launch"})


def processes_exhausted(exc: BaseException) -> TokshardError | None:
    """A thread or process the kernel would not start (EAGAIN: the limit of processes and
    threads, ``ulimit -u``, or the system's), met in ``exc`` or what it was raised from (Dask's
    "Nanny failed to start", DeepSpeed's process group), as one line; None for anything else."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _start_refused(exc):
            return processes_refused()
        exc = exc.__cause__ or exc.__context__
    return None


def _start_refused(exc: BaseException) -> bool:
    """Whether ``exc`` itself is the kernel refusing a new thread or process."""
    said = str(exc).strip()
    if isinstance(exc, OSError):
        return exc.errno == errno.EAGAIN and _innermost_function(exc) in PROCESS_STARTS
    return isinstance(exc, RuntimeError) and (THREAD_REFUSED in said or said == os.strerror(errno.EAGAIN))


def _innermost_function(exc: BaseException) -> str | None:
    """The name of the Python function ``exc`` was raised in (None without a traceback)."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


def processes_refused() -> TokshardError:
    """The line for a thread or process the kernel would not start, naming the limit it met."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return TokshardError(
            "the system would not start another thread or process (its limits: kernel.threads-max, "
            "kernel.pid_max, or a container's pids limit); raise the one reached, or stop other "
            "processes, and rerun"
        )
    return TokshardError(
        f"cannot start another thread or process: this user's processes and threads, all of them "
        f"together, are limited to {soft} here (ulimit -u; hard limit {shown(hard)}); raise it "
        f"(ulimit -u {PROCESSES_WANTED}), or stop other processes of this user, and rerun"
    )
