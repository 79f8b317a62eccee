"""What the rerun's safety checks cost next to the run they protect.

1. Planning: the content samples of each input (first and last MiB per file, first and last
   64 KiB per .jsonl range) against the rest of planning, and against a whole `prepare`.
2. A rerun of a finished folder whose manifest is gone: it re-hashes every kept shard
   against its checkpoint and every sampled input range, then writes the manifest. Its
   wall time against the first run's, and the hash check's share of it.

Real text: the corpus of bench/corpus.py (kernel and Python documentation as JSON lines);
GPT-2's tokenizer. Rounds alternate so that the noisy shared machine loads both alike.

    python bench/bench_checks.py --mb 50 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import corpus as corpus_mod  # noqa: E402

from pipeline import recipe as recipe_mod  # noqa: E402
from pipeline.run.driver import RunOptions, prepare  # noqa: E402
from pipeline.run.open_state import open_run_state  # noqa: E402
from pipeline.sources import build_source  # noqa: E402
from pipeline.sources.files.fingerprints import content_sample, fingerprint, io_map  # noqa: E402
from pipeline.sources.files.listing import list_files  # noqa: E402
from pipeline.sources.files.pieces import pieces_of  # noqa: E402


def timed(fn, *args, **kwargs) -> float:
    began = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - began


def quiet(msg: str) -> None:
    pass


def one_round(raw: dict, work: Path, data: Path) -> tuple[dict[str, float], int]:
    """A first run, then a rerun with the manifest gone, and each check on its own."""
    out = work / "out"
    shutil.rmtree(work, ignore_errors=True)
    recipe = recipe_mod.from_dict(raw, "bench")
    options = RunOptions(workers=2)
    row = {"prepare": timed(prepare, recipe, out, options, log=quiet)}
    (out / "manifest.json").unlink()
    state = open_run_state(out)
    plan = state.load_plan()
    checkpoints = state.load_checkpoints(plan)
    row["shard_hashes"] = timed(state.kept_problems, plan, checkpoints)
    row["rerun"] = timed(prepare, recipe, out, options, log=quiet)
    source = build_source("web", recipe.sources["web"])
    row["plan"] = timed(source.partitions) + timed(source.origin)
    ranges = [p for part in plan.partitions for p in pieces_of(part.spec, part.size) if p.sample]
    (listed,) = list_files([str(data)], ".")
    row["samples"] = timed(io_map, lambda p: content_sample(p.path, p.start, p.stop), ranges) + timed(
        fingerprint, listed
    )
    return row, len(plan.partitions)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tokshard-bench-checks"))
    args = ap.parse_args()
    data = corpus_mod.write_corpus(args.work.with_name(f"{args.work.name}-corpus-{args.mb}.jsonl"), args.mb)
    tok = corpus_mod.gpt2_tokenizer(args.work.with_name(f"{args.work.name}-gpt2.json"))
    raw = {"tokenizer": str(tok), "sources": {"web": {"type": "files", "paths": [str(data)]}}}
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        row, n_parts = one_round(raw, args.work, data)
        for k, v in row.items():
            rows.setdefault(k, []).append(round(v, 3))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{args.mb} MB input, {n_parts} partitions, {args.rounds} rounds (medians):")
    for k, v in med.items():
        print(f"  {k}: {v:.3f} s  {rows[k]}")
    print(f"  rerun / prepare: {med['rerun'] / med['prepare']:.3f}")
    print(f"  shard hash check / prepare: {med['shard_hashes'] / med['prepare']:.4f}")
    print(f"  input samples / prepare: {med['samples'] / med['prepare']:.4f}")
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
