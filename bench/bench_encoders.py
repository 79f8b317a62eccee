"""Fast encoder benchmark: `prepare` with --encoder tiktoken vs tokenizers, side by side.

Measures, in one run on the same corpus and tokenizer:

* the equivalence check `auto` runs before a job (its cost and verdict);
* each encoder's ceiling: all texts in memory, one thread, no I/O (and whether the two
  give identical ids on every document);
* `tokshard prepare` end to end as a user runs it (a fresh subprocess of the CLI, joining
  with --scheduler a Dask cluster of ``--workers`` processes started afresh for each run),
  for each encoder, interleaved ``--repeats`` times:
  - tokens/s over the command's wall time (Python start, planning, the check, every task,
    the manifest);
  - tokens per CPU-second (the CLI process plus all workers), which is what a node-hour
    buys and is steady on a machine other jobs share;
  - each worker's peak RSS (VmHWM of the worker process, which lives only for that run);
* that both encoders wrote byte-identical shards.

    python bench/kernel_corpus.py                       # once: corpus + 50k BPE
    python bench/bench_encoders.py --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import cluster, manifest  # noqa: E402
from pipeline.encoders import TokenizersEncoder, choose  # noqa: E402
from pipeline.tiktoken_encoder import TiktokenEncoder  # noqa: E402

DATA = Path("/work/bench-data/fast")
ENCODERS = ("tokenizers", "tiktoken")


def peak_rss_mib() -> float:
    """This process's peak resident memory: VmHWM, which (unlike getrusage's ru_maxrss,
    kept across fork and exec) starts afresh in each worker process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def print_nothing(message: str) -> None:
    pass


