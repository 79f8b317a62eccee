"""Many small input files against the same bytes in a few: `prepare`'s time and shards, and
what planning costs per file, locally and in a bucket.

Side by side in one run, rounds alternated:

  many   5,000 JSON Lines files of about 16 KB against the very same bytes in one file:
         a whole `tokshard prepare` each (a fresh CLI process booting its own 2 local
         workers, GPT-2's tokenizer, the default encoder), wall time and shards written;
  tiny   100,000 tiny files against the same bytes in 100 files: planning plus run, the same
         way;
  plan   planning alone (listing, fingerprinting, cutting into partitions, in process) of the
         100,000 local files, and of 100,000 objects in a bucket of a moto S3 server started
         here (the tests' server), with this checkout and, given ``--baseline DIR``, with
         another checkout's code on the same inputs.

Text: `bench/corpus.py` (real prose from Debian packages), cut at line ends into documents
of the sizes above. Data is written once under ``--data`` and reused.

    python bench/bench_many_files.py --rounds 3 --baseline /work/main
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.append(str(REPO / "tests"))  # last: tests/pipeline must not shadow the package

import corpus as corpus_mod  # noqa: E402

#: what each side of a comparison holds: (files, bytes per file)
MANY_FILES, MANY_BYTES = 5_000, 16_000
TINY_FILES, TINY_BYTES = 100_000, 500
FEW_FILES = 100

#: planning alone, run in a fresh interpreter on ``sys.argv[1]``'s code (this checkout or a
#: baseline), printing the seconds of each step as JSON
PLAN_SCRIPT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pipeline.sources.files import FilesSource
cfg = FilesSource.normalize("d", {"paths": [sys.argv[2]]}, "bench")
source = FilesSource("d", cfg)
began = time.perf_counter()
files = source.files("train")
listed = time.perf_counter()
origin = source.origin()
fingerprinted = time.perf_counter()
parts = source.partitions()
planned = time.perf_counter()
print(json.dumps({"files": len(files), "partitions": len(parts), "list": listed - began,
                  "fingerprint": fingerprinted - listed, "partition": planned - fingerprinted,
                  "total": planned - began}))
"""


def documents(size: int, count: int) -> list[str]:
    """``count`` documents of about ``size`` bytes each, cut from the real-text corpus (read
    as one stream of lines) at line ends."""
    source = corpus_mod.write_corpus(Path("/work/bench-data/corpus-100.jsonl"), 100)
    found: list[str] = []
    held = ""
    with open(source) as f:
        for line in (line for doc in f for line in json.loads(doc)["text"].splitlines(keepends=True)):
            held += line
            if len(held.encode()) >= size:
                found.append(held)
                held = ""
                if len(found) == count:
                    return found
    raise SystemExit(f"the corpus holds only {len(found)} documents of {size} bytes")


def write_sets(folder: Path, name: str, docs: list[str], files: int, few: int) -> tuple[Path, Path]:
    """The documents as ``files`` files (each a run of whole JSON lines of about the same
    size) and as ``few`` files of exactly the same bytes."""
    many, one = folder / f"{name}-many", folder / f"{name}-few"
    if (folder / f"{name}.done").exists():
        return many, one
    shutil.rmtree(many, ignore_errors=True)
    shutil.rmtree(one, ignore_errors=True)
    many.mkdir(parents=True)
    one.mkdir(parents=True)
    lines = [json.dumps({"text": d}) + "\n" for d in docs]
    per_file = -(-len(lines) // files)
    for i in range(files):
        (many / f"part-{i:06d}.jsonl").write_text("".join(lines[i * per_file : (i + 1) * per_file]))
    per_few = -(-len(lines) // few)
    for i in range(few):
        (one / f"all-{i:04d}.jsonl").write_text("".join(lines[i * per_few : (i + 1) * per_few]))
    (folder / f"{name}.done").touch()
    return many, one


def prepare(inputs: Path, out: Path, tokenizer: Path) -> dict[str, float]:
    """One `tokshard prepare` as a user runs it: its wall time, shards and partitions."""
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tokshard.cli", "prepare", "--input", str(inputs / "*.jsonl"),
         "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "2"],
        cwd=REPO, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    seconds = time.perf_counter() - began
    doc = json.loads((out / "manifest.json").read_text())
    split = next(iter(doc["sources"].values()))["splits"]["train"]
    return {"seconds": seconds, "shards": len(doc["shards"]), "partitions": split["partitions"],
            "tokens": split["tokens"]}  # fmt: skip


def compare(name: str, many: Path, few: Path, rounds: int, work: Path, tokenizer: Path) -> dict:
    rows = []
    for r in range(rounds):
        a = prepare(few, work / f"{name}-out-few", tokenizer)
        b = prepare(many, work / f"{name}-out-many", tokenizer)
        assert a["tokens"] == b["tokens"], (a, b)
        rows.append({"few": a, "many": b, "ratio": b["seconds"] / a["seconds"]})
        print(f"{name} round {r}: few {a['seconds']:.1f} s ({a['shards']} shards), many {b['seconds']:.1f} s "
              f"({b['shards']} shards, {b['partitions']} partitions): {rows[-1]['ratio']:.2f}x", flush=True)  # fmt: skip
    return {"rounds": rows, "median_ratio": statistics.median(r["ratio"] for r in rows)}


def plan(checkout: Path, pattern: str, env: dict[str, str] | None = None) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT, str(checkout), pattern],
        check=True, capture_output=True, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def bucket_of(server, folder: Path, count: int) -> str:
    """A new bucket holding the first ``count`` of ``folder``'s files as objects (32 threads)."""
    bucket = server.new_bucket()
    s3 = server.client()
    paths = sorted(folder.iterdir())[:count]

    def put(path: Path) -> None:
        s3.put_object(Bucket=bucket, Key=f"in/{path.name}", Body=path.read_bytes())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, paths))
    return bucket


