"""``--packing best-fit`` against plain windows: cut documents, padding, loader cost, start-up, loss.

    python bench/bench_packing.py --data /work/bench-data/packing             # everything
    python bench/bench_packing.py --data DIR --only shares|loader|startup|loss

Corpora, built under ``--data`` (never in the repository) and reused by later runs:

* ``demo``: `tokshard demo`'s corpora (WikiText, CC-News and BookCorpus look-alikes written
  by ``tokshard.demo_text``) with the demo's own 2,048-id tokenizer, prepared with its recipe;
* ``real``: the Linux kernel's Documentation and CPython's documentation (``bench/corpus.py``),
  one document per file, each distinct once, every 20th held out as the validation split,
  GPT-2's tokenizer (tests/data/gpt2);
* for start-up: ``bench_trainer_data.py``'s 10,000-shard manifest (41 M tokens of 512-token
  documents), and 10,000 shards of a million documents whose lengths follow ``real``'s.

``shares``: per corpus and window, the documents that fit a window, how many of those plain
windows cut (``seq_len`` apart, ``seq_len + 1`` long) and packed ones cut (none by design), and
the padding share of packed windows, with each source's packing time. ``loader``: what the
prefetch thread does per micro-batch (draw the positions' samples, gather them into a fresh
array), plain and packed alternating on one manifest. ``startup``: in a fresh process,
``trainer.plan.prepare`` (the manifest load, every guard, the dataset, the packing, the sampler)
+ first batch, imports apart; also with ``bench_trainer_data.bench_startup``'s own sum, which
loads the manifest a second time before ``prepare``. ``loss``: the same CPU training run
(tiny model, equal steps x batch x seq_len) plain and packed, with and without ``--doc-mask``;
validation loss per token over the same evaluation windows. Results print as Markdown rows and
go to ``bench/out/packing.json``.
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

from bench_trainer_data import bench_startup, synth_manifest, write_synth_manifest  # noqa: E402  (bench/, beside this script)

from pipeline.format import manifest as manifest_mod  # noqa: E402
from pipeline.format.shard_writer import ShardSequence  # noqa: E402

SEQS = (512, 1024, 2048)
BUFFERS = (256, 1024, 4096, 16384)


# --- corpora ----------------------------------------------------------------------------------


def demo_manifest(data: Path) -> Path:
    """`tokshard demo`'s corpus, tokenizer and prepared data (its default size), no training."""
    from tokshard import demo

    folder = demo.DemoFolder(data / "demo")
    if folder.manifest.is_file():
        return folder.manifest
    size = demo.SIZES["default"]
    demo.write_mirror(folder.mirror, size)
    demo.train_tokenizer(folder, size)
    demo.run_prepare(folder, None, log=print)
    return folder.manifest


def real_manifest(data: Path) -> Path:
    """Kernel and CPython documentation, every 20th document held out, GPT-2's tokenizer."""
    import corpus  # bench/corpus.py, beside this script

    out = data / "real"
    if (out / manifest_mod.MANIFEST_NAME).is_file():
        return out / manifest_mod.MANIFEST_NAME
    texts = corpus.documents(corpus.kernel_docs() + corpus.python_docs())
    files = data / "real-text"
    files.mkdir(parents=True, exist_ok=True)
    for split, keep in (("train", lambda i: i % 20), ("validation", lambda i: not i % 20)):
        with open(files / f"{split}.jsonl", "w") as f:
            for i, text in enumerate(texts):
                if keep(i):
                    f.write(json.dumps({"text": text}) + "\n")
    tokenizer = corpus.gpt2_tokenizer(data / "gpt2-tokenizer.json")
    recipe = files / "recipe.toml"
    recipe.write_text(
        f'tokenizer = {json.dumps(str(tokenizer))}\n[sources.docs]\ntype = "files"\n'
        f"splits = {{train = [{json.dumps(str(files / 'train.jsonl'))}], "
        f"validation = [{json.dumps(str(files / 'validation.jsonl'))}]}}\n"
    )
    run([sys.executable, "-m", "tokshard.cli", "prepare", str(recipe), "--out", str(out)])
    return out / manifest_mod.MANIFEST_NAME


def lengths_manifest(out: Path, like: Path, documents: int, shards: int) -> Path:
    """``shards`` shards of ``documents`` documents whose lengths are drawn from ``like``'s
    train documents (random ids; the real shard + manifest format)."""
    from trainer.data import WindowDataset

    path = out / manifest_mod.MANIFEST_NAME
    if path.is_file():
        return path
    real = WindowDataset(manifest_mod.load(like), "train", 1)
    pool = np.concatenate([np.diff(s.document_ends(), prepend=0) for s in real.streams])
    rng = np.random.default_rng(0)
    lengths = rng.choice(pool, size=documents).astype(np.int32)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for part in np.array_split(lengths, shards):
        seq = ShardSequence(out, f"synth/train/{len(records):05d}", "uint16", 1 << 40)
        toks = rng.integers(0, 50256, size=int(part.sum()), dtype=np.uint16)
        toks[np.cumsum(part) - 1] = 50256
        seq.add(toks, part)
        records += seq.finish()
    return write_synth_manifest(out, records, documents, int(lengths.sum()), 50257, {"lengths_of": str(like)})


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, **kw)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done


