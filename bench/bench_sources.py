"""Hub sources vs files: is reading and assembling documents from parquet ever the bottleneck?

Builds a local mirror of Salesforce/wikitext (``wikitext-103-raw-v1/train-0000N-of-00004.parquet``,
rows are lines, `` = Title = `` headings) from real text, the Linux kernel's
Documentation (one article per file, the corpus twice over for >= 50 MB), and the very same
articles as JSON lines. Then it prepares both, side by side in one run on one Dask
cluster with the same workers and about the same number of partitions, with GPT-2's
tokenizer: the ``wikitext`` source (parquet row groups -> lines -> articles) against the
``files`` source (one JSON object per article), alternating over several rounds. Both
outputs must be identical. Reported: tokens/s of `prepare` (wall clock, planning
included) and tokens per CPU-second of the workers and the driver together, which stays
meaningful on a machine shared with other work; and, apart, the time to plan and read
every document without encoding it (the source's own cost).

    python bench/bench_sources.py [--workers 2] [--rounds 6] [--data /work/bench-data/hub]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import gpt2_tokenizer, kernel_docs, kernel_docs_root

from pipeline import recipe as recipe_mod
from pipeline.format import manifest as manifest_mod
from pipeline.run.driver import RunOptions, prepare

TARGET_BYTES = 50 << 20
PARTITIONS = 16  # both sources: 16 Dask tasks of about the same amount of text


def article_rows(title: str, text: str) -> list[str]:
    """An article as WikiText rows: heading, blank, then the lines (blank lines as "")."""
    rows = [f" = {title} = \n", ""]
    for line in text.splitlines():
        if line.startswith("= "):  # would read as a heading row
            line = "\\" + line
        rows.append(f" {line} \n" if line.strip() else "")
    return rows


def article_text(rows: list[str]) -> str:
    while rows and not rows[-1].strip():
        rows = rows[:-1]
    return "".join(r if r.endswith("\n") else r + "\n" for r in rows)


def build(data: Path) -> tuple[Path, Path, int]:
    """The WikiText-layout mirror and the same articles as .jsonl (made once, then reused)."""
    mirror = data / "mirror"
    jsonl = data / "articles.jsonl"
    done = data / "built"
    if done.exists():
        return mirror, jsonl, int(done.read_text())
    shutil.rmtree(mirror, ignore_errors=True)
    files = kernel_docs()
    rows: list[str] = [""]
    total = 0
    data.mkdir(parents=True, exist_ok=True)
    with open(jsonl, "w") as out:
        for copy in range(1, 10):
            for p in files:
                text = p.read_text(errors="replace")
                title = f"{p.relative_to(kernel_docs_root())}" + (f" ({copy})" if copy > 1 else "")
                article = article_rows(title, text)
                rows += article
                doc = article_text(article)
                out.write(json.dumps({"text": doc}) + "\n")
                total += len(doc.encode())
            if total >= TARGET_BYTES:
                break
    folder = mirror / "Salesforce" / "wikitext" / "wikitext-103-raw-v1"
    folder.mkdir(parents=True)
    # PARTITIONS files of equal text (one task each, the hub's usual layout); a cut may fall
    # inside an article, which the partition where it starts then reads to its end
    cuts, size, target = [0], 0, sum(map(len, rows)) / PARTITIONS
    for i, row in enumerate(rows):
        size += len(row)
        if size >= target * len(cuts) and len(cuts) < PARTITIONS:
            cuts.append(i + 1)
    cuts.append(len(rows))
    for i in range(PARTITIONS):
        chunk = pa.table({"text": rows[cuts[i] : cuts[i + 1]]})
        name = f"train-{i:05d}-of-{PARTITIONS:05d}.parquet"
        pq.write_table(chunk, folder / name, row_group_size=5_000)
    done.write_text(str(total))
    return mirror, jsonl, total


def compressed_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        meta = pq.ParquetFile(p).metadata
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
    return total


def read_only(recipe: dict) -> tuple[float, int]:
    """Seconds to plan and read every document of a recipe's one source, without encoding."""
    from pipeline.sources import build_source

    r = recipe_mod.from_dict(recipe, "bench")
    started = time.perf_counter()
    source = build_source("wiki", r.sources["wiki"])
    chars = sum(len(rec.text) for part in source.partitions() for rec in source.read(part, None))
    return time.perf_counter() - started, chars


