"""Fast encoder benchmark: `prepare` with --encoder tiktoken vs tokenizers, side by side.

Measures, in one run on the same corpus and tokenizer:

* the equivalence check `auto` runs before a job (its cost and verdict);
* each encoder's ceiling: all texts in memory, one thread, no I/O (and whether the two
  give identical ids on every document);
* `tokshard prepare` end to end as a user runs it (a fresh subprocess of the CLI) on a
  freshly started Dask cluster of ``--workers`` processes, for each encoder, interleaved
  ``--repeats`` times: tokens/s over the command's wall time, tokens/s over the workers'
  busy time (the partition tasks' own clocks: reading, encoding, writing, committing), and
  each worker's peak RSS (``getrusage`` of the worker process, which lives only for that run);
* that both encoders wrote byte-identical shards.

    python bench/kernel_corpus.py                       # once: corpus + 50k BPE
    python bench/bench_encoders.py --workers 2 --repeats 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import manifest  # noqa: E402
from pipeline.cluster import worker_env  # noqa: E402
from pipeline.encoders import TokenizersEncoder, choose  # noqa: E402
from pipeline.state import load_checkpoint, load_plan  # noqa: E402
from pipeline.tiktoken_encoder import TiktokenEncoder  # noqa: E402

DATA = Path("/work/bench-data/fast")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far: VmHWM, which (unlike getrusage's
    ru_maxrss, kept across fork and exec) starts afresh in each worker process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def load_texts(corpus: Path) -> list[str]:
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def timed(run) -> tuple[float, int, list]:
    """Seconds and tokens of one pass over the texts held in memory, one thread.

    The garbage collector is off while it runs: millions of id lists kept alive would
    otherwise make Python's collections, not the encoder, the thing measured."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        ids = run()
        seconds = time.perf_counter() - started
    finally:
        gc.enable()
    return seconds, sum(len(x) for x in ids), ids