# --- shares: cut documents and padding ----------------------------------------------------------


def cut_by_windows(lengths: np.ndarray, seq_len: int) -> tuple[int, int]:
    """(documents that fit a window, those of them plain windows cut): a document occupying
    ``[a, b)`` of the stream is whole in window ``a // seq_len`` iff ``b <= that window's end``."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    fits = lengths <= seq_len + 1
    whole = ends <= (starts // seq_len) * seq_len + seq_len + 1
    return int(fits.sum()), int((fits & ~whole).sum())


def shares(name: str, manifest: Path, buffer: int) -> list[dict]:
    from trainer.data import WindowDataset
    from trainer.packing import pack

    m = manifest_mod.load(manifest)
    plain = WindowDataset(m, "train", 1)
    rows = []
    for seq in SEQS:
        row = {"corpus": name, "seq_len": seq, "buffer": buffer, "documents": 0, "fit": 0, "cut_plain": 0,
               "cut_packed": 0, "tokens": 0, "bins": 0, "pack_s": 0.0}  # fmt: skip
        for stream in plain.streams:
            lengths = np.diff(stream.document_ends(), prepend=0)
            fit, cut = cut_by_windows(lengths, seq)
            t0 = time.perf_counter()
            bins = pack(lengths, seq + 1, buffer)
            row["pack_s"] += time.perf_counter() - t0
            pieces = np.bincount(np.searchsorted(np.cumsum(lengths), bins.start, side="right"))
            row["cut_packed"] += int(((lengths <= seq + 1) & (pieces > 1)).sum())
            row["documents"] += len(lengths)
            row["fit"] += fit
            row["cut_plain"] += cut
            row["tokens"] += int(lengths.sum())
            row["bins"] += bins.count
        row["padding"] = 1 - row["tokens"] / (row["bins"] * (seq + 1))
        rows.append(row)
    return rows


def print_shares(rows: list[dict]) -> None:
    print(
        "| corpus | seq | buffer | documents | fit a window | cut by plain windows | cut packed | padding | packing time |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['corpus']} | {r['seq_len']} | {r['buffer']} | {r['documents']:,} | {r['fit'] / r['documents']:.1%} "
            f"| {r['cut_plain'] / max(r['fit'], 1):.1%} of those | {r['cut_packed']} | {r['padding']:.2%} "
            f"| {r['pack_s'] * 1e3:.0f} ms |"
        )


# --- loader cost per micro-batch ----------------------------------------------------------------


def loader(manifest: Path, seq: int, batch: int = 8, iters: int = 5000) -> dict:
    """Draw + gather per micro-batch, plain and packed alternating (same positions)."""
    from trainer.packed import open_samples
    from trainer.schedule import Schedule, token_shares, window_sources
    from trainer.settings import Packing

    m = manifest_mod.load(manifest)
    kinds = {}
    for name, packing in (("plain", Packing()), ("packed", Packing("best-fit"))):
        data = open_samples(m, "train", seq, None, packing)
        kinds[name] = (data, Schedule.fresh(window_sources(data), token_shares(data), 1337))
    for s in m.shards:  # page cache warm, as in bench_trainer_data
        s.bin_path.read_bytes()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(iters):
        positions = np.arange(i * batch, (i + 1) * batch, dtype=np.int64)
        for name, (data, schedule) in kinds.items() if i % 2 else reversed(kinds.items()):
            t0 = time.perf_counter()
            d = schedule.draw(positions)
            data.batch(d.sources, d.windows)
            times[name].append(time.perf_counter() - t0)
    out = {"seq_len": seq, "batch": batch, "iters": iters}
    for name, t in times.items():
        us = np.array(t[100:]) * 1e6
        out[name] = {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
                     "p99_us": float(np.percentile(us, 99))}  # fmt: skip
    out["ratio_median"] = out["packed"]["median_us"] / out["plain"]["median_us"]
    return out


# --- validation loss at an equal token budget ---------------------------------------------------


def train_run(manifest: Path, run_dir: Path, packing: str, doc_mask: bool, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "tokshard", "train", "--manifest", str(manifest), "--model", "tiny",
           "--seq-len", str(args.loss_seq), "--micro-batch", str(args.loss_batch), "--steps", str(args.loss_steps),
           "--lr", "3e-3", "--warmup", "20", "--eval-every", str(args.loss_steps), "--eval-samples", "64",
           "--eval-split", args.loss_eval_split, "--log-every", "10", "--run-dir", str(run_dir), "--packing", packing]  # fmt: skip
    if doc_mask:
        cmd += ["--doc-mask", "--eod-mask-loss"]
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    run(cmd)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if "eval_loss" in x]
    train = [x for x in lines if "loss" in x and "eval_loss" not in x]
    return {
        "packing": packing,
        "doc_mask": doc_mask,
        "command": " ".join(cmd[1:]),
        "wall_s": time.perf_counter() - t0,
        "eval_loss_first": evals[0]["eval_loss"],
        "eval_loss_last": evals[-1]["eval_loss"],
        "train_loss_last": float(np.mean([t["loss"] for t in train if t["loss"] is not None][-3:])),
        "tokens_per_s_median": float(np.median([t["tokens_per_s"] for t in train[1:]])),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("/work/bench-data/packing"), help="where corpora go")
    p.add_argument("--only", choices=["shares", "loader", "startup", "loss"])
    p.add_argument("--buffer", type=int, default=4096, help="documents per best-fit block")
    p.add_argument("--loss-corpus", choices=["demo", "real"], default="demo")
    p.add_argument("--loss-seq", type=int, default=256)
    p.add_argument("--loss-batch", type=int, default=16)
    p.add_argument("--loss-steps", type=int, default=300)
    p.add_argument("--loss-eval-split", default="validation")
    args = p.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    corpora = {"demo": demo_manifest(args.data), "real": real_manifest(args.data)}
    results: dict = {}
    if args.only in (None, "shares"):
        rows = [r for name, m in corpora.items() for r in shares(name, m, args.buffer)]
        rows += [
            r
            for b in BUFFERS
            if b != args.buffer
            for r in shares("real", corpora["real"], b)
            if r["seq_len"] > 512
        ]
        results["shares"] = rows
        print_shares(rows)
    if args.only in (None, "loader"):
        results["loader"] = [
            {"corpus": name, **loader(corpora[name], seq)} for name in corpora for seq in (1024, 2048)
        ]
        print("| corpus | seq | plain median (p90, p99) | packed median (p90, p99) | packed / plain |")
        print("|---|---:|---:|---:|---:|")
        for r in results["loader"]:
            a, b = r["plain"], r["packed"]
            print(f"| {r['corpus']} | {r['seq_len']} | {a['median_us']:.1f} us ({a['p90_us']:.1f}, {a['p99_us']:.1f}) | "
                  f"{b['median_us']:.1f} us ({b['p90_us']:.1f}, {b['p99_us']:.1f}) | {r['ratio_median']:.2f} |")  # fmt: skip
    if args.only in (None, "startup"):
        ten_k = synth_manifest(args.data.parent / "trainer-10k-shards", tokens=10_000 * 4096, shard_tokens=4096,
                               doc_len=(512, 513))  # fmt: skip
        real_lengths = lengths_manifest(args.data / "10k-shards-1m-docs", corpora["demo"], 1_000_000, 10_000)
        results["startup"] = []
        for manifest in (ten_k, real_lengths):
            for packing in ("none", "best-fit"):
                r = bench_startup(manifest, packing)
                r["train_start_s"] = r["prepare_s"] + r["first_batch_s"]  # prepare loads the manifest itself
                results["startup"].append({"manifest": str(manifest), "packing": packing, **r})
                print(f"| {r['shards']} shards, {r.get('documents', '?')} documents, {r['tokens'] / 1e6:.0f} M tokens "
                      f"| {packing} | {r['train_start_s']:.3f} s (prepare {r['prepare_s']:.3f}, first batch "
                      f"{r['first_batch_s'] * 1e3:.1f} ms) | {r['startup_s']:.3f} s (a second load "
                      f"{r['manifest_load_s']:.3f}) |")  # fmt: skip
    if args.only in (None, "loss"):
        manifest = corpora[args.loss_corpus]
        results["loss"] = []
        for doc_mask in (False, True):
            for packing in ("none", "best-fit"):
                tag = f"{args.loss_corpus}-{packing}{'-docmask' if doc_mask else ''}"
                r = train_run(manifest, args.data / "runs" / tag, packing, doc_mask, args)
                results["loss"].append(r)
                print(f"| {args.loss_corpus} | {packing} | {'yes' if doc_mask else 'no'} | {r['eval_loss_first']:.3f} "
                      f"-> {r['eval_loss_last']:.3f} | {r['train_loss_last']:.3f} | {r['tokens_per_s_median']:,.0f} |")  # fmt: skip
    out = ROOT / "bench" / "out" / "packing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    for value in results.values():
        for r in value:
            r["loadavg_1m_after"] = os.getloadavg()[0]
    out.write_text(json.dumps({**previous, **results}, indent=1))


if __name__ == "__main__":
    main()