def run(recipe: dict, out: Path, client) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of the workers and the driver, manifest) of one prepare."""
    shutil.rmtree(out, ignore_errors=True)
    r = recipe_mod.from_dict(recipe, "bench")
    cpu_before = sum(client.run(time.process_time).values()) + time.process_time()
    started = time.perf_counter()
    path = prepare(r, out, RunOptions(client=client, progress_interval=3600), log=lambda msg: None)
    seconds = time.perf_counter() - started
    cpu = sum(client.run(time.process_time).values()) + time.process_time() - cpu_before
    return seconds, cpu, json.loads(path.read_text())


def stream(out: Path) -> np.ndarray:
    m = manifest_mod.load(out / "manifest.json")
    return np.concatenate([np.fromfile(s.bin_path, dtype=np.uint16) for s in m.shards])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--data", type=Path, default=Path("/work/bench-data/hub"))
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    from pipeline.run.cluster import worker_env

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    mirror, jsonl, text_bytes = build(args.data)
    tok = gpt2_tokenizer(args.data / "gpt2" / "tokenizer.json")
    parquet_bytes = compressed_bytes(sorted(mirror.rglob("*.parquet")))
    recipes = {
        "files (.jsonl)": {
            "tokenizer": str(tok),
            "sources": {
                "wiki": {
                    "type": "files",
                    "paths": [str(jsonl)],
                    "partition_bytes": jsonl.stat().st_size // PARTITIONS + 1,
                }
            },
        },
        "wikitext (parquet mirror)": {
            "tokenizer": str(tok),
            "sources": {
                "wiki": {
                    "type": "wikitext",
                    "mirror": str(mirror),
                    "splits": ["train"],
                    "partition_bytes": parquet_bytes,  # one task per file
                }
            },
        },
    }
    results: dict[str, list[tuple[float, float, dict]]] = {name: [] for name in recipes}
    outs = {name: args.data / f"out{i}" for i, name in enumerate(recipes)}
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env=worker_env(1),
        ) as cluster,
        Client(cluster) as client,
    ):
        for round_ in range(args.rounds):  # alternate the order: drift in machine load cancels
            for name in list(recipes)[:: 1 if round_ % 2 == 0 else -1]:
                results[name].append(run(recipes[name], outs[name], client))
    reading = {name: read_only(recipe) for name, recipe in recipes.items()}
    identical = np.array_equal(*(stream(out) for out in outs.values()))
    print(
        f"text: {text_bytes / 1e6:.1f} MB; workers: {args.workers}; rounds: {args.rounds}; identical: {identical}"
    )
    print(
        "| source | partitions | documents | tokens | wall s (each round) | tokens/s (median) "
        "| tokens/CPU-s (median) | read only: s, MB/s |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    wall, cpu = {}, {}
    for name, runs in results.items():
        m = runs[0][2]
        split = next(iter(m["sources"]["wiki"]["splits"].values()))
        tokens = m["totals"]["tokens"]
        wall[name] = statistics.median(tokens / s for s, _, _ in runs)
        cpu[name] = statistics.median(tokens / c for _, c, _ in runs)
        secs = ", ".join(f"{s:.1f}" for s, _, _ in runs)
        print(
            f"| {name} | {split['partitions']} | {m['totals']['documents']:,} | {tokens:,} | {secs} "
            f"| {wall[name]:,.0f} | {cpu[name]:,.0f} | {reading[name][0]:.1f}, "
            f"{reading[name][1] / reading[name][0] / 1e6:,.0f} |"
        )
    (a, b), (c, d) = wall.values(), cpu.values()
    print(f"wikitext / files, medians: {b / a:.2f}x tokens/s, {d / c:.2f}x tokens/CPU-s")
    files_runs, wiki_runs = results.values()  # each round ran both back to back: pair them
    paired = [f[0] / w[0] for f, w in zip(files_runs, wiki_runs, strict=True)]
    shown = ", ".join(f"{r:.2f}" for r in paired)
    print(f"wikitext / files tokens/s, round by round: {shown}; median {statistics.median(paired):.2f}x")
    if not identical:
        sys.exit("outputs differ")


if __name__ == "__main__":
    main()