def raw_listing(server, bucket: str) -> dict[str, float]:
    """The server's own cost: every page of the bucket's listing, fetched with boto3 alone."""
    began = time.perf_counter()
    pages = keys = 0
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="in/"):
        pages += 1
        keys += len(page.get("Contents", []))
    return {"objects": keys, "pages": pages, "seconds": time.perf_counter() - began}


def plan_objects(folder: Path, checkouts: dict[str, Path], count: int, baseline_count: int) -> dict:
    """Planning ``count`` objects with this checkout (beside the server's bare listing), and
    ``baseline_count`` objects with every checkout (the baseline's cost is per object)."""
    from support import moto_server

    results = {}
    with moto_server() as server:
        for n, labels in ((count, ["this"]), (baseline_count, list(checkouts))):
            began = time.perf_counter()
            bucket = bucket_of(server, folder, n)
            print(f"put {n:,} objects in {time.perf_counter() - began:.0f} s", flush=True)
            results[f"list {n} objects, boto3 alone"] = found = raw_listing(server, bucket)
            print(f"bare listing of {n:,} objects: {found}", flush=True)
            for label in labels:
                found = plan(checkouts[label], f"s3://{bucket}/in/*.jsonl", server.env)
                results[f"plan {n} objects {label}"] = found
                print(f"plan {n:,} objects ({label}): {found}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/work/bench-data/many-files"))
    ap.add_argument("--baseline", type=Path, help="another checkout whose planning to measure too")
    ap.add_argument(
        "--runs", nargs="*", default=["16k", "tiny"], choices=["16k", "tiny"], help="comparisons to run"
    )
    ap.add_argument("--skip-plan", action="store_true", help="no planning alone")
    ap.add_argument("--skip-objects", action="store_true", help="no bucket")
    ap.add_argument("--objects", type=int, default=TINY_FILES, help="objects to plan with this checkout")
    ap.add_argument("--baseline-objects", type=int, default=10_000, help="objects to plan with each checkout")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    tokenizer = corpus_mod.gpt2_tokenizer(args.data / "gpt2-tokenizer.json")
    many, one = write_sets(args.data, "16k", documents(MANY_BYTES // 4, MANY_FILES * 4), MANY_FILES, 1)
    tiny, hundred = write_sets(
        args.data, "tiny", documents(TINY_BYTES - 40, TINY_FILES), TINY_FILES, FEW_FILES
    )
    results: dict = {}
    checkouts = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    for label, checkout in checkouts.items() if not args.skip_plan else ():
        results[f"plan local {label}"] = found = plan(checkout, str(tiny / "*.jsonl"))
        print(f"plan {TINY_FILES:,} local files ({label}): {found}", flush=True)
    if not args.skip_objects:
        results.update(plan_objects(tiny, checkouts, args.objects, args.baseline_objects))
    work = args.data / "work"
    if "16k" in args.runs:
        results["5,000 files of 16 KB vs one file"] = compare("16k", many, one, args.rounds, work, tokenizer)
    if "tiny" in args.runs:
        results["100,000 tiny files vs 100 files"] = compare(
            "tiny", tiny, hundred, args.rounds, work, tokenizer
        )
    for name, found in results.items():
        if "median_ratio" in found:
            print(f"{name}: median {found['median_ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
