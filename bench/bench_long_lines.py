"""Reading JSON lines of many MB: `readline` against the reads a `.jsonl` partition makes.

A partition's task (`pipeline.sources.files.readers.jsonl`) reads each line with
`read_line_at` (a line over 1 MiB is measured first, then read in one piece) and skips the line
it starts inside with `after_newline` (a scan through one reused buffer). Both are timed here
against `readline` on the same file, rounds alternated, the file in the page cache.

    python bench/bench_long_lines.py --file /work/bench-data/work-590d/long-9mb.jsonl --mb 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.sources.files.readers.jsonl import after_newline, read_line_at  # noqa: E402


def by_readline(path: Path, limit: int) -> int:
    done = 0
    with open(path, "rb", buffering=1 << 20) as f:
        while done < limit and (line := f.readline()):
            done += len(line)
    return done


def by_read_line(path: Path, limit: int) -> int:
    done = 0
    with open(path, "rb", buffering=1 << 20) as f:
        while done < limit and (line := read_line_at(f, done)):
            done += len(line)
    return done


def skip_by_readline(path: Path, starts: list[int]) -> int:
    with open(path, "rb", buffering=1 << 20) as f:
        for start in starts:
            f.seek(start)
            f.readline()
    return len(starts)


def skip_by_scan(path: Path, starts: list[int]) -> int:
    with open(path, "rb", buffering=1 << 20) as f:
        for start in starts:
            after_newline(f, start)
    return len(starts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, required=True, help="a JSON Lines file of long lines")
    ap.add_argument("--mb", type=int, default=200, help="read this much of it per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    limit = args.mb * 1_000_000
    size = min(limit, args.file.stat().st_size)
    starts = list(range(1, size, 8 << 20))  # where 8 MiB partitions start (inside lines, mostly)
    runs = {
        "read lines: readline": lambda: by_readline(args.file, limit),
        "read lines: read_line_at": lambda: by_read_line(args.file, limit),
        "skip to next line: readline": lambda: skip_by_readline(args.file, starts),
        "skip to next line: after_newline": lambda: skip_by_scan(args.file, starts),
    }
    by_readline(args.file, limit)  # into the page cache
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - began)
    print(f"{args.file}: {size / 1e6:.0f} MB, {len(starts)} partition starts, {args.rounds} rounds")
    for name, t in times.items():
        rate = f", {size / statistics.median(t) / 1e9:.2f} GB/s" if name.startswith("read") else ""
        print(f"{name}: median {statistics.median(t) * 1000:.0f} ms (min {min(t) * 1000:.0f}){rate}")


if __name__ == "__main__":
    main()
