"""A long native call runs on a thread the main thread waits on in steps
(`pipeline.encoding.interruptible`): a signal stops the wait at once, and the thread left running
is known, so the command ends without the teardown that thread would abort."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from pipeline.encoding.interruptible import interruptible, work_abandoned


def test_the_result_and_the_exception_of_the_work_come_back_to_the_caller():
    assert interruptible(lambda: 42, "answer") == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0, "fails")
    assert not work_abandoned()


def test_a_signal_stops_the_wait_at_once_and_the_thread_left_running_is_known():
    release = threading.Event()
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            interruptible(lambda: release.wait(30), "long work")
        assert work_abandoned()  # the entry point ends the process without its teardown
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()
    for _ in range(50):
        if not work_abandoned():
            break
        time.sleep(0.1)
    assert not work_abandoned()  # once it has ended, nothing is left to abort
