"""The process limits a prepare runs under (``ulimit -n``, ``ulimit -v``), checked before it
makes anything.

Below what its processes need, a prepare failed late and badly: with few open files Dask's
nannies could not start (a long traceback), and with little address space the tokenizer's
allocator aborted the process ("memory allocation of 64 bytes failed") or a thread spun
while the main one waited for good; each after the run had made its folder. A soft limit
under the hard one is raised first, as a shell user would; what is still short is one line.
"""

from __future__ import annotations

import contextlib
import os
import resource

from pipeline.format.errors import TokshardError

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


def check(local_workers: int) -> None:
    """Raise short soft limits to what the run needs (within the hard ones) or refuse in one
    line; ``local_workers``: the workers this machine starts (0 for a scheduler's or jobs')."""
    _open_files(OPEN_FILES_BASE + OPEN_FILES_PER_LOCAL_WORKER * local_workers, local_workers)
    _address_space(ADDRESS_SPACE_BASE + ADDRESS_SPACE_PER_CPU * (os.cpu_count() or 1))


def _raised(kind: int, need: int, wanted: int) -> tuple[int, int]:
    """(soft, hard) of ``kind`` after raising a soft limit under ``need`` to ``wanted`` or the
    hard limit, whichever is lower."""
    soft, hard = resource.getrlimit(kind)
    if soft != resource.RLIM_INFINITY and soft < need:
        to = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(kind, (max(to, soft), hard))
        soft, hard = resource.getrlimit(kind)
    return soft, hard


def _open_files(need: int, local_workers: int) -> None:
    soft, hard = _raised(resource.RLIMIT_NOFILE, need, max(need, OPEN_FILES_WANTED))
    if soft != resource.RLIM_INFINITY and soft < need:
        workers = f" with {local_workers} local workers" if local_workers else ""
        raise TokshardError(
            f"open files are limited to {soft} here (ulimit -n; hard limit {_shown(hard)}); a prepare{workers} "
            f"needs about {need}: raise it (ulimit -n 4096) and rerun"
        )


def _address_space(need: int) -> None:
    soft, hard = _raised(resource.RLIMIT_AS, need, resource.RLIM_INFINITY)
    if soft != resource.RLIM_INFINITY and soft < need:
        raise TokshardError(
            f"address space is limited to {soft >> 20:,} MiB a process here (ulimit -v {soft >> 10}; hard limit "
            f"{_shown(hard, 'KiB')}); a prepare on {os.cpu_count()} cores needs about {need >> 20:,} MiB (its "
            f"tokenizer's threads each reserve memory): raise it (ulimit -v unlimited, or at least "
            f"{need >> 10}) and rerun; to bound memory, use --memory-limit instead"
        )


def _shown(limit: int, unit: str = "") -> str:
    if limit == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{limit >> 10} {unit}".strip() if unit else str(limit)
