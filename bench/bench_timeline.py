"""Where a `prepare`'s wall time goes: the driver's steps stamped in time and driver CPU.

Runs one ``tokshard prepare`` in this process with the driver's steps wrapped (planning, the
encoder check, the cluster's start and close, the warm-up, the tasks, the manifest), and
prints each step's start and end as seconds since the script started, with the driver's
own CPU seconds beside them: the fixed costs that stand between a run and its encoder's
ceiling (bench/RESULTS.md, "Native encoder"). ``--bare-dask N`` instead runs N CPU-bound
tasks of ``--task-seconds`` each on the same kind of local cluster, for Dask's own cost per
task beside the run's.

    python bench/bench_timeline.py -- prepare --input /work/bench-data/corpus-590d.jsonl \\
        --tokenizer /work/bench-data/gpt2/tokenizer.json --out /tmp/timeline-out --workers 2
    python bench/bench_timeline.py --bare-dask 73 --task-seconds 0.07
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def stamp(what: str) -> None:
    print(
        f"{time.perf_counter() - T0:7.3f} s, driver CPU {time.process_time():6.3f} s  {what}", file=sys.stderr
    )


def stamped(owner: object, name: str) -> None:
    """Replace ``owner.name`` by a copy that stamps its start and end."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        stamp(f"{name} starts")
        try:
            return fn(*args, **kwargs)
        finally:
            stamp(f"{name} ends")

    setattr(owner, name, wrapper)


def timeline(command: list[str]) -> int:
    from distributed import LocalCluster

    from pipeline.run import cluster, driver, run_state
    from tokshard import cli

    stamp("imports done (this script's, Dask's included)")
    for owner, name in [
        (driver, "make_plan"),
        (driver, "decide"),
        (cluster, "_start"),
        (cluster.EarlyStart, "take"),
        (driver, "_submit_and_wait"),
        (LocalCluster, "close"),
        (run_state.RunState, "write_manifest"),
    ]:
        stamped(owner, name)
    rc = cli.main(command)
    stamp("prepare returned")
    return rc


def busy(seconds: float) -> dict:
    """CPU work for ``seconds`` of this process's time, and a result the size of a checkpoint."""
    began = time.process_time()
    while time.process_time() - began < seconds:
        pass
    return {"closed": [{"path": "shard.bin", "tokens": 1, "hash": "0" * 32}] * 3}


def bare_dask(n: int, seconds: float, workers: int) -> None:
    from distributed import Client

    from pipeline.run.cluster import _local_cluster

    with _local_cluster(workers, 1, None, False) as local, Client(local) as client:
        client.gather([client.submit(busy, 0.01, pure=False) for _ in range(workers)])
        wall, cpu = time.perf_counter(), time.process_time()
        client.gather([client.submit(busy, seconds, pure=False, priority=i) for i in range(n)])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    ideal = n * seconds / workers
    print(f"{n} tasks of {seconds} s CPU on {workers} workers: wall {wall:.2f} s (ideal {ideal:.2f} s), "
          f"driver CPU {cpu:.3f} s")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bare-dask", type=int, metavar="N", help="N busy tasks instead of a prepare")
    ap.add_argument("--task-seconds", type=float, default=0.07)
    ap.add_argument("--workers", type=int, default=2, help="for --bare-dask")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the tokshard command")
    args = ap.parse_args()
    if args.bare_dask:
        bare_dask(args.bare_dask, args.task_seconds, args.workers)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the tokshard command after --, or --bare-dask N")
    return timeline(command)


if __name__ == "__main__":  # the worker processes import this file again: nothing may run there
    sys.exit(main())
