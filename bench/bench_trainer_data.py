"""Trainer data-path benchmarks: batch read latency, start-up cost, data wait in a CPU run.

    python bench/bench_trainer_data.py --data /work/bench-data            # all three
    python bench/bench_trainer_data.py --data DIR --only latency|startup|train

Writes synthetic shards (random GPT-2-range token ids, real shard + manifest format, made
with the pipeline's own writer) under ``--data`` -- never into the repository -- and reuses
them on later runs. Results print as Markdown rows for bench/RESULTS.md and go to
``bench/out/trainer_data.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.format import manifest as manifest_mod  # noqa: E402
from pipeline.format.shard_writer import ShardSequence  # noqa: E402

VOCAB = 50257
EOS = 50256


def synth_manifest(
    out: Path, *, tokens: int, shard_tokens: int, doc_len: tuple[int, int], vocab: int = VOCAB, seed: int = 0
) -> Path:
    """A manifest over ``tokens`` random ids below ``vocab`` in one source/split (EOS is the
    last id), shards of ``shard_tokens``."""
    path = out / manifest_mod.MANIFEST_NAME
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    seq = ShardSequence(out, "synth/train/00000", "uint16", shard_tokens)
    written, docs = 0, 0
    chunk = 1 << 24
    while written < tokens:
        n = min(chunk, tokens - written)
        lengths = rng.integers(doc_len[0], doc_len[1], size=n // doc_len[0] + 1)
        ends = np.cumsum(lengths)
        lengths = lengths[: int(np.searchsorted(ends, n, side="right"))]
        if not len(lengths):  # the tail: one last document
            lengths = np.array([n])
        n = int(lengths.sum())
        toks = rng.integers(0, vocab - 1, size=n, dtype=np.uint16)
        toks[np.cumsum(lengths) - 1] = vocab - 1
        seq.add(toks, lengths.astype(np.int32))
        written += n
        docs += len(lengths)
    return write_synth_manifest(out, seq.finish(), docs, written, vocab, {"seed": seed})


def write_synth_manifest(
    out: Path, records: list, documents: int, tokens: int, vocab: int, origin: dict
) -> Path:
    """The manifest of synthetic shards (source ``synth``, split ``train``) and a placeholder tokenizer."""
    shards = [{**r.to_json(), "source": "synth", "split": "train"} for r in records]
    tok = {"path": "tokenizer.json", "sha256": "0" * 64, "vocab_size": vocab, "eos_id": vocab - 1,
           "eos_token": "<|endoftext|>", "origin": "synthetic (bench)"}  # fmt: skip
    stats = {"documents": documents, "tokens": tokens, "shards": len(records), "partitions": 1,
             "dropped_empty": 0, "skipped": {}}  # fmt: skip
    doc = manifest_mod.build(
        recipe={"sources": {"synth": {"type": "synthetic"}}},
        recipe_hash="sha256:" + "0" * 64,
        dtype="uint16",
        tokenizer=tok,
        encoder={"name": "tokenizers", "reason": "synthetic bench data"},
        sources={"synth": {"type": "synthetic", "origin": origin, "splits": {"train": stats}}},
        shards=shards,
    )
    (out / "tokenizer.json").write_text("{}")
    return manifest_mod.write(out, doc)


def warm_page_cache(manifest: Path) -> float:
    m = manifest_mod.load(manifest)
    t0 = time.perf_counter()
    for s in m.shards:
        with open(s.bin_path, "rb") as f:
            while f.read(1 << 24):
                pass
    return time.perf_counter() - t0


def percentiles(samples_s: list[float]) -> dict[str, float]:
    us = np.array(samples_s) * 1e6
    return {
        "median_us": float(np.median(us)),
        "p90_us": float(np.percentile(us, 90)),
        "p99_us": float(np.percentile(us, 99)),
        "n": len(us),
    }


def bench_latency(manifest: Path, batch: int = 8, seq_len: int = 2048, iters: int = 20_000) -> dict:
    from trainer.data import WindowDataset
    from trainer.sampler import MixtureSampler, rank_positions

    m = manifest_mod.load(manifest)
    ds = WindowDataset(m, "train", seq_len)
    sampler = MixtureSampler(ds.sources, ds.windows, {s: 1.0 for s in ds.sources}, seed=0)
    total_bytes = sum(s.bytes for s in m.shards)
    warm_s = warm_page_cache(manifest)
    rng = np.random.default_rng(1)
    out = np.empty((batch, seq_len + 1), dtype=np.int64)
    # warm-up: open every shard's memory map once
    for w in range(0, ds.windows[0], max(1, ds.windows[0] // 256)):
        ds.batch(np.zeros(1, dtype=np.int64), np.array([w]), out=out[:1])
    read, full = [], []
    for i in range(iters):
        src = np.zeros(batch, dtype=np.int64)
        win = rng.integers(0, ds.windows[0], size=batch)
        t0 = time.perf_counter()
        ds.batch(src, win, out=out)
        read.append(time.perf_counter() - t0)
        positions = rank_positions(i * batch, 0, 0, 1, batch)
        t0 = time.perf_counter()
        d = sampler.draw(positions)
        ds.batch(d.sources, d.windows)  # what the CPU prefetch thread does: draw, fresh buffer, gather
        full.append(time.perf_counter() - t0)
    return {
        "manifest_gib": total_bytes / 2**30,
        "shards": len(m.shards),
        "batch": [batch, seq_len + 1],
        "page_cache_warm_read_s": warm_s,
        "gather": percentiles(read),
        "draw_and_gather": percentiles(full),
    }


STARTUP_CODE = """
import json, sys, time
t0 = time.perf_counter()
from pipeline.format import manifest as manifest_mod
from trainer.plan import prepare
from trainer.settings import DataSettings, ModelSettings, Packing, TrainSettings
t_import = time.perf_counter() - t0
import numpy as np
t0 = time.perf_counter()
m = manifest_mod.load(sys.argv[1])
t_load = time.perf_counter() - t0
t0 = time.perf_counter()
data = DataSettings((sys.argv[1],), seq_len=2048, packing=Packing(sys.argv[2]))
plan = prepare(TrainSettings(data, ModelSettings("opt-125m")))
t_prepare = time.perf_counter() - t0
t0 = time.perf_counter()
d = plan.data.schedule.draw(np.arange(8))
plan.data.dataset.batch(d.sources, d.windows)
t_first = time.perf_counter() - t0
print(json.dumps({"shards": len(m.shards), "tokens": sum(s.tokens for s in m.shards),
                  "documents": sum(s.documents for s in m.shards),
                  "import_s": t_import, "manifest_load_s": t_load,
                  "prepare_s": t_prepare, "first_batch_s": t_first}))
