"""Slow subprocesses whose result a test only reads, started niced when the session starts.

A job at nice 19 runs on what the tests leave idle, so an exhaustive scan costs the suite
little wall time; one the suite would otherwise wait for at its end runs less niced
(`Command.nice`). The tests that read a job run last (``tests/conftest.py`` moves
them), so the job has had the whole session. Under pytest-xdist each job is started by one
worker (`owned_here`) and read by any, through the files it leaves in a folder they share.

A module declares a job with ``@background_job`` on a function that returns the command (it
may write the job's inputs into the folder it is given); the decorated name is the fixture
that waits for the job and returns what it left (`Finished`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    #: 19 runs the job on what the tests leave idle; a job the suite waits for at its end (a
    #: chain of processes one after another, which leaves a core idle meanwhile) takes less
    nice: int = 19


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    folder: Path  # the job's own folder, with what it wrote there


#: job name -> what builds its command in a folder of its own
JOBS: dict[str, Callable[[Path], Command]] = {}
#: how long a reader waits for a job, and the owner for it at the session's end
JOB_TIMEOUT = 1200.0
#: the process ids of the jobs started (each leads its own process group)
LEADERS: set[int] = set()


#: the job's command at the niceness given first, then its exit status written to the file
#: named by $0 (renamed into place, so a reader never sees it half-written)
RUN_AND_RECORD = 'n=$1; shift; nice -n "$n" "$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"'


class Job:
    """One job, started by the worker that owns it and read by any: its output and, once it
    ends, its exit status go to files in its folder, so a job that prints much never blocks
    and a reader in another pytest-xdist worker waits on the same files."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name, self.folder = name, folder
        self.stdout, self.stderr = folder / "stdout", folder / "stderr"
        self.status = folder / "returncode"
        self.proc: subprocess.Popen | None = None

    def start(self, command: Command) -> None:
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                ["sh", "-c", RUN_AND_RECORD, self.status, str(command.nice), *command.argv],
                stdout=out,
                stderr=err,
                env=command.env,
                # a process group of its own, stopped as one with its children; not a session
                # of its own, where the kernel's autogroups would give it a fair share of the CPU
                # against the whole suite, whatever its nice
                process_group=0,
            )
        LEADERS.add(self.proc.pid)

    def wait(self, timeout: float) -> Finished:
        end = time.monotonic() + timeout
        while not self.status.exists():
            if time.monotonic() > end:
                raise TimeoutError(f"background job {self.name} did not end within {timeout:.0f} s")
            time.sleep(0.2)
        returncode = int(self.status.read_text())
        return Finished(returncode, self.stdout.read_text(), self.stderr.read_text(), self.folder)

    def finish(self, interrupted: bool, timeout: float) -> None:
        """At the end of the owner's session: a reader in another worker may still wait for the
        job, so it runs to its end, unless the session was interrupted."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if not interrupted:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def owned_here(names: list[str]) -> list[str]:
    """The jobs this process starts: all of them, or under pytest-xdist every N-th, by worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return names
    index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    return [name for i, name in enumerate(names) if i % count == index]


def shared_folder(basetemp: Path) -> Path:
    """Where the jobs' folders go: the run's temporary folder, which pytest-xdist's workers
    share (each one's own ``basetemp`` is a folder inside it)."""
    return basetemp.parent if "PYTEST_XDIST_WORKER" in os.environ else basetemp


def in_a_job(process) -> bool:
    """Is this `psutil.Process` a job or one of its descendants? Tests that count the
    processes they leave behind leave those out: a job starts and ends its own all along."""
    import psutil

    try:
        return process.pid in LEADERS or any(p.pid in LEADERS for p in process.parents())
    except psutil.Error:
        return False


def background_job(build: Callable[[Path], Command]) -> Callable:
    """Register ``build`` as a job and return the fixture (of the same name) that waits for it."""
    name = build.__name__
    JOBS[name] = build

    @pytest.fixture(name=name, scope="session")
    def finished(background_jobs: dict[str, Job]) -> Finished:
        return background_jobs[name].wait(timeout=JOB_TIMEOUT)

    finished.__doc__ = build.__doc__
    return finished


def wanted_jobs(items: list[pytest.Item]) -> list[str]:
    """The jobs that some selected test reads."""
    return sorted({name for item in items for name in getattr(item, "fixturenames", ()) if name in JOBS})


def readers_last(items: list[pytest.Item]) -> None:
    """Move the tests that read a job to the end, in their order (a module's stay together),
    each allowed to wait for its job as long as `JOB_TIMEOUT` (the suite's per-test timeout
    counts the wait in its setup: on a slow day the jobs get the CPU only at the end)."""
    reads = [bool(set(getattr(item, "fixturenames", ())) & JOBS.keys()) for item in items]
    for item, read in zip(items, reads, strict=True):
        if read:
            item.add_marker(pytest.mark.timeout(JOB_TIMEOUT + 300))
    items[:] = [i for i, r in zip(items, reads, strict=True) if not r] + [
        i for i, r in zip(items, reads, strict=True) if r
    ]
