"""Which signals stop a command in one line (`command.stopping_signals_raise`): SIGTERM and a
closed terminal's SIGHUP raise `Terminated` with the shell's exit status, and a signal the
command was started ignoring (``nohup``) stays ignored. The whole `prepare` and `train` runs
are in tests/pipeline/run/test_signals.py and tests/trainer/test_trainer_resume_safety.py."""

from __future__ import annotations

import os
import signal

import pytest

from tokshard.commands.command import Terminated, stopping_signals_raise


@pytest.mark.parametrize(
    ("signum", "code", "what"),
    [
        (signal.SIGTERM, 143, "stopped by SIGTERM"),
        (signal.SIGHUP, 129, "stopped by SIGHUP (its terminal closed)"),
    ],
)
def test_a_stopping_signal_raises_terminated_with_its_exit_status(signum, code, what):
    started_with = signal.signal(signum, signal.SIG_DFL)  # as a command typed at a terminal (the
    try:  # suite may run under nohup)
        with pytest.raises(Terminated) as raised, stopping_signals_raise():
            os.kill(os.getpid(), signum)
            pytest.fail("the signal did not stop the block")
        assert (raised.value.exit_code, raised.value.what) == (code, what)
        assert signal.getsignal(signum) is signal.SIG_DFL  # the handler before the block is back
    finally:
        signal.signal(signum, started_with)


def test_a_sighup_ignored_at_start_stays_ignored_as_nohup_asks():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stopping_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # would raise Terminated if taken
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
