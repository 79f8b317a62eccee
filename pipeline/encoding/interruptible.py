"""A long call into Rust (training a tokenizer) runs on a thread the main thread waits on in
short steps.

Python runs a signal's handler only on the main thread, between bytecodes: while the main
thread is inside one long native call, Ctrl-C, SIGTERM or a closed terminal's SIGHUP waits
until the call returns (17 s for a tokenizer's merges on 150 MB). Waiting in steps, the main
thread takes the signal at once and the command stops; the abandoned thread dies with the
process (a daemon: nothing waits for it at exit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: how often the waiting thread wakes to take a signal
STEP_SECONDS = 0.1


def interruptible(work: Callable[[], T], name: str) -> T:
    """``work()``'s result (or its exception), computed on a daemon thread called ``name``."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as exc:  # raised again on the waiting thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(STEP_SECONDS)
    if failed:
        raise failed[0]
    return done[0]
