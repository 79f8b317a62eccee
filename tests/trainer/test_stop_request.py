"""`trainer.stop_request`: the first SIGTERM is kept for the next step boundary, a second
stops at once through the handler there before, and a signal ignored at the start stays so."""

from __future__ import annotations

import os
import signal

import pytest

from trainer.stop_request import StopRequest


class Stopped(BaseException):
    pass


def raising(signum, frame):
    raise Stopped(signum)


@pytest.fixture
def cli_handler():
    """The CLI's handler for SIGTERM while a command runs: stop at once."""
    before = signal.signal(signal.SIGTERM, raising)
    yield
    signal.signal(signal.SIGTERM, before)


def test_the_first_sigterm_is_kept_for_the_step_boundary(cli_handler):
    stop = StopRequest(world=1)
    with stop.listening():
        assert stop.agreed() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is raising


def test_a_second_sigterm_stops_at_once_through_the_handler_before(cli_handler):
    stop = StopRequest(world=1)
    with pytest.raises(Stopped), stop.listening():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_ignored_at_the_start_stays_ignored():
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        stop = StopRequest(world=1)
        with stop.listening():
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.agreed() == 0
    finally:
        signal.signal(signal.SIGTERM, before)
