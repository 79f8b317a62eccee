"""Fast encoder benchmark: `prepare` with --encoder tiktoken vs tokenizers, side by side.

On one corpus and tokenizer, in one run:

* the equivalence check `auto` runs before a job (its cost and verdict), and whether the two
  encoders give identical ids on every document (texts in memory);
* ``--repeats`` rounds, each measured back to back so that all its figures share the
  machine's conditions (this box is shared; the load average is printed per round):
  - tiktoken's ceiling: all texts in memory, one thread, no I/O (its own ``encode_ordinary``
    and the numpy-buffer call `prepare` makes; the faster counts), wall and CPU time;
  - `tokshard prepare` for each encoder, as a user runs it: a fresh CLI process joining with
    --scheduler a fresh local cluster made exactly as `prepare` makes its own
    (`pipeline.cluster.connect`, ``--workers`` processes); wall time, CPU time of the CLI
    and the workers, and each worker's peak RSS (VmHWM of the worker process);
  - the same command on one small document per worker: its start-up cost, subtracted for
    the "after start-up" rates that a longer corpus approaches;
* that both encoders wrote byte-identical shards in every round.

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
import statistics
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


def run_prepare(encoder: str, corpus: Path, args, partition_bytes: int) -> dict:
    """One `tokshard prepare` joining, with --scheduler, a fresh local cluster made exactly as
    `prepare` makes its own (pipeline.cluster.connect), so the workers' pids can be watched."""
    out = args.work / f"out-{encoder}-{corpus.stem}"
    shutil.rmtree(out, ignore_errors=True)
    with cluster.connect(
        workers=args.workers, scheduler=None, threads=1, memory_limit=None, log=print_nothing
    ) as client:
        idle = client.run(peak_rss_mib)
        workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        cmd = [
            sys.executable, "-m", "pipeline.cli", "prepare", "--input", str(corpus),
            "--tokenizer", str(args.tokenizer), "--out", str(out), "--encoder", encoder,
            "--scheduler", client.scheduler.address, "--partition-bytes", str(partition_bytes),
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
    fast_ids = timed(ceilings["tiktoken"])["ids"]
    r = timed(lambda: ref.encode_batch(texts))
    same = sum(a == b for a, b in zip(r.pop("ids"), fast_ids, strict=True))
    del fast_ids
    results: dict = {"tokenizers_ceiling": r, "identical_documents": same, "rounds": []}
    print(f"ceiling tokenizers: {_rates(r)}; identical ids on {same:,}/{len(texts):,} documents")

    # start-up: one small document per worker, each its own partition, so every worker
    # loads its encoder once, as in a full run
    small = [t for t in texts if 4096 < len(t.encode("utf-8")) < 16384][: args.workers]
    startup_corpus = args.work / "startup.jsonl"
    startup_corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in small))
    for rep in range(args.repeats):
        rnd: dict = {"ceiling": {}, "startup": {}, "prepare": {}}
        for key, run in ceilings.items():
            r = timed(run)
            r.pop("ids")
            rnd["ceiling"][key] = r
            print(f"#{rep} ceiling {key}: {_rates(r)}")
        for enc in ENCODERS:
            rnd["startup"][enc] = r = run_prepare(enc, startup_corpus, args, partition_bytes=4096)
            print(
                f"#{rep} start-up {enc} ({len(small)} small documents): wall {r['wall_s']:.1f} s, "
                f"CPU {_cpu(r):.1f} s"
            )
            rnd["prepare"][enc] = r = run_prepare(enc, args.corpus, args, args.partition_bytes)
            print(
                f"#{rep} prepare {enc} (load {r['load_average']:.1f}): {r['tokens']:,} tokens, "
                f"wall {r['wall_s']:.1f} s, CPU {r['workers_cpu_s']:.1f} s workers + "
                f"{r['driver_cpu_s']:.1f} s driver; worker peak RSS "
                f"{', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mib'])} MiB "
                f"(idle {', '.join(f'{x:.0f}' for x in r['worker_idle_rss_mib'])})"
            )
        results["rounds"].append(rnd)
    hashes = {tuple(rnd["prepare"][e]["shard_hashes"]) for rnd in results["rounds"] for e in ENCODERS}
    results["identical_shards"] = len(hashes) == 1
    print()
    print(summary(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _cpu(r: dict) -> float:
    return r["workers_cpu_s"] + r["driver_cpu_s"]


def _rates(r: dict) -> str:
    return (
        f"{r['tokens']:,} tokens, {r['tokens'] / r['wall_s'] / 1e6:.2f} M tokens/s over wall time, "
        f"{r['tokens'] / r['cpu_s'] / 1e6:.2f} M per CPU-second"
    )


def summary(results: dict, args) -> str:
    """The RESULTS.md tables: every round (ceiling and both `prepare` runs measured back to back),
    then the median round. "after start-up" subtracts what the same command costs on one
    small document per worker (Python and imports, planning, the check, each worker loading
    its encoder)."""
    w = args.workers
    rows = []
    for rnd in results["rounds"]:
        ceil_wall = max(r["tokens"] / r["wall_s"] for r in rnd["ceiling"].values())
        ceil_cpu = max(r["tokens"] / r["cpu_s"] for r in rnd["ceiling"].values())
        p, up = rnd["prepare"], rnd["startup"]
        t, h = p["tiktoken"], p["tokenizers"]
        t_steady_wall = t["tokens"] / (t["wall_s"] - up["tiktoken"]["wall_s"])
        t_steady_cpu = t["tokens"] / (_cpu(t) - _cpu(up["tiktoken"]))
        rows.append(
            {
                "load": (h["load_average"] + t["load_average"]) / 2,
                "h_wall": h["tokens"] / h["wall_s"],
                "t_wall": t["tokens"] / t["wall_s"],
                "speedup_wall": h["wall_s"] / t["wall_s"],
                "speedup_cpu": _cpu(h) / _cpu(t),
                "ceil_x_w": ceil_wall * w,
                "vs_ceiling_wall": t["tokens"] / t["wall_s"] / (ceil_wall * w),
                "vs_ceiling_wall_steady": t_steady_wall / (ceil_wall * w),
                "vs_ceiling_cpu": t["tokens"] / _cpu(t) / ceil_cpu,
                "vs_ceiling_cpu_steady": t_steady_cpu / ceil_cpu,
                "h_rss": max(h["worker_peak_rss_mib"]),
                "t_rss": max(t["worker_peak_rss_mib"]),
            }
        )
    lines = [
        f"| round (load avg) | tokenizers `prepare` | tiktoken `prepare` | speed-up: wall, CPU | "
        f"tiktoken ceiling x {w} | tiktoken `prepare` / ceiling: wall, after start-up | "
        f"per CPU-s, after start-up | peak RSS per worker: tokenizers, tiktoken |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rows):
        lines.append(
            f"| {i} ({r['load']:.1f}) | {r['h_wall'] / 1e6:.2f} M tok/s | {r['t_wall'] / 1e6:.2f} M tok/s | "
            f"{r['speedup_wall']:.2f}x, {r['speedup_cpu']:.2f}x | {r['ceil_x_w'] / 1e6:.2f} M tok/s | "
            f"{r['vs_ceiling_wall']:.2f}, {r['vs_ceiling_wall_steady']:.2f} | "
            f"{r['vs_ceiling_cpu']:.2f}, {r['vs_ceiling_cpu_steady']:.2f} | "
            f"{r['h_rss']:.0f}, {r['t_rss']:.0f} MiB |"
        )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    lines.append(
        f"| **median** | {med['h_wall'] / 1e6:.2f} M tok/s | {med['t_wall'] / 1e6:.2f} M tok/s | "
        f"**{med['speedup_wall']:.2f}x**, **{med['speedup_cpu']:.2f}x** | {med['ceil_x_w'] / 1e6:.2f} M tok/s | "
        f"**{med['vs_ceiling_wall']:.2f}**, **{med['vs_ceiling_wall_steady']:.2f}** | "
        f"**{med['vs_ceiling_cpu']:.2f}**, **{med['vs_ceiling_cpu_steady']:.2f}** | "
        f"{med['h_rss']:.0f}, {med['t_rss']:.0f} MiB |"
    )
    hc = results["tokenizers_ceiling"]
    lines += [
        "",
        f"tokenizers' own ceiling (in memory, 1 thread): {hc['tokens'] / hc['wall_s'] / 1e6:.2f} M tokens/s, "
        f"{hc['tokens'] / hc['cpu_s'] / 1e6:.2f} M per CPU-second. "
        f"Identical ids on {results['identical_documents']:,} documents in memory; "
        f"shards byte-identical across encoders and rounds: {results['identical_shards']}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
