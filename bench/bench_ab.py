"""One `tokshard` command at two commits, alternated: what a change did to wall and CPU time.

The machine drifts (bench/RESULTS.md's notes: up to 3x between sessions), so the two
checkouts run one after the other within each round, each a fresh process tree as a user
types it, and the table reports both sides' medians and their ratio. ``--before`` is checked
out into a temporary git worktree; ``--after`` defaults to this checkout as it is. Every
``OUT`` in the command is replaced by a fresh folder per run; one untimed run of each side
first fills page cache and the kept equivalence check (`pipeline.encoding.check_cache`).
With ``--prime-input FILE`` every timed run instead starts from an empty check cache filled by
one untimed run of the command on FILE: a run whose kept answers come from other documents,
as the first run of long documents after an upgrade, or after runs of ordinary ones.

    python bench/bench_ab.py --before 74303a4 --rounds 6 -- prepare \\
        --input /work/bench-data/corpus-590d.jsonl \\
        --tokenizer /work/bench-data/gpt2/tokenizer.json --out OUT --workers 2
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

from checkout import compile_bytecode  # bench/, beside this script

REPO = Path(__file__).resolve().parent.parent


def run_once(
    checkout: Path, command: list[str], work: Path, env_extra: dict[str, str] | None = None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole tree) of one run in ``checkout``."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "tokshard.cli", *[str(out) if a == "OUT" else a for a in command]]
    env = {**os.environ, "PYTHONPATH": str(checkout), **(env_extra or {})}
    os.sync()  # the run before wrote its shards: not this run's writeback to wait behind
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(command)} failed:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def primed_run(checkout: Path, command: list[str], work: Path, prime_input: str) -> tuple[float, float]:
    """`run_once` after emptying the check cache and filling it by an untimed run on ``prime_input``."""
    cache = work / "xdg-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {"XDG_CACHE_HOME": str(cache)}
    at = command.index("--input") + 1
    run_once(checkout, [*command[:at], prime_input, *command[at + 1 :]], work, env)
    return run_once(checkout, command, work, env)


def worktree(rev: str, where: Path) -> Path:
    path = where / f"before-{rev}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)  # fmt: skip
    return path


def summary(name: str, runs: list[tuple[float, float]]) -> tuple[float, float, str]:
    walls, cpus = zip(*runs, strict=True)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return (
        wall,
        cpu,
        (
            f"| {name} | {wall:.2f} s ({min(walls):.2f}-{max(walls):.2f}) | "
            f"{cpu:.2f} s ({min(cpus):.2f}-{max(cpus):.2f}) |"
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a commit (checked out into a temporary worktree)")
    ap.add_argument("--after", type=Path, default=REPO, help="a checkout (default: this one)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--prime-input", help="each timed run's check cache: fresh, filled by a run on this input"
    )
    ap.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- then the tokshard command; OUT: a fresh folder"
    )
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    if args.prime_input and "--input" not in command:
        ap.error("--prime-input replaces the command's --input: give one")
    with tempfile.TemporaryDirectory(prefix="tokshard-bench-ab-") as tmp:
        work = Path(tmp)
        sides = {f"before ({args.before})": worktree(args.before, work), "after": args.after.resolve()}
        try:
            for checkout in sides.values():
                compile_bytecode(checkout)  # both as .ci/setup leaves an install
                run_once(checkout, command, work)
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for rnd in range(args.rounds):
                order = list(sides.items())
                for name, checkout in order if rnd % 2 == 0 else order[::-1]:
                    if args.prime_input:
                        wall, cpu = primed_run(checkout, command, work, args.prime_input)
                    else:
                        wall, cpu = run_once(checkout, command, work)
                    runs[name].append((wall, cpu))
                    print(
                        f"#{rnd} {name}: wall {wall:.2f} s, CPU {cpu:.2f} s (load {os.getloadavg()[0]:.1f})"
                    )
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(sides[f"before ({args.before})"])],
                           capture_output=True)  # fmt: skip
    print(
        f"\n| checkout | wall, median (min-max) | CPU of the tree, median (min-max) |  ({args.rounds} rounds)"
    )
    print("|---|---:|---:|")
    (w0, c0, line0), (w1, c1, line1) = (summary(name, r) for name, r in runs.items())
    print(line0)
    print(line1)
    print(f"| after / before | {w1 / w0:.3f} | {c1 / c0:.3f} |")


if __name__ == "__main__":
    main()
