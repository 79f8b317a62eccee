"""This process's limits (``ulimit``), read and raised alike by prepare and train: a soft limit
under the hard one is raised first, as a shell user would, before a run is refused for it.
Stdlib only: the trainer imports it as it imports the rest of the contract."""

from __future__ import annotations

import contextlib
import os
import resource


def raised(kind: int, need: int, wanted: int) -> tuple[int, int]:
    """(soft, hard) of ``kind`` after raising a soft limit under ``need`` to ``wanted`` or the
    hard limit, whichever is lower."""
    soft, hard = resource.getrlimit(kind)
    if soft != resource.RLIM_INFINITY and soft < need:
        to = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(kind, (max(to, soft), hard))
        soft, hard = resource.getrlimit(kind)
    return soft, hard


def shown(limit: int, unit: str = "") -> str:
    """A limit as a message says it: "unlimited", or its number (in KiB where ``unit`` names one)."""
    if limit == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{limit >> 10} {unit}".strip() if unit else str(limit)


def user_threads() -> int:
    """The threads of every process of this (real) user, which ``ulimit -u`` counts together;
    those /proc does not show are not counted (not Linux: none)."""
    uid = str(os.getuid())
    count = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            count += _threads_of(entry.path, uid)
    return count


def _threads_of(proc: str, uid: str) -> int:
    """The threads of the process at ``proc`` (/proc/PID) if its real user is ``uid``, else 0."""
    try:
        with open(f"{proc}/status", encoding="ascii", errors="replace") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:  # gone since, or hidden
        return 0
    if fields.get("Uid", "").split()[:1] != [uid]:
        return 0
    return int(fields.get("Threads", "1").strip() or 1)