"""


def bench_startup(manifest: Path, packing: str = "none") -> dict:
    """In a fresh process: manifest load; ``trainer.plan.prepare`` (every guard incl. one stat per
    shard, dataset, sampler; with ``packing`` best-fit also every shard's .idx and the packing);
    first batch. Python/torch import time is reported apart."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", STARTUP_CODE, str(manifest), packing],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["manifest_load_s"] + r["prepare_s"] + r["first_batch_s"])
    best["startup_s"] = best["manifest_load_s"] + best["prepare_s"] + best["first_batch_s"]
    return best


def bench_train(manifest: Path, run_dir: Path, steps: int = 300) -> dict:
    """A real CPU training run (DeepSpeed, gloo); data-wait fraction from its metrics.jsonl.

    A small vocabulary keeps steps short (tens of ms), which makes the data path's share of
    each step as large as it gets on this machine: the demanding case."""
    cmd = [sys.executable, "-m", "tokshard", "train", "--manifest", str(manifest), "--model", "tiny",
           "--seq-len", "256", "--micro-batch", "8", "--steps", str(steps),
           "--log-every", "10", "--run-dir", str(run_dir)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run writes only into a folder of its own
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "loss" in x]
    fracs = [t["data_wait_frac"] for t in train]
    return {
        "command": " ".join(cmd[1:]),
        "steps": steps,
        "wall_s": wall,
        "tokens_per_s_median": float(np.median([t["tokens_per_s"] for t in train[1:]])),
        "data_wait_frac_mean": float(np.mean(fracs)),
        "data_wait_frac_max": float(np.max(fracs)),
        "data_wait_frac_first_interval": fracs[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("/work/bench-data"), help="where synthetic shards go")
    p.add_argument("--gib", type=float, default=4.0, help="size of the latency manifest")
    p.add_argument("--only", choices=["latency", "startup", "train"])
    args = p.parse_args()
    big = synth_manifest(
        args.data / f"trainer-{args.gib:g}gib", tokens=int(args.gib * 2**30) // 2, shard_tokens=1 << 27,
        doc_len=(50, 4000),
    )  # fmt: skip
    results: dict = {}
    if args.only in (None, "latency"):
        results["latency"] = bench_latency(big)
        r = results["latency"]
        print(
            f"| batch 8 x 2049 from {r['manifest_gib']:.1f} GiB ({r['shards']} shards), page cache | gather: "
            f"median {r['gather']['median_us']:.1f} us, p99 {r['gather']['p99_us']:.1f} us | draw + gather: "
            f"median {r['draw_and_gather']['median_us']:.1f} us, p99 {r['draw_and_gather']['p99_us']:.1f} us |"
        )
    if args.only in (None, "startup"):
        many = synth_manifest(args.data / "trainer-10k-shards", tokens=10_000 * 4096, shard_tokens=4096,
                              doc_len=(512, 513))  # fmt: skip
        results["startup_10k_shards"] = bench_startup(many)
        results["startup_big"] = bench_startup(big)
        for key in ("startup_10k_shards", "startup_big"):
            r = results[key]
            print(
                f"| start-up, {r['shards']} shards / {r['tokens'] / 1e6:.0f} M tokens | {r['startup_s']:.3f} s "
                f"(load {r['manifest_load_s']:.3f}, guards+dataset+sampler {r['prepare_s']:.3f}, first batch "
                f"{r['first_batch_s'] * 1e3:.1f} ms; imports {r['import_s']:.1f} s apart) |"
            )
    if args.only in (None, "train"):
        small_vocab = synth_manifest(args.data / "trainer-1gib-vocab2048", tokens=2**29, shard_tokens=1 << 27,
                                     doc_len=(50, 4000), vocab=2048)  # fmt: skip
        run_dir = args.data / "trainer-cpu-run"
        results["train"] = r = bench_train(small_vocab, run_dir)
        print(
            f"| CPU run, tiny model, 8 x 256 tokens per step, {r['steps']} steps | data wait mean {100 * r['data_wait_frac_mean']:.3f}%, max "
            f"{100 * r['data_wait_frac_max']:.3f}% of step time; {r['tokens_per_s_median']:,.0f} tok/s |"
        )
    out = ROOT / "bench" / "out" / "trainer_data.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    load = os.getloadavg()
    for r in results.values():
        r["loadavg_1m_after"] = load[0]
    out.write_text(json.dumps({**previous, **results}, indent=1))


if __name__ == "__main__":
    main()
