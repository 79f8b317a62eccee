"""Where the Dask workers come from: an embedded local cluster, or one that already runs.

We never manage machines ourselves: `--scheduler tcp://HOST:PORT` joins a cluster started
with `dask scheduler` / `dask worker` (or by dask-jobqueue); otherwise a `LocalCluster`
of worker processes (one per core, one task each, with a memory limit) lives as long as
the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

from pipeline.errors import TokshardError


def worker_env(threads: int) -> dict[str, str]:
    """Encoder threads per worker process, fixed before the tokenizer's thread pool starts."""
    return {"TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false", "RAYON_NUM_THREADS": str(threads)}


@contextlib.contextmanager
def connect(
    *,
    workers: int | None,
    scheduler: str | None,
    threads: int,
    memory_limit: str | None,
    log: Callable[[str], None],
) -> Iterator[object]:
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="15s")
        except (OSError, TimeoutError) as exc:
            raise TokshardError(
                f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one with "
                "`dask scheduler` and `dask worker`, or drop --scheduler to use local workers"
            ) from exc
        with client:
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            log(f"Dask scheduler {scheduler}: {n} workers; dashboard {client.dashboard_link}")
            if n == 0:
                log("no workers are connected yet; tasks wait until `dask worker` processes join")
            yield client
        return
    n = workers or os.cpu_count() or 1
    with (
        LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit or "auto",
            dashboard_address=":0",
            silence_logs=logging.ERROR,
            env=worker_env(threads),
        ) as cluster,
        Client(cluster) as client,
    ):
        log(f"Dask: {n} local worker processes; dashboard {client.dashboard_link}")
        yield client
