"""The fixed cost of a `prepare`: a 100-document run, as a user types it, whole process tree.

Four configurations, alternated within each round so the machine's drift loads them alike:

* ``kept``: the default encoder (auto, which takes fastokens) with the static equivalence
  check kept from an earlier run of the same tokenizer (`pipeline.encoding.check_cache`): what
  every `prepare` but a tokenizer's first one on a machine pays;
* ``cold``: the same with an empty cache (a fresh ``XDG_CACHE_HOME``): the first run;
* ``tiktoken``: ``--encoder tiktoken`` (its check is kept too);
* ``uncompiled``: ``kept`` without tokshard's bytecode (PYTHONDONTWRITEBYTECODE=1 and a copy
  of the packages without it), as every run was before .ci/setup compiled them.

Each is one fresh ``python -m tokshard.cli prepare --workers N`` booting its own local workers;
wall time, and CPU time of the CLI and its workers (their rusage once they exit).

    python bench/bench_startup.py --tokenizer /work/bench-data/gpt2/tokenizer.json --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from checkout import compile_bytecode, uncompiled_copy  # noqa: E402  (bench/, beside this script)

CONFIGS = ("kept", "cold", "tiktoken", "uncompiled")


def run_once(config: str, args, data: Path, work: Path, kept_cache: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole tree) of one prepare."""
    code = REPO
    if config == "uncompiled":
        code = uncompiled_copy(REPO, work / "uncompiled")
    out = work / f"out-{config}"
    shutil.rmtree(out, ignore_errors=True)
    cache = kept_cache if config != "cold" else Path(tempfile.mkdtemp(dir=work, prefix="cold-cache-"))
    cmd = [
        sys.executable, "-m", "tokshard.cli", "prepare", "--input", str(data), "--tokenizer",
        str(args.tokenizer), "--out", str(out), "--workers", str(args.workers),
        "--encoder", "tiktoken" if config == "tiktoken" else "auto",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "XDG_CACHE_HOME": str(cache)}
    if config == "uncompiled":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"prepare ({config}) failed:\n{proc.stderr}")
    if config == "cold":
        shutil.rmtree(cache)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tokshard-bench-startup")
    args = ap.parse_args()
    from support import english_documents, write_jsonl

    compile_bytecode(REPO)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    data = write_jsonl(args.work / "small.jsonl", english_documents(args.docs))
    kept_cache = args.work / "kept-cache"
    for config in ("kept", "tiktoken"):  # fill the kept cache for both back ends; not counted
        run_once(config, args, data, args.work, kept_cache)
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for rnd in range(args.rounds):
        for config in CONFIGS[rnd % len(CONFIGS) :] + CONFIGS[: rnd % len(CONFIGS)]:
            wall, cpu = run_once(config, args, data, args.work, kept_cache)
            results[config].append((wall, cpu))
            print(f"#{rnd} {config}: wall {wall:.2f} s, CPU {cpu:.2f} s (load {os.getloadavg()[0]:.1f})")
    print()
    print(f"| configuration | wall, median (min-max) | CPU, median (min-max) |  ({args.rounds} rounds)")
    print("|---|---:|---:|")
    for config in CONFIGS:
        walls, cpus = zip(*results[config], strict=True)
        print(
            f"| {config} | {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}) | "
            f"{statistics.median(cpus):.2f} s ({min(cpus):.2f}-{max(cpus):.2f}) |"
        )


if __name__ == "__main__":
    main()
