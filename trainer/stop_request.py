"""A stop that SIGTERM asks for (a job's time limit, a preemption, ``kill``), taken at the next
step boundary with a checkpoint of that step. Stopping at once would lose every step since the
last checkpoint: with the default ``--save-every 0``, the whole run. An evaluation under way
is abandoned between two of its forward passes (`trainer.evaluate`): it can take minutes,
and the resume runs it again.

Every rank must stop at the same step, or the checkpoint's collectives would wait forever, so
the ranks agree at each step boundary (and before each forward pass of an evaluation) through a one-number all-reduce on the CPU (gloo; a group
of its own where training runs on NCCL), which never waits for a GPU. A second SIGTERM goes to
the handler that was there before (the CLI's: stop at once, in one line)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import torch

#: the signals that ask for a checkpoint before the stop
SAVING_SIGNALS = (signal.SIGTERM,)


class StoppedBySignal(BaseException):
    """The run stopped at a step boundary, its checkpoint saved, as a signal asked. A
    BaseException, as the CLI's stopping signals are, so that no ``except Exception`` on the
    way swallows it."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(signum, step)
        self.signum, self.step = signum, step


class StopRequest:
    """The first SIGTERM this process received, and what the ranks agree on."""

    def __init__(self, world: int) -> None:
        self.signum = 0
        self.world = world
        self._before: dict[int, object] = {}
        # made by every rank at the same point (a new group is a collective itself)
        on_gloo = world == 1 or torch.distributed.get_backend() == "gloo"
        self.group = None if on_gloo else torch.distributed.new_group(backend="gloo")

    @contextmanager
    def listening(self) -> Iterator[None]:
        """Within the block, the first SIGTERM is noted for the next step boundary. A signal
        that was ignored when the block began (``nohup``) stays ignored; only the main thread
        handles signals, so elsewhere nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._before = {s: signal.getsignal(s) for s in SAVING_SIGNALS}
        for signum, handler in self._before.items():
            if handler is not signal.SIG_IGN:
                signal.signal(signum, self._note)
        try:
            yield
        finally:
            for signum, handler in self._before.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self.signum:
            self.signum = signum
            return
        before = self._before.get(signum)
        if callable(before):  # asked again: stop at once, as the handler before does
            before(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    def agreed(self) -> int:
        """The signal that asked any rank to stop (0: none), the same on every rank."""
        if self.world == 1:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(flag.item())
