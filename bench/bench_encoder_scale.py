"""The fast path against tiktoken's ceiling as the corpus grows: where the fixed cost goes.

A `prepare` pays about 2 s whatever its corpus (Python and Dask start-up, the equivalence
check, the workers' warm-up, closing) and then runs at its steady rate. So its whole-command
rate against tiktoken's ceiling (texts in memory, no I/O) depends on the corpus size, and a
VM whose speed drifts by 10-20% within minutes hides a few percent in any one measurement.
This benchmark therefore measures only the fast path, on each corpus given, in an
interleaved chain:

    ceiling, prepare joining a cluster, ceiling, prepare booting its own workers, ceiling, ...

so every `prepare` is compared with the 2-process ceiling measured right before and right
after it (the same helpers as bench_encoders.py: the ceiling is ``--workers`` processes
encoding their share of the texts at once; the joining run clocks each task on the workers,
so "outside tasks" is the command's wall time less the workers' task time per worker).
The 3x comparison with `tokenizers` is bench_encoders.py's.

    python bench/corpus.py --mb 2000 --out /work/bench-data/corpus-2000.jsonl
    python bench/bench_encoder_scale.py --rounds 3 --tokenizer /work/bench-data/gpt2/tokenizer.json \\
        --corpus /work/bench-data/corpus-50.jsonl /work/bench-data/corpus-500.jsonl
    python bench/bench_encoder_scale.py --rounds 2 --tokenizer /work/bench-data/gpt2/tokenizer.json \\
        --corpus /work/bench-data/corpus-2000.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bench_encoders import parallel_ceiling, run_prepare, run_prepare_own_workers

MODES = ("joining", "own workers")


def _rate(r: dict) -> float:
    return r["tokens"] / r["wall_s"]


def _ceiling(args, label: str) -> dict:
    r = parallel_ceiling(args)
    print(f"  ceiling {label}: {_rate(r) / 1e6:.2f} M tokens/s ({r['wall_s']:.1f} s)", flush=True)
    return r


def chain(args) -> dict:
    """``args.rounds`` x (joining, own workers), each between two ceilings, on one corpus."""
    ceilings = [_ceiling(args, "first")]
    runs: list[dict] = []
    for rep in range(args.rounds):
        for mode in MODES:
            # only a joining run's workers can be watched: its tasks clocked
            r = run_prepare("tiktoken", args) if mode == "joining" else run_prepare_own_workers(args)
            steady = r.get("steady")
            print(f"  #{rep} prepare {mode}: {r['tokens']:,} tokens in {r['wall_s']:.1f} s", flush=True)
            ceilings.append(_ceiling(args, f"after #{rep} {mode}"))
            before, after = ceilings[-2], ceilings[-1]
            ceiling = (before["tokens"] + after["tokens"]) / (before["wall_s"] + after["wall_s"])
            runs.append(
                {
                    "mode": mode,
                    "round": rep,
                    "tokens": r["tokens"],
                    "wall_s": r["wall_s"],
                    "ceiling": ceiling,
                    "ratio": _rate(r) / ceiling,
                    "outside_tasks_s": r["wall_s"] - steady["wall_s"] / args.workers if steady else None,
                    "steady_ratio": steady["tokens"] / steady["wall_s"] * args.workers / ceiling
                    if steady
                    else None,
                    "shard_hashes": r["shard_hashes"],
                }
            )
            print(f"  #{rep} prepare {mode}: {runs[-1]['ratio']:.3f} of the ceiling around it", flush=True)
    return {
        "corpus": str(args.corpus),
        "mb": args.corpus.stat().st_size / 1e6,
        "ceilings": ceilings,
        "runs": runs,
        "identical_shards": len({tuple(r["shard_hashes"]) for r in runs}) == 1,
    }


def _ratios(runs: list[dict]) -> str:
    return ", ".join(f"{r['ratio']:.3f}" for r in runs)


def table(results: list[dict], workers: int) -> str:
    lines = [
        f"| corpus | tokens | `prepare` / {workers} processes at once, joining a cluster: rounds | "
        "median | booting its own workers: rounds | median | steady (joining), median | "
        "seconds outside tasks (joining), median | shards identical |",
        "|---|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for res in results:
        by = {m: [r for r in res["runs"] if r["mode"] == m] for m in MODES}
        join, own = by["joining"], by["own workers"]
        lines.append(
            f"| {res['mb']:,.0f} MB | {join[0]['tokens'] / 1e6:,.1f} M "
            f"| {_ratios(join)} "
            f"| **{statistics.median(r['ratio'] for r in join):.2f}** "
            f"| {_ratios(own)} "
            f"| **{statistics.median(r['ratio'] for r in own):.2f}** "
            f"| {statistics.median(r['steady_ratio'] for r in join):.2f} "
            f"| {statistics.median(r['outside_tasks_s'] for r in join):.1f} "
            f"| {'yes' if res['identical_shards'] else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, nargs="+", required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partition-bytes", type=int, default=0, help="0: prepare's default (auto)")
    ap.add_argument("--work", type=Path, default=Path("/work/bench-data/scale-work"))
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    results = []
    for corpus in args.corpus:
        print(f"{corpus} ({corpus.stat().st_size / 1e6:,.0f} MB), load average {os.getloadavg()[0]:.1f}")
        results.append(chain(argparse.Namespace(**{**vars(args), "corpus": corpus})))
        if args.json:  # after each corpus: a long run keeps what it has measured
            args.json.write_text(json.dumps(results, indent=1))
    print()
    print(table(results, args.workers))


if __name__ == "__main__":
    main()