def run_prepare(encoder: str, args, work: Path) -> dict:
    """One `tokshard prepare` on a fresh local cluster it joins with --scheduler."""
    from distributed import Client, LocalCluster

    out = work / f"out-{encoder}"
    shutil.rmtree(out, ignore_errors=True)
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env={**worker_env(1), "PYTHONPATH": str(REPO)},
        ) as cluster,
        Client(cluster) as client,
    ):
        idle = client.run(peak_rss_mib)
        cmd = [
            sys.executable, "-m", "pipeline.cli", "prepare", "--input", str(args.corpus),
            "--tokenizer", str(args.tokenizer), "--out", str(out), "--encoder", encoder,
            "--scheduler", cluster.scheduler_address, "--partition-bytes", str(args.partition_bytes),
        ]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"prepare --encoder {encoder} failed:\n{proc.stderr}")
        peak = client.run(peak_rss_mib)
    m = manifest.load(out / "manifest.json")
    plan = load_plan(out)
    busy = sum(load_checkpoint(out, p).busy_seconds for p in plan.partitions)
    chosen = m.data["encoder"]
    return {
        "encoder": encoder,
        "chosen": chosen["name"],
        "tokens": m.data["totals"]["tokens"],
        "partitions": len(plan.partitions),
        "wall_s": wall,
        "busy_s": busy,
        "worker_peak_rss_mib": sorted(peak.values()),
        "worker_idle_rss_mib": sorted(idle.values()),
        "shard_hashes": [s.hash for s in m.shards],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=DATA / "kernel.jsonl")
    ap.add_argument("--tokenizer", type=Path, default=DATA / "bpe50k" / "tokenizer.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--partition-bytes", type=int, default=2 << 20)
    ap.add_argument("--work", type=Path, default=DATA / "work")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    texts = load_texts(args.corpus)
    size = args.corpus.stat().st_size
    utf8 = sum(len(t.encode("utf-8")) for t in texts)
    print(
        f"corpus {args.corpus}: {len(texts):,} documents, {utf8 / 1e6:.1f} MB of UTF-8 text ({size / 1e6:.1f} MB .jsonl)"
    )
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")

    started = time.perf_counter()
    name, reason = choose("auto", str(args.tokenizer), lambda: texts[:64])
    print(f"auto check: {name} in {time.perf_counter() - started:.2f} s ({reason})")

    fast = TiktokenEncoder(str(args.tokenizer), threads=1)
    ref = TokenizersEncoder(str(args.tokenizer), threads=1)
    ordinary = fast.encoding.encode_ordinary
    ceilings = {
        "tiktoken": lambda: [ordinary(t) for t in texts],  # tiktoken's own API, lists
        "tiktoken (numpy buffer, as prepare calls it)": lambda: fast.encode_batch(texts),
    }
    results: dict = {"ceiling": {name: [] for name in ceilings}, "prepare": []}
    fast_ids = None
    for rep in range(args.repeats):
        for name, run in ceilings.items():
            s, n, ids = timed(run)
            fast_ids = fast_ids or ids
            results["ceiling"][name].append(n / s)
            print(
                f"ceiling {name} #{rep}: {n:,} tokens in {s:.1f} s = {n / s / 1e6:.2f} M tokens/s (1 thread)"
            )
    s, n, ref_ids = timed(lambda: ref.encode_batch(texts))
    results["ceiling"]["tokenizers"] = [n / s]
    same = sum(a == b for a, b in zip(ref_ids, fast_ids, strict=True))
    results["identical_documents"] = same
    print(
        f"ceiling tokenizers: {n / s / 1e6:.2f} M tokens/s (1 thread); "
        f"identical ids on {same:,}/{len(texts):,} documents"
    )
    del ref_ids, fast_ids

    for rep in range(args.repeats):
        for enc in ("tokenizers", "tiktoken"):
            r = run_prepare(enc, args, args.work)
            r["repeat"] = rep
            results["prepare"].append(r)
            print(
                f"prepare {enc} #{rep}: {r['tokens']:,} tokens, wall {r['wall_s']:.1f} s = "
                f"{r['tokens'] / r['wall_s'] / 1e6:.2f} M tokens/s; busy {r['busy_s']:.1f} worker-s = "
                f"{r['tokens'] / r['busy_s'] / 1e6:.2f} M tokens/s per worker; worker peak RSS "
                f"{', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mib'])} MiB "
                f"(idle {', '.join(f'{x:.0f}' for x in r['worker_idle_rss_mib'])})"
            )
    hashes = {tuple(r["shard_hashes"]) for r in results["prepare"]}
    results["identical_shards"] = len(hashes) == 1
    summarize(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def summarize(results: dict, args) -> None:
    best = {}
    for enc in ("tokenizers", "tiktoken"):
        runs = [r for r in results["prepare"] if r["encoder"] == enc]
        best[enc] = {
            "wall": max(r["tokens"] / r["wall_s"] for r in runs),
            "busy": max(r["tokens"] / r["busy_s"] for r in runs),
            "rss": max(max(r["worker_peak_rss_mib"]) for r in runs),
            "idle": max(max(r["worker_idle_rss_mib"]) for r in runs),
        }
    ceil1 = max(max(v) for k, v in results["ceiling"].items() if k.startswith("tiktoken"))
    ceil_w = ceil1 * args.workers
    t, h = best["tiktoken"], best["tokenizers"]
    print()
    print(f"| {args.workers} workers (best of {args.repeats}) | tokenizers | tiktoken | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| prepare, tokens/s over wall time | {h['wall'] / 1e6:.2f} M | {t['wall'] / 1e6:.2f} M | {t['wall'] / h['wall']:.2f}x |"
    )
    print(
        f"| prepare, tokens/s over busy time x workers | {h['busy'] * args.workers / 1e6:.2f} M | "
        f"{t['busy'] * args.workers / 1e6:.2f} M | {t['busy'] / h['busy']:.2f}x |"
    )
    print(
        f"| ceiling: in memory, 1 thread x {args.workers} | {max(results['ceiling']['tokenizers']) * args.workers / 1e6:.2f} M | "
        f"{ceil_w / 1e6:.2f} M | {ceil1 / max(results['ceiling']['tokenizers']):.2f}x |"
    )
    print(
        f"| worker peak RSS (idle worker) | {h['rss']:.0f} MiB ({h['idle']:.0f}) | {t['rss']:.0f} MiB ({t['idle']:.0f}) | |"
    )
    print()
    print(
        f"tiktoken prepare / tiktoken ceiling: {t['wall'] / ceil_w:.2f} over wall time, {t['busy'] / ceil1:.2f} over busy time"
    )
    print(f"shards identical across encoders and repeats: {results['identical_shards']}")


if __name__ == "__main__":
    main()
