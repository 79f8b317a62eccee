"""What the commands after `prepare` cost as shards and input files grow: `status`, `verify`,
`inspect`, `megatron-args`, the manifest's size and the trainer's start-up.

Folders, made once under ``--data`` and reused:

  shards-N  a real `tokshard prepare` (GPT-2's tokenizer, 2 local workers) of real prose
            (`bench/corpus.py`, cut at line ends into documents of about 400 bytes) with a tiny
            ``--shard-tokens`` and ``--partition-bytes``, so it writes about N shards in N/10
            partitions: real .bin/.idx, checkpoints, run.json and manifest;
  files     the same `prepare` of the 100,000 files of 500 bytes of `bench/bench_many_files.py`
            (its data folder, made there if missing);
  synth-N   N shards of random ids written by the format's own `ShardSequence` (the trainer
            bench's `synth_manifest`), for the trainer's start-up up to 100,000 shards.

Each folder is measured in a fresh interpreter with this checkout's code and, given
``--baseline DIR``, with another checkout's, one after the other (medians of ``--repeat``
calls, in process, imports not counted):

  status           `pipeline.run.status.status` of the finished folder
  status, no manifest  the same with the manifest moved aside: a run stopped before its
                   manifest, where status checks every kept shard's size and hash
  verify           `pipeline.storage.verify_place.verify` (re-hash every shard)
  inspect          `pipeline.inspection.summary`
  megatron-args    `trainer.megatron.blend` of the train split (what the command prints)
  manifest load    `pipeline.format.manifest.load`

and the trainer's start-up in a fresh process (`bench_trainer_data.bench_startup`: manifest
load, `trainer.plan.prepare` with every guard, the dataset and the sampler, then the first
batch; the best of three).

    python bench/bench_scale.py --baseline /tmp/tokshard-base --json /work/bench-data/scale.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.append(str(REPO / "tests"))  # last: tests/pipeline must not shadow the package

import bench_many_files  # noqa: E402
import corpus as corpus_mod  # noqa: E402

#: shards per partition, tokens per shard, bytes per document and documents per shard of the
#: shards-N folders (a shard holds whole documents: about 1.06 of these, about 190 tokens)
SHARDS_PER_PARTITION = 10
SHARD_TOKENS = 200
DOC_BYTES = 400
DOCS_PER_SHARD = 1.06
#: most tokens per shard of the synth-N folders, and the tokens they hold on average (whole
#: documents of 50 to 400 tokens)
SYNTH_SHARD_TOKENS = 512
SYNTH_FILLED = 374

#: the measures, in a fresh interpreter on ``sys.argv[1]``'s code, of folder ``sys.argv[2]``;
#: prints the median seconds of each as JSON
MEASURE_SCRIPT = """
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
out, repeat = sys.argv[2], int(sys.argv[3])
from pipeline.format import manifest as manifest_mod
from pipeline.inspection import summary
from pipeline.run.status import status
from pipeline.storage.verify_place import verify
from trainer.megatron import blend

def timed(fn):
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)

found = {}
found["status"] = timed(lambda: status(out))
manifest = os.path.join(out, "manifest.json")
os.rename(manifest, manifest + ".aside")
try:
    found["status, no manifest"] = timed(lambda: status(out))
finally:
    os.rename(manifest + ".aside", manifest)
faults = verify(out)[0]
assert not faults, faults[:3]
found["verify"] = timed(lambda: verify(out))
found["inspect"] = timed(lambda: summary(out))
found["megatron-args"] = timed(lambda: blend([manifest_mod.load(out)], "train", None))
found["manifest load"] = timed(lambda: manifest_mod.load(out))
print(json.dumps(found))
"""


def prepare(inputs: str, out: Path, tokenizer: Path, *extra: str) -> float:
    """One `tokshard prepare` into a fresh ``out``; its wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tokshard.cli", "prepare", "--input", inputs, "--tokenizer", str(tokenizer),
         "--out", str(out), "--workers", "2", *extra],
        cwd=REPO, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return time.perf_counter() - began