def load_texts(corpus: Path) -> list[str]:
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def timed(run) -> dict:
    """One pass over the texts held in memory, on this thread: wall and CPU seconds.

    The garbage collector is off while it runs: millions of id lists kept alive would
    otherwise make Python's collections, not the encoder, the thing measured."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        ids = run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()
    return {"wall_s": wall, "cpu_s": cpu, "tokens": sum(len(x) for x in ids), "ids": ids}


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_prepare(encoder: str, corpus: Path, args, dask_profiler: bool = False) -> dict:
    """One `tokshard prepare` joining, with --scheduler, a fresh local cluster made exactly as
    `prepare` makes its own (pipeline.cluster.connect), so the workers' pids can be watched."""
    out = args.work / f"out-{encoder}-{corpus.stem}"
    shutil.rmtree(out, ignore_errors=True)
    cluster.LOCAL_WORKER_CONFIG = {"distributed.worker.profile.enabled": dask_profiler}
    with cluster.connect(
        workers=args.workers, scheduler=None, threads=1, memory_limit=None, log=print_nothing
    ) as client:
        idle = client.run(peak_rss_mib)
        workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        cmd = [
            sys.executable, "-m", "pipeline.cli", "prepare", "--input", str(corpus),
            "--tokenizer", str(args.tokenizer), "--out", str(out), "--encoder", encoder,
            "--scheduler", client.scheduler.address, "--partition-bytes", str(args.partition_bytes),
        ]  # fmt: skip
        workers_cpu, driver_cpu = _cpu_seconds(workers), _children_cpu()
        load = os.getloadavg()[0]
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        wall = time.perf_counter() - started
        workers_cpu, driver_cpu = _cpu_seconds(workers) - workers_cpu, _children_cpu() - driver_cpu
        if proc.returncode != 0:
            raise SystemExit(f"prepare --encoder {encoder} failed:\n{proc.stderr}")
        peak = client.run(peak_rss_mib)
    m = manifest.load(out / "manifest.json")
    return {
        "encoder": encoder,
        "chosen": m.data["encoder"]["name"],
        "tokens": m.data["totals"]["tokens"],
        "shards": m.data["totals"]["shards"],
        "wall_s": wall,
        "workers_cpu_s": workers_cpu,
        "driver_cpu_s": driver_cpu,
        "load_average": load,
        "worker_peak_rss_mib": sorted(peak.values()),
        "worker_idle_rss_mib": sorted(idle.values()),
        "shard_hashes": [s.hash for s in m.shards],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=DATA / "kernel.jsonl")
    ap.add_argument("--tokenizer", type=Path, default=DATA / "bpe50k" / "tokenizer.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--partition-bytes", type=int, default=4 << 20)
    ap.add_argument("--work", type=Path, default=DATA / "work")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    texts = load_texts(args.corpus)
    utf8 = sum(len(t.encode("utf-8")) for t in texts)
    print(f"corpus {args.corpus}: {len(texts):,} documents, {utf8 / 1e6:.1f} MB of UTF-8 text")
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")

    started = time.perf_counter()
    name, reason = choose("auto", str(args.tokenizer), lambda: texts[:64])
    print(f"auto check: {name} in {time.perf_counter() - started:.2f} s ({reason})")

    fast = TiktokenEncoder(str(args.tokenizer), threads=1)
    ref = TokenizersEncoder(str(args.tokenizer), threads=1)
    ordinary = fast.encoding.encode_ordinary
    ceilings = {
        "tiktoken": lambda: [ordinary(t) for t in texts],  # tiktoken's own API
        "tiktoken-numpy": lambda: fast.encode_batch(texts),  # the buffer API prepare uses
    }
    results: dict = {"ceiling": {k: [] for k in (*ceilings, "tokenizers")}, "prepare": []}
    fast_ids = None
    for rep in range(args.repeats):
        for key, run in ceilings.items():
            r = timed(run)
            fast_ids = fast_ids or r.pop("ids")
            r.pop("ids", None)
            results["ceiling"][key].append(r)
            print(f"ceiling {key} #{rep}: {_rates(r)}")
    r = timed(lambda: ref.encode_batch(texts))
    same = sum(a == b for a, b in zip(r.pop("ids"), fast_ids, strict=True))
    results["ceiling"]["tokenizers"].append(r)
    results["identical_documents"] = same
    print(f"ceiling tokenizers: {_rates(r)}; identical ids on {same:,}/{len(texts):,} documents")
    del fast_ids

    one_doc = args.work / "one-document.jsonl"
    one_doc.write_text(json.dumps({"text": texts[0]}) + "\n")
    for enc in ENCODERS:
        r = run_prepare(enc, one_doc, args)
        results.setdefault("fixed", {})[enc] = r
        print(
            f"fixed cost, {enc} on one document: wall {r['wall_s']:.1f} s, CPU {r['workers_cpu_s']:.1f} s "
            f"workers + {r['driver_cpu_s']:.1f} s driver"
        )
    for rep in range(args.repeats):
        r = run_prepare("tiktoken", args.corpus, args, dask_profiler=True)
        results.setdefault("dask_profiler_on", []).append(r)
        print(
            f"prepare tiktoken with Dask's profiler on #{rep} (load {r['load_average']:.1f}): "
            f"wall {r['wall_s']:.1f} s, CPU {r['workers_cpu_s']:.1f} s workers"
        )
        for enc in ENCODERS:
            r = run_prepare(enc, args.corpus, args)
            results["prepare"].append(r)
            print(
                f"prepare {enc} #{rep} (load {r['load_average']:.1f}): {r['tokens']:,} tokens, "
                f"wall {r['wall_s']:.1f} s, CPU {r['workers_cpu_s']:.1f} s workers + "
                f"{r['driver_cpu_s']:.1f} s driver; worker peak RSS "
                f"{', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mib'])} MiB "
                f"(idle {', '.join(f'{x:.0f}' for x in r['worker_idle_rss_mib'])})"
            )
    results["identical_shards"] = len({tuple(r["shard_hashes"]) for r in results["prepare"]}) == 1
    print()
    print(summary(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _rates(r: dict) -> str:
    return (
        f"{r['tokens']:,} tokens, {r['tokens'] / r['wall_s'] / 1e6:.2f} M tokens/s over wall time, "
        f"{r['tokens'] / r['cpu_s'] / 1e6:.2f} M per CPU-second"
    )


def summary(results: dict, args) -> str:
    """The RESULTS.md table: best of the repeats for every figure.

    "after start-up" subtracts what the same command costs on a one-document corpus
    (Python and imports, planning, the equivalence check, each worker loading its
    encoder): the rate a longer corpus approaches."""
    w = args.workers
    best_ceil = {
        k: (max(r["tokens"] / r["wall_s"] for r in v), max(r["tokens"] / r["cpu_s"] for r in v))
        for k, v in results["ceiling"].items()
    }
    tt_wall = max(best_ceil["tiktoken"][0], best_ceil["tiktoken-numpy"][0])
    tt_cpu = max(best_ceil["tiktoken"][1], best_ceil["tiktoken-numpy"][1])

    def cpu(r: dict) -> float:
        return r["workers_cpu_s"] + r["driver_cpu_s"]

    runs = {e: [r for r in results["prepare"] if r["encoder"] == e] for e in ENCODERS}
    fixed = results["fixed"]
    rate = {
        e: {
            "wall": max(r["tokens"] / r["wall_s"] for r in runs[e]),
            "cpu": max(r["tokens"] / cpu(r) for r in runs[e]),
            "wall_steady": max(r["tokens"] / (r["wall_s"] - fixed[e]["wall_s"]) for r in runs[e]),
            "cpu_steady": max(r["tokens"] / (cpu(r) - cpu(fixed[e])) for r in runs[e]),
            "rss": max(max(r["worker_peak_rss_mib"]) for r in runs[e]),
            "idle": max(max(r["worker_idle_rss_mib"]) for r in runs[e]),
        }
        for e in ENCODERS
    }
    h, t = rate["tokenizers"], rate["tiktoken"]
    on_cpu = max(r["tokens"] / cpu(r) for r in results["dask_profiler_on"])
    on_wall = max(r["tokens"] / r["wall_s"] for r in results["dask_profiler_on"])

    def row(label: str, key: str, scale: float = 1.0) -> str:
        return (
            f"| {label} | {h[key] * scale / 1e6:.2f} M | {t[key] * scale / 1e6:.2f} M "
            f"| **{t[key] / h[key]:.2f}x** |"
        )

    lines = [
        f"| {w} workers, best of {args.repeats} | tokenizers | tiktoken | tiktoken / tokenizers |",
        "|---|---:|---:|---:|",
        row("`prepare` tokens/s, wall time of the whole command", "wall"),
        row("`prepare` tokens/s, wall time after start-up", "wall_steady"),
        row("`prepare` tokens per CPU-second (CLI + workers)", "cpu"),
        row("`prepare` tokens per CPU-second after start-up", "cpu_steady"),
        f"| ceiling tokens/s: in memory, 1 thread, x {w} | {best_ceil['tokenizers'][0] * w / 1e6:.2f} M "
        f"| {tt_wall * w / 1e6:.2f} M | {tt_wall / best_ceil['tokenizers'][0]:.2f}x |",
        f"| ceiling tokens per CPU-second | {best_ceil['tokenizers'][1] / 1e6:.2f} M | {tt_cpu / 1e6:.2f} M "
        f"| {tt_cpu / best_ceil['tokenizers'][1]:.2f}x |",
        f"| start-up (one-document corpus): wall, CPU | {fixed['tokenizers']['wall_s']:.1f} s, "
        f"{cpu(fixed['tokenizers']):.1f} s | {fixed['tiktoken']['wall_s']:.1f} s, {cpu(fixed['tiktoken']):.1f} s | |",
        f"| peak RSS per worker (idle worker) | {h['rss']:.0f} MiB ({h['idle']:.0f}) "
        f"| {t['rss']:.0f} MiB ({t['idle']:.0f}) | |",
        "",
        f"tiktoken `prepare` / tiktoken ceiling x {w}: whole command **{t['wall'] / (tt_wall * w):.2f}x**, "
        f"after start-up **{t['wall_steady'] / (tt_wall * w):.2f}x** (wall time); per CPU-second "
        f"**{t['cpu'] / tt_cpu:.2f}x** whole, **{t['cpu_steady'] / tt_cpu:.2f}x** after start-up.",
        f"Dask's worker profiler, on: {on_cpu / 1e6:.2f} M tokens per CPU-second, {on_wall / 1e6:.2f} M tokens/s; "
        f"off (as `prepare` now runs its workers): {t['cpu'] / 1e6:.2f} M, {t['wall'] / 1e6:.2f} M.",
        f"Identical ids on {results['identical_documents']:,} documents in memory; "
        f"shards byte-identical across encoders and repeats: {results['identical_shards']}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
