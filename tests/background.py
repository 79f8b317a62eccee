"""Slow subprocesses whose result a test only reads, started at nice 19 when the session starts.

The suite keeps a little over one of two cores busy on average. A job at nice 19 runs on what
the other tests leave idle, so an exhaustive scan or a dry run costs the suite little wall
time. The tests that read a job run last (``tests/conftest.py`` moves them), so the job has
had the whole session.

A module declares a job with ``@background_job`` on a function that returns the command (it
may write the job's inputs into the folder it is given); the decorated name is the fixture
that waits for the job and returns what it left (`Finished`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    folder: Path  # the job's own folder, with what it wrote there


#: job name -> what builds its command in a folder of its own
JOBS: dict[str, Callable[[Path], Command]] = {}
#: the process ids of the jobs started (each leads its own process group)
LEADERS: set[int] = set()


class Job:
    """One started job; its output goes to files, so a job that prints much never blocks."""

    def __init__(self, name: str, command: Command, folder: Path) -> None:
        self.name, self.command, self.folder = name, command, folder
        self.stdout, self.stderr = folder / "stdout", folder / "stderr"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                ["nice", "-n", "19", *command.argv],
                stdout=out,
                stderr=err,
                env=command.env,
                start_new_session=True,  # stopped as a group: its own children go with it
            )
        LEADERS.add(self.proc.pid)

    def wait(self, timeout: float) -> Finished:
        returncode = self.proc.wait(timeout)
        return Finished(returncode, self.stdout.read_text(), self.stderr.read_text(), self.folder)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


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
        return background_jobs[name].wait(timeout=1200)

    finished.__doc__ = build.__doc__
    return finished


def wanted_jobs(items: list[pytest.Item]) -> list[str]:
    """The jobs that some selected test reads."""
    return sorted({name for item in items for name in getattr(item, "fixturenames", ()) if name in JOBS})


def readers_last(items: list[pytest.Item]) -> None:
    """Move the tests that read a job to the end, in their order (a module's stay together)."""
    reads = [bool(set(getattr(item, "fixturenames", ())) & JOBS.keys()) for item in items]
    items[:] = [i for i, r in zip(items, reads, strict=True) if not r] + [
        i for i, r in zip(items, reads, strict=True) if r
    ]