def shards_folder(data: Path, shards: int, tokenizer: Path) -> Path:
    """A prepared folder of about ``shards`` shards (made once)."""
    out = data / f"shards-{shards}"
    if (out / "manifest.json").is_file():
        return out
    docs = bench_many_files.documents(DOC_BYTES, int(shards * DOCS_PER_SHARD))
    text = data / f"docs-{shards}.jsonl"
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    partition = max(1, text.stat().st_size * SHARDS_PER_PARTITION // shards)
    seconds = prepare(
        str(text), out, tokenizer, "--shard-tokens", str(SHARD_TOKENS), "--partition-bytes", str(partition)
    )
    print(f"prepared {out} in {seconds:.1f} s", flush=True)
    return out


def files_folder(data: Path, tokenizer: Path) -> Path:
    """The prepared 100,000 tiny files of bench_many_files.py (made once)."""
    out = data / "files-100k"
    if (out / "manifest.json").is_file():
        return out
    many_files = Path("/work/bench-data/many-files")
    tiny, _ = bench_many_files.write_sets(
        many_files,
        "tiny",
        bench_many_files.documents(bench_many_files.TINY_BYTES - 40, bench_many_files.TINY_FILES),
        bench_many_files.TINY_FILES,
        bench_many_files.FEW_FILES,
    )
    seconds = prepare(str(tiny / "*.jsonl"), out, tokenizer)
    print(f"prepared {out} in {seconds:.1f} s", flush=True)
    return out


def facts(out: Path) -> dict:
    """Shards, partitions, input files and the sizes of the manifest and run.json."""
    doc = json.loads((out / "manifest.json").read_text())
    plan = out / ".tokshard" / "run.json"
    splits = [s for src in doc["sources"].values() for s in src["splits"].values()]
    return {
        "shards": len(doc["shards"]),
        "partitions": sum(s["partitions"] for s in splits),
        "manifest_bytes": (out / "manifest.json").stat().st_size,
        "run_json_bytes": plan.stat().st_size if plan.is_file() else None,
    }


def measure(checkout: Path, out: Path, repeat: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_SCRIPT, str(checkout), str(out), str(repeat)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def synth_folder(data: Path, shards: int) -> Path:
    """About ``shards`` synthetic shards and their manifest (made once); the manifest's path."""
    import bench_trainer_data

    out = data / f"synth-{shards}"
    return bench_trainer_data.synth_manifest(
        out, tokens=shards * SYNTH_FILLED, shard_tokens=SYNTH_SHARD_TOKENS, doc_len=(50, 400)
    )


def startup_code(checkout: Path) -> str:
    """``checkout``'s own start-up script (`bench_trainer_data.STARTUP_CODE`, read, not
    imported: it follows that checkout's trainer settings)."""
    tree = ast.parse((checkout / "bench" / "bench_trainer_data.py").read_text())
    (code,) = (
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "STARTUP_CODE" for t in node.targets)
    )
    return code


def startup(checkout: Path, data: Path, shards: int) -> dict:
    """The trainer's start-up on ``shards`` synthetic shards, with ``checkout``'s code."""
    manifest = synth_folder(data, shards)
    code = startup_code(checkout)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    runs = []
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", code, str(manifest), "none"],  # packing "none", where it is asked
            env=env, capture_output=True, text=True, check=True, cwd=checkout,
        )  # fmt: skip
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["manifest_load_s"] + r["prepare_s"] + r["first_batch_s"])
    best["startup_s"] = best["manifest_load_s"] + best["prepare_s"] + best["first_batch_s"]
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/work/bench-data/scale"))
    ap.add_argument("--shards", type=int, nargs="*", default=[1_000, 3_000, 10_000])
    ap.add_argument("--startup-shards", type=int, nargs="*", default=[1_000, 3_000, 10_000, 100_000])
    ap.add_argument("--skip-files", action="store_true", help="no 100,000-file folder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout to measure the same folders with")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--prepare-only", action="store_true", help="make the folders, measure nothing")
    args = ap.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    tokenizer = corpus_mod.gpt2_tokenizer(args.data / "gpt2-tokenizer.json")
    checkouts = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    folders = [shards_folder(args.data, n, tokenizer) for n in args.shards]
    if not args.skip_files:
        folders.append(files_folder(args.data, tokenizer))
    if args.prepare_only:
        for n in args.startup_shards:
            synth_folder(args.data, n)
        return
    results: dict = {"commands": {}, "startup": {}}
    for out in folders:
        row = results["commands"][out.name] = facts(out)
        for label, checkout in checkouts.items():
            row[label] = measure(checkout, out, args.repeat)
            print(f"{out.name} {label}: {json.dumps(row)}", flush=True)
    for n in args.startup_shards:
        row = results["startup"][n] = {}
        for label, checkout in checkouts.items():
            row[label] = startup(checkout, args.data, n)
            print(f"start-up {n:,} shards {label}: {json.dumps(row[label])}", flush=True)
    print_tables(results, list(checkouts))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def print_tables(results: dict, labels: list[str]) -> None:
    names = ["status", "status, no manifest", "verify", "inspect", "megatron-args", "manifest load"]
    print("\n| folder | shards | partitions | manifest | run.json | code | " + " | ".join(names) + " |")
    print("|---|---:|---:|---:|---:|---|" + "---:|" * len(names))
    for name, row in results["commands"].items():
        for label in labels:
            cells = " | ".join(f"{row[label][n]:.3f}" for n in names)
            print(
                f"| {name} | {row['shards']:,} | {row['partitions']:,} | {row['manifest_bytes'] / 1e6:.1f} MB | "
                f"{(row['run_json_bytes'] or 0) / 1e6:.1f} MB | {label} | {cells} |"
            )
    print("\n| shards | code | manifest load | guards + dataset + sampler | first batch | total |")
    print("|---:|---|---:|---:|---:|---:|")
    for n, row in results["startup"].items():
        for label in labels:
            r = row[label]
            print(
                f"| {int(n):,} | {label} | {r['manifest_load_s']:.3f} | {r['prepare_s']:.3f} | "
                f"{1000 * r['first_batch_s']:.1f} ms | {r['startup_s']:.3f} |"
            )


if __name__ == "__main__":
    main()
