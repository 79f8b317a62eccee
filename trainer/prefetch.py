"""Batches prepared ahead on a background thread, so the training loop never reads disk.

The thread draws positions and gathers their samples (windows, or packed windows) from the
memory maps. On CUDA it gathers into
a pinned buffer and starts the host-to-device copy on its own stream with
``non_blocking=True``, then waits for that copy (GIL released) before queueing the batch:
the main stream can use it at once, and the pinned buffer is refilled only once free.
The loop's only data cost is ``Queue.get`` on a batch that is normally already there; it is
timed (``Prefetcher.wait_s``) and reported as the data-wait fraction of step time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from trainer.data import Samples, check_ids
from trainer.sampler import Draws, MixtureSampler


@dataclass
class Batch:
    inputs: torch.Tensor  # [micro, seq_len] int64 on the training device
    targets: torch.Tensor  # [micro, seq_len]
    draws: Draws  # which samples these are (positions, sources, windows)
    host: np.ndarray  # the gathered rows on the host (for --log-samples)


_DONE = object()


class Prefetcher:
    """Iterates batches for ``plan``: an iterator of position arrays, one per micro-batch."""

    def __init__(
        self,
        dataset: Samples,
        sampler: MixtureSampler,
        plan: Iterator[np.ndarray],
        device: torch.device,
        depth: int = 4,
        keep_host: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.plan = plan
        self.device = device
        self.cuda = device.type == "cuda"
        self.keep_host = keep_host
        self.vocab_size = vocab_size  # when given, every batch's ids are checked against it
        self.wait_s = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._pinned: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._run, name="tokshard-prefetch", daemon=True)
        self._thread.start()

    def _gather(self, draws: Draws) -> tuple[torch.Tensor, np.ndarray]:
        """Rows of ``draws`` as a tensor on the device (and the host array they came from)."""
        rows, width = len(draws.positions), self.dataset.width
        if not self.cuda:
            host = self.dataset.batch(draws.sources, draws.windows)
            return torch.from_numpy(host), host
        if self._pinned is None or self._pinned.shape[0] != rows:
            self._pinned = torch.empty((rows, width), dtype=torch.int64).pin_memory()
        host = self.dataset.batch(draws.sources, draws.windows, out=self._pinned.numpy())
        with torch.cuda.stream(self._stream):
            tokens = self._pinned.to(self.device, non_blocking=True)
        self._stream.synchronize()  # the copy is done: the pinned buffer may be refilled
        return tokens, (host.copy() if self.keep_host else host)

    def _run(self) -> None:
        try:
            if self.cuda:
                # the current device is per thread: without this, pinning and the copy stream
                # would open a CUDA context on GPU 0 from every rank's thread
                torch.cuda.set_device(self.device)
            self._stream = torch.cuda.Stream(self.device) if self.cuda else None
            for positions in self.plan:
                draws = self.sampler.draw(positions)
                tokens, host = self._gather(draws)
                if self.vocab_size is not None:
                    check_ids(host, self.vocab_size, self.dataset, draws.sources, draws.windows)
                item = Batch(*self.dataset.inputs_targets(tokens), draws, host)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(_DONE)
        except BaseException as exc:  # surfaced in the training loop, not lost in a thread
            self._queue.put(exc)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Batch:
        t0 = time.perf_counter()
        item = self._queue.get()
        self.wait_s += time.perf_counter() - t0
        if item is _DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        if self.cuda:
            # allocated on the prefetch stream; tell the caching allocator the main stream uses it
            item.inputs.record_stream(torch.cuda.current_stream(self.device))
        return item

    def close(self) -> None:
        self._stop.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        self._thread.join(timeout=5)
