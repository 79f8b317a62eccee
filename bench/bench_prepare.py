"""End-to-end `prepare` throughput and worker memory against the raw encoder ceiling.

Side by side in one run, in rounds (this machine is noisy): the ceiling (the same texts
already in memory through `tokenizers`' encode_batch on one thread, no I/O; times the
worker count for perfect scaling), then `tokshard prepare` with 1 and with 2 workers as
real CLI processes. Peak RSS of every Dask worker process is sampled with psutil. A
second corpus 10x larger checks that worker memory stays flat as input grows.

    python bench/bench_prepare.py --rounds 2 --sizes 50 500 --encoder tokenizers
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import gpt2_tokenizer, write_corpus

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKSHARD_BENCH_DATA", "/work/bench-data"))


def ceiling(corpus: Path, tokenizer: Path, batch_chars: int = 1 << 20) -> tuple[float, int]:
    """Tokens/s of encode_batch on one thread over texts already in memory."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.encode_special_tokens = True
    texts = [json.loads(line)["text"] for line in open(corpus)]
    batches, cur, chars = [], [], 0
    for t in texts:
        cur.append(t)
        chars += len(t)
        if chars >= batch_chars:
            batches.append(cur)
            cur, chars = [], 0
    batches.append(cur)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for b in batches for e in tok.encode_batch_fast(b, add_special_tokens=False))
    return tokens / (time.perf_counter() - start), tokens


def _ceiling_share(args: tuple[str, str, int, int, object]) -> tuple[int, float, float]:
    corpus, tokenizer, index, count, barrier = args
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    tok.encode_special_tokens = True
    texts = [json.loads(line)["text"] for i, line in enumerate(open(corpus)) if i % count == index]
    barrier.wait()
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 64):
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i : i + 64], add_special_tokens=False))
    return tokens, start, time.perf_counter()


def parallel_ceiling(corpus: Path, tokenizer: Path, processes: int) -> float:
    """What this machine gives N encoder processes at once (texts in memory, no I/O)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(processes)
        jobs = [(str(corpus), str(tokenizer), i, processes, barrier) for i in range(processes)]
        with ctx.Pool(processes) as pool:
            results = pool.map(_ceiling_share, jobs)
    tokens = sum(r[0] for r in results)
    return tokens / (max(r[2] for r in results) - min(r[1] for r in results))


def run_prepare(corpus: Path, tokenizer: Path, workers: int, out: Path, encoder: str) -> dict:
    """One `tokshard prepare` CLI run; returns wall time, tokens and per-worker peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "tokshard.cli", "prepare", "--input", str(corpus), "--tokenizer", str(tokenizer),
        "--out", str(out), "--workers", str(workers), "--encoder", encoder,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    driver = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    driver_peak = 0
    while proc.poll() is None:
        try:
            driver_peak = max(driver_peak, driver.memory_info().rss)
            for child in driver.children(recursive=True):
                if "resource_tracker" in " ".join(child.cmdline()):
                    continue
                peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
        time.sleep(0.2)
    wall = time.perf_counter() - start
    _stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed:\n{stderr}")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    return {
        "wall_s": wall,
        "tokens": totals["tokens"],
        "tokens_per_s": totals["tokens"] / wall,
        "worker_peak_rss_mib": sorted(round(v / 2**20) for v in peaks.values()),
        "driver_peak_rss_mib": round(driver_peak / 2**20),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=[50, 500], help="corpus sizes in MB; the first is timed"
    )
    ap.add_argument("--encoder", default="tokenizers")
    ap.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = ap.parse_args()
    tokenizer = gpt2_tokenizer(DATA / "gpt2" / "tokenizer.json")
    corpora = {mb: write_corpus(DATA / f"corpus-{mb}.jsonl", mb) for mb in args.sizes}
    small = corpora[args.sizes[0]]
    rows: dict[str, list] = {"ceiling_1thread": [], "ceiling_2proc": [], "prepare_1w": [], "prepare_2w": []}
    for r in range(args.rounds):
        rate, tokens = ceiling(small, tokenizer)
        rows["ceiling_1thread"].append(rate)
        rows["ceiling_2proc"].append(parallel_ceiling(small, tokenizer, 2))
        for w in (1, 2):
            res = run_prepare(small, tokenizer, w, DATA / "out-prepare", args.encoder)
            assert res["tokens"] == tokens + sum(1 for _ in open(small)), (
                "token count differs from the ceiling's"
            )
            rows[f"prepare_{w}w"].append(res)
            print(f"round {r}: {w} worker(s): {res}", flush=True)
        print(
            f"round {r}: ceiling {rate:,.0f} tok/s, 2 processes {rows['ceiling_2proc'][-1]:,.0f}", flush=True
        )
    big = {}
    for mb in args.sizes[1:]:
        big[mb] = run_prepare(corpora[mb], tokenizer, 2, DATA / "out-prepare-big", args.encoder)
        print(f"{mb} MB, 2 workers: {big[mb]}", flush=True)
    ceil = statistics.median(rows["ceiling_1thread"])
    ceil2 = statistics.median(rows["ceiling_2proc"])
    p1 = statistics.median(r["tokens_per_s"] for r in rows["prepare_1w"])
    p2 = statistics.median(r["tokens_per_s"] for r in rows["prepare_2w"])
    rss_small = max(max(r["worker_peak_rss_mib"]) for r in rows["prepare_2w"])
    summary = {
        "corpus_mb": args.sizes[0],
        "tokens": rows["prepare_2w"][0]["tokens"],
        "ceiling_1thread_tok_s": round(ceil),
        "ceiling_x2_tok_s": round(2 * ceil),
        "ceiling_2proc_tok_s": round(ceil2),
        "machine_2proc_scaling": round(ceil2 / ceil, 3),
        "prepare_1w_tok_s": round(p1),
        "prepare_2w_tok_s": round(p2),
        "prepare_2w_over_ceiling_x2": round(p2 / (2 * ceil), 3),
        "prepare_2w_over_1w": round(p2 / p1, 3),
        "prepare_1w_over_ceiling": round(p1 / ceil, 3),
        "prepare_2w_over_ceiling_2proc": round(p2 / ceil2, 3),
        "worker_peak_rss_mib": {
            args.sizes[0]: rss_small,
            **{mb: max(b["worker_peak_rss_mib"]) for mb, b in big.items()},
        },
        "rounds": rows,
        "big": big,
    }
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rounds", "big")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
