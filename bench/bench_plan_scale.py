"""What a 10 TB `prepare` would plan, without 10 TB of disk: the real planning code over a
generated listing of sparse files (their sizes are real to every listing and `stat`, their
bytes are holes that cost no disk; the sampled ends a large file's fingerprint reads are zeros).

For each corpus shape (files x bytes per file, about 10 TB each) in a fresh interpreter:
listing, fingerprinting and cutting into partitions (`FilesSource` with the default
``partition_bytes = "auto"``), the plan as `.tokshard/run.json` holds it (its bytes and the
seconds to encode it, `json_bytes`), the origin that the manifest repeats, what the driver
sends per task (a pickled `PartitionTask`, as Dask ships it) and the driver's peak memory
(``ru_maxrss``) once the plan and every task exist. Nothing is encoded: the shard count and
the manifest's size follow from the partitions (a partition writes at least one shard).

Then Dask's own cost for ``--tasks`` tasks of that size (no-op tasks carrying a payload of a
pickled task's mean size, on 2 local workers, submitted as the driver does: a key, a priority
and a done callback each), all submitted at once as the driver did, and with the driver's
bound on tasks in flight: the seconds to submit and to finish them all, and the submitting
process's peak memory.

    python bench/bench_plan_scale.py --data /work/bench-data/plan-10tb --tasks 40000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: (files, bytes per file) of each corpus shape: 10 TB in large files and in medium ones
SHAPES = ((10_000, 10**9), (100_000, 10**8))

PLAN_SCRIPT = """
import json, pickle, resource, sys, time
sys.path.insert(0, sys.argv[1])
from pipeline.format.atomic import json_bytes
from pipeline.run.records import Plan
from pipeline.run.worker_task import PartitionTask
from pipeline.sources.files import FilesSource

cfg = FilesSource.normalize("d", {"paths": [sys.argv[2]]}, "bench")
source = FilesSource("d", cfg)
t0 = time.perf_counter()
files = source.files("train")
origin = source.origin()
parts = source.partitions()
planned = time.perf_counter() - t0
plan = Plan(identity={}, identity_hash="", recipe={"sources": {"d": cfg}}, tokenizer={},
            origins={"d": origin}, splits={"d": ["train"]}, partitions=parts)
t0 = time.perf_counter()
blob = json_bytes(plan.to_json())
encoded = time.perf_counter() - t0
tasks = [PartitionTask(out="/data/out", partition=p, source_config=cfg, tokenizer_path="/data/out/tokenizer.json",
                       tokenizer_sha256="0" * 64, eos_id=50256, dtype="uint16", shard_tokens=2**27,
                       encoder="fastokens", threads=1, on_bad_record="fail", commit_seconds=60.0,
                       run_id="0" * 12, checked_with=(("fastokens", "0.0"), ("tokenizers", "0.0")))
         for p in parts]
pickled = [len(pickle.dumps(t)) for t in tasks]
print(json.dumps({
    "files": len(files), "bytes": sum(p.size for p in parts), "partitions": len(parts),
    "pieces": sum(len(p.spec.get("pieces", [])) for p in parts),
    "plan_s": planned, "run_json_bytes": len(blob), "run_json_encode_s": encoded,
    "origin_bytes": len(json_bytes(origin)), "task_pickle_mean_bytes": sum(pickled) / len(pickled),
    "task_pickle_total_bytes": sum(pickled),
    "driver_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


TASKS_SCRIPT = """
import json, queue, resource, sys, time
from distributed import Client, LocalCluster

def noop(payload):
    return len(payload)

n, bound = int(sys.argv[1]), int(sys.argv[2]) or None
with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
    done, pending, items = queue.SimpleQueue(), set(), iter(range(n))
    t0 = time.perf_counter()

    def submit_more():
        while bound is None or len(pending) < bound:
            i = next(items, None)
            if i is None:
                return
            fut = client.submit(noop, bytes(985) + i.to_bytes(8, "little"), key=f"t-{i}", priority=i, retries=0)
            pending.add(fut.key)
            fut.add_done_callback(done.put)

    submit_more()
    first = time.perf_counter() - t0
    while pending:
        pending.discard(done.get().key)
        submit_more()
    print(json.dumps({"tasks": n, "bound": bound, "first_submit_s": first, "all_done_s": time.perf_counter() - t0,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def dask_tasks(tasks: int, bound: int) -> dict:
    """Dask's cost for ``tasks`` no-op tasks (``bound`` in flight, 0: all at once)."""
    done = subprocess.run(
        [sys.executable, "-c", TASKS_SCRIPT, str(tasks), str(bound)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def sparse_corpus(data: Path, files: int, size: int) -> Path:
    """``files`` sparse JSON Lines files of ``size`` bytes each (made once)."""
    folder = data / f"{files}x{size}"
    done = folder / ".done"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        with open(folder / f"part-{i:06d}.jsonl", "wb") as f:
            f.truncate(size)
    done.touch()
    return folder


def measure(checkout: Path, folder: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT, str(checkout), str(folder / "*.jsonl")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/work/bench-data/plan-10tb"))
    ap.add_argument("--baseline", type=Path, help="another checkout to plan the same corpora with")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--tasks", type=int, default=0, help="also Dask's cost for this many tasks")
    ap.add_argument("--skip-plan", action="store_true", help="no planning")
    args = ap.parse_args()
    checkouts = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    results = {}
    for files, size in SHAPES if not args.skip_plan else ():
        folder = sparse_corpus(args.data, files, size)
        for label, checkout in checkouts.items():
            found = results[f"{files}x{size} {label}"] = measure(checkout, folder)
            print(f"{files:,} files of {size / 1e6:,.0f} MB ({label}): {json.dumps(found)}", flush=True)
    print(
        "\n| corpus | code | partitions | planning | run.json | encode | origin | task pickled | driver peak RSS |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        shape, label = name.split()
        print(
            f"| {shape} | {label} | {r['partitions']:,} | {r['plan_s']:.1f} s | {r['run_json_bytes'] / 1e6:.1f} MB | "
            f"{r['run_json_encode_s']:.2f} s | {r['origin_bytes'] / 1e6:.1f} MB | "
            f"{r['task_pickle_mean_bytes']:,.0f} B | {r['driver_peak_rss_bytes'] / 2**20:,.0f} MiB |"
        )
    if args.tasks:
        from pipeline.run.driver import MIN_IN_FLIGHT

        for bound in (0, MIN_IN_FLIGHT):
            results[f"dask {args.tasks} bound {bound}"] = found = dask_tasks(args.tasks, bound)
            print(f"dask: {json.dumps(found)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
