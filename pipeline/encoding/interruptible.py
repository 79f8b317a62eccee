"""A long call into Rust (training a tokenizer) runs on a thread the main thread waits on in
short steps.

Python runs a signal's handler only on the main thread, between bytecodes: while the main
thread is inside one long native call, Ctrl-C, SIGTERM or a closed terminal's SIGHUP waits
until the call returns (17 s for a tokenizer's merges on 150 MB). Waiting in steps, the main
thread takes the signal at once and the command stops. The abandoned thread (a daemon: nothing
waits for it) must not meet the interpreter's teardown: a thread inside Rust that reaches for
Python then is ended by an unwind Rust cannot pass, and the process aborts (SIGABRT, "FATAL:
exception not rethrown") after its stop line. `work_abandoned` tells the command's entry point
to end the process without that teardown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: how often the waiting thread wakes to take a signal
STEP_SECONDS = 0.1

#: for each thread left running when a signal stopped the wait for it, what is set as it ends
#: (not `Thread.is_alive`: a join that a signal interrupts marks a running thread stopped)
_abandoned: list[threading.Event] = []


def work_abandoned() -> bool:
    """Whether a thread this module started is still running, left by a stopped command."""
    return not all(ended.is_set() for ended in _abandoned)


def interruptible(work: Callable[[], T], name: str) -> T:
    """``work()``'s result (or its exception), computed on a daemon thread called ``name``."""
    done: list[T] = []
    failed: list[BaseException] = []
    ended = threading.Event()

    def run() -> None:
        try:
            done.append(work())
        except BaseException as exc:  # raised again on the waiting thread
            failed.append(exc)
        finally:
            ended.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        while not ended.wait(STEP_SECONDS):
            pass
    except BaseException:  # a signal's exception: the command stops, the thread runs on
        _abandoned.append(ended)
        raise
    if failed:
        raise failed[0]
    return done[0]
