"""The Python steps of bench/gpu_check.sh (the one-call GPU check); each is a subcommand.

    manifest   real-text manifest from carried JSON lines: GPT-2 BPE (tokenizers), the
               pipeline's own shard writer and manifest (no Dask: the GPU image has none)
    probe      the largest micro-batch that fits, and its step time (one engine, growing batches)
    nanogpt    the same model, config and step with nanoGPT's get_batch (np.memmap per batch,
               random offsets, from_numpy, pin, non-blocking copy), per-step timings
    loader     tokshard's Prefetcher alone, drained as fast as it fills: samples/s per rank
    cpu-adam   time DeepSpeed's CPUAdam build (JIT) in a fresh extensions folder
    env        GPU, driver, versions, the exact command
    without-fp16  a DeepSpeed config with fp16 off (the CPU dry run's fp16 recipe)
    synth      a random-id manifest with a 2048-id vocabulary (the starved run's data)
    shrink     a small copy of a shipped Transformers config (the CPU dry run's seeds)
    report     everything the steps wrote -> summary.json and summary.md

Every step writes one JSON file into the work folder; ``report`` reads them all, so a step
that failed (or timed out) shows as missing rather than stopping the others.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = "pydocs"
GPT2_FILES = ROOT / "tests" / "data" / "gpt2"


# ---------------------------------------------------------------- manifest


def read_texts(path: Path) -> list[str]:
    """Documents of a JSON-lines file (optionally gzipped), field ``text``, non-blank only."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    return [t for t in texts if t.strip()]


def encode_split(encoder, texts: list[str], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts``, each followed by EOS, and the per-document lengths."""
    ids = encoder.encode_batch(texts)
    lengths = np.array([len(x) + 1 for x in ids], dtype=np.int32)
    flat = np.fromiter((t for doc in ids for t in (*doc, eos_id)), dtype=np.uint16, count=int(lengths.sum()))
    return flat, lengths


def build_manifest(text: Path, out: Path, validation_every: int = 20, threads: int = 0) -> Path:
    """A one-source manifest (train + validation, every ``validation_every``-th document held
    out) in exactly the format ``tokshard prepare`` writes."""
    from pipeline.encoding.backend import TokenizersEncoder
    from pipeline.encoding.tokenizer import from_gpt2_files, inspect_file, install
    from pipeline.format import manifest as manifest_mod
    from pipeline.format.shard_writer import ShardSequence

    out.mkdir(parents=True, exist_ok=True)
    tok_src = from_gpt2_files(GPT2_FILES / "encoder.json", GPT2_FILES / "vocab.bpe", out / "gpt2-src.json")
    info = inspect_file(tok_src, "gpt2 (tests/data/gpt2)", None, "uint16")
    install(tok_src, info, out)
    tok_src.unlink()
    encoder = TokenizersEncoder(str(out / "tokenizer.json"), threads=threads or os.cpu_count() or 1)
    docs = read_texts(text)
    splits = {
        "train": [d for i, d in enumerate(docs) if i % validation_every],
        "validation": [d for i, d in enumerate(docs) if not i % validation_every],
    }
    shards, stats = [], {}
    for split, texts in splits.items():
        flat, lengths = encode_split(encoder, texts, info.eos_id)
        seq = ShardSequence(out, f"{SOURCE}/{split}/00000", "uint16", 1 << 27)
        seq.add(flat, lengths)
        records = seq.finish()
        shards += [{**r.to_json(), "source": SOURCE, "split": split} for r in records]
        stats[split] = {"documents": len(texts), "tokens": int(flat.size), "shards": len(records),
                        "partitions": 1, "dropped_empty": 0, "skipped": {}}  # fmt: skip
    origin = {"files": [text.name], "note": "built on the device by bench/gpu_check.py manifest"}
    doc = manifest_mod.build(
        recipe={"sources": {SOURCE: {"type": "files", "paths": [text.name]}}},
        recipe_hash="sha256:" + "0" * 64,
        dtype="uint16",
        tokenizer=info.to_json(),
        encoder={"name": encoder.name, "reason": "bench/gpu_check.py", "threads": threads},
        sources={SOURCE: {"type": "files", "origin": origin, "splits": stats}},
        shards=shards,
    )
    return manifest_mod.write(out, doc)


# ---------------------------------------------------------------- engine helpers


def train_args(a: argparse.Namespace, micro: int, steps: int):
    """The settings ``tokshard train`` would get from the same flags."""
    from trainer.settings import DataSettings, LogSettings, ModelSettings, OptimSettings, TrainSettings

    return TrainSettings(
        data=DataSettings(manifests=(a.manifest,), seq_len=a.seq_len),
        model=ModelSettings(name=a.model, vocab_size=a.vocab_size),
        optim=OptimSettings(deepspeed=a.deepspeed, steps=steps, micro_batch=micro),
        log=LogSettings(every=1),
    )


def engine_for(settings):
    """The engine ``tokshard train`` builds for ``settings`` (same guards, config and model)."""
    from trainer import distributed
    from trainer.engine import build_engine
    from trainer.plan import prepare

    plan = prepare(settings)
    dist = distributed.init(plan.cuda)
    engine, config, _ = build_engine(plan, dist)
    return plan, dist, engine, config


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- probe


def probe(a: argparse.Namespace) -> dict[str, Any]:
    """Grow the micro-batch on one engine until it runs out of memory (or the list ends); the
    chosen one is the largest that fits whose ``--steps`` also fit in ``--budget-s``."""
    import torch

    candidates = [int(x) for x in a.candidates.split(",")]
    plan, dist, engine, _ = engine_for(train_args(a, candidates[0], a.steps))
    vocab = plan.model.limits.vocab_size
    rows = []
    for micro in candidates:
        try:
            step_s = time_steps(engine, dist.device, micro, a.seq_len, vocab, repeats=a.repeats)
        except torch.OutOfMemoryError:
            rows.append({"micro_batch": micro, "fits": False})
            engine.zero_grad()
            torch.cuda.empty_cache()
            break
        peak = torch.cuda.max_memory_allocated(dist.device) / 2**30 if dist.device.type == "cuda" else None
        rows.append({"micro_batch": micro, "fits": True, "step_s": step_s, "peak_gib": peak,
                     "tokens_per_s": micro * a.seq_len / step_s})  # fmt: skip
        print(f"probe: micro-batch {micro}: {step_s * 1e3:.1f} ms/step", flush=True)
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        raise SystemExit("probe: not even the smallest micro-batch fits")
    in_budget = [r for r in fitting if r["step_s"] * a.steps <= a.budget_s] or fitting[:1]
    return {"candidates": candidates, "rows": rows, "largest_fitting": fitting[-1]["micro_batch"],
            "oom_at": next((r["micro_batch"] for r in rows if not r["fits"]), None),
            "chosen": in_budget[-1]["micro_batch"], "budget_s": a.budget_s, "steps": a.steps}  # fmt: skip


def time_steps(engine, device, micro: int, seq_len: int, vocab: int, repeats: int) -> float:
    """Median seconds of a full training step (forward, backward, optimizer) on random ids."""
    import torch

    x = torch.randint(0, vocab, (micro, seq_len), device=device)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()
        synchronize(device)
        if i:  # the first one allocates
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


# ---------------------------------------------------------------- nanoGPT baseline


def nanogpt_bin(manifest_path: str, split: str = "train") -> Path:
    """The largest train shard: nanoGPT reads one flat ``train.bin`` of uint16 ids."""
    from pipeline.format import manifest as manifest_mod

    m = manifest_mod.load(manifest_path)
    return max(m.select(None, split), key=lambda e: e.tokens).bin_path


def get_batch(path: Path, micro: int, seq_len: int, device, generator):
    """nanoGPT's ``get_batch`` (train.py), unchanged in substance: a fresh memmap per batch
    (it leaks memory otherwise), random offsets, per-row from_numpy, pin, non-blocking copy."""
    import torch

    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - seq_len, (micro,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i : i + seq_len].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix])
    if device.type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def nanogpt(a: argparse.Namespace) -> dict[str, Any]:
    """Train ``--steps`` steps with nanoGPT's loader on tokshard's engine; one record per step,
    timed like tokshard's loop (the loss is read every step, as ``--log-every 1`` does)."""
    import torch

    _, dist, engine, config = engine_for(train_args(a, a.micro_batch, a.steps))
    path = nanogpt_bin(a.manifest)
    gen = torch.Generator().manual_seed(1337)
    micro, tokens = a.micro_batch, a.micro_batch * a.seq_len
    records = []
    x, y = get_batch(path, micro, a.seq_len, dist.device, gen)
    synchronize(dist.device)
    t_last = t_begin = time.perf_counter()
    for step in range(1, a.steps + 1):
        loss = engine(x, y)
        t0 = time.perf_counter()
        x, y = get_batch(path, micro, a.seq_len, dist.device, gen)  # overlaps the forward, as nanoGPT does
        data_s = time.perf_counter() - t0
        engine.backward(loss)
        engine.step()
        loss_value = float(loss.detach().float().item())
        now = time.perf_counter()
        records.append({"step": step, "loss": loss_value, "tokens_per_s": tokens / (now - t_last),
                        "data_s": data_s, "data_wait_frac": data_s / (now - t_last),
                        "elapsed_s": now - t_begin})  # fmt: skip
        t_last = now
    Path(a.metrics).write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"bin": str(path), "micro_batch": micro, "seq_len": a.seq_len, "steps": a.steps,
            "precision": precision_of(config)}  # fmt: skip


def precision_of(config: dict) -> str:
    from trainer import ds_config

    return ds_config.precision(config)


# ---------------------------------------------------------------- loader ceiling


def loader(a: argparse.Namespace) -> dict[str, Any]:
    """tokshard's Prefetcher (sampler, memmap gather, pinned buffer, copy on a side stream)
    with no training at all: the samples/s one rank's loader can deliver at most."""
    import torch

    from pipeline.format import manifest as manifest_mod
    from trainer.data import WindowDataset
    from trainer.prefetch import Prefetcher
    from trainer.sampler import MixtureSampler, rank_positions

    m = manifest_mod.load(a.manifest)
    ds = WindowDataset(m, "train", a.seq_len)
    sampler = MixtureSampler(ds.sources, ds.windows, {s: 1.0 for s in ds.sources}, seed=1337)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rows = []
    for micro in (int(x) for x in a.micro_batches.split(",")):
        plan = (rank_positions(i * micro, 0, 0, 1, micro) for i in range(a.batches + 5))
        pre = Prefetcher(ds, sampler, plan, device, depth=4)
        for _ in range(5):  # warm: pinned buffer, stream, first pages
            next(pre)
        t0 = time.perf_counter()
        n = sum(1 for _ in pre)
        synchronize(device)
        elapsed = time.perf_counter() - t0
        pre.close()
        rows.append({"micro_batch": micro, "batches": n, "samples_per_s": n * micro / elapsed,
                     "tokens_per_s": n * micro * a.seq_len / elapsed, "batch_us": 1e6 * elapsed / n})  # fmt: skip
        print(f"loader: micro-batch {micro}: {rows[-1]['samples_per_s']:,.0f} samples/s", flush=True)
    return {"device": str(device), "seq_len": a.seq_len, "rows": rows}


# ---------------------------------------------------------------- CPUAdam build


def cpu_adam(a: argparse.Namespace) -> dict[str, Any]:
    """Build (JIT) and load DeepSpeed's CPUAdam op the way ZeRO offload does, timed; the
    extensions folder is fresh (TORCH_EXTENSIONS_DIR), so this is the first-run cost."""
    from deepspeed.accelerator import get_accelerator

    t0 = time.perf_counter()
    get_accelerator().create_op_builder("CPUAdamBuilder").load()
    return {
        "build_and_load_s": time.perf_counter() - t0,
        "extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR"),
    }


# ---------------------------------------------------------------- shrink


def shrink(a: argparse.Namespace) -> dict[str, Any]:
    """A shipped Transformers config with fewer, narrower layers: the same architecture (and
    code path) at a size two CPU cores train in seconds."""
    cfg = json.loads((ROOT / "trainer" / "configs" / "models" / f"{a.config}.json").read_text())
    small = {"num_layers": 2, "num_hidden_layers": 2, "hidden_size": 64, "word_embed_proj_dim": 64,
             "ffn_dim": 256, "intermediate_size": 256, "num_attention_heads": 2, "num_heads": 2}  # fmt: skip
    for key, value in small.items():
        if key in cfg and cfg[key] is not None:
            cfg[key] = value
    if "attention_types" in cfg:  # GPT-Neo: one attention kind per layer, alternating
        cfg["attention_types"] = [[["global", "local"], 1]]
        cfg.pop("attention_layers", None)
    Path(a.out).write_text(json.dumps(cfg, indent=1))
    return {"config": a.config, "out": a.out}


# ---------------------------------------------------------------- env, fp32 config


def env(a: argparse.Namespace) -> dict[str, Any]:
    """GPU, driver and library versions, and the command that ran: the results' provenance."""
    import importlib.metadata as md
    import platform
    import subprocess

    import torch

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "missing"

    cuda = torch.cuda.is_available()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if cuda else None  # fmt: skip
    return {
        "gpu": torch.cuda.get_device_name() if cuda else "CPU (dry run)",
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
        "driver": smi.stdout.strip() if smi and smi.returncode == 0 else "n/a",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deepspeed": version("deepspeed"),
        "transformers": version("transformers"),
        "tokenizers": version("tokenizers"),
        "numpy": version("numpy"),
        "pydantic": version("pydantic"),
        "cpus": os.cpu_count(),
        "command": a.command,
        "commit": a.commit,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def without_fp16(a: argparse.Namespace) -> dict[str, Any]:
    """A DeepSpeed config with fp16 turned off, the rest as shipped: fp16 needs a GPU, so the
    CPU dry run trains the fp16 recipe in fp32 (everything else, offload included, unchanged)."""
    cfg = json.loads(Path(a.config).read_text())
    cfg["fp16"] = {**cfg.get("fp16", {}), "enabled": False}
    Path(a.out).write_text(json.dumps(cfg, indent=1))
    return {"config": a.config, "out": a.out}


def synth(a: argparse.Namespace) -> dict[str, Any]:
    """Random ids below a small vocabulary (2048): with the ``tiny`` model at that width the
    step is shorter than the loader's batch, so the starved run finds the loader's limit (a
    real GPT-2 vocabulary's output layer alone outlasts the loader on one GPU)."""
    from bench.bench_trainer_data import synth_manifest

    path = synth_manifest(
        Path(a.out), tokens=a.tokens, shard_tokens=1 << 27, doc_len=(50, 4000), vocab=a.vocab
    )
    return {"manifest": str(path), "tokens": a.tokens, "vocab": a.vocab}


# ---------------------------------------------------------------- report


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def step_stats(records: list[dict[str, Any]], warmup: int, tokens_per_step: int) -> dict[str, Any] | None:
    """Throughput and data wait over the steps after ``warmup`` (one record per step)."""
    steady = [r for r in records if "loss" in r and r["step"] > warmup]
    if len(steady) < 2:
        return None
    wait = np.array([r["data_wait_frac"] for r in steady])
    span = steady[-1]["elapsed_s"] - steady[0]["elapsed_s"]
    return {
        "steps_measured": len(steady),
        "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in steady])),
        "tokens_per_s_overall": tokens_per_step * (len(steady) - 1) / span if span > 0 else None,
        "step_ms_median": 1e3 * tokens_per_step / float(np.median([r["tokens_per_s"] for r in steady])),
        "data_wait_median": float(np.median(wait)),
        "data_wait_p99": float(np.percentile(wait, 99)),
        "data_wait_max": float(wait.max()),
        "final_loss": steady[-1]["loss"],
    }


def load_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def mfu(model: str, seq_len: int, tokens_per_s: float | None, gpu: str) -> float | None:
    if not tokens_per_s or model.startswith("hf:"):
        return None
    from bench.gpu_train import flops_per_token, peak_tflops

    peak = peak_tflops(gpu, None)
    return flops_per_token(model, seq_len) * tokens_per_s / (peak * 1e12) if peak else None


def report(a: argparse.Namespace) -> dict[str, Any]:
    """Gather the steps' files from ``--work`` into one summary (JSON + Markdown)."""
    work, out = Path(a.work), Path(a.out)
    env = load_json(work / "env.json") or {}
    steps = {r["name"]: r for r in read_jsonl(work / "steps.jsonl")}
    gpu = env.get("gpu", "CPU")
    probe_r = load_json(work / "probe.json")
    micro = int(a.micro_batch)
    tokens_per_step = micro * a.seq_len
    warmup = a.warmup
    tok = step_stats(read_jsonl(out / "train-metrics.jsonl"), warmup, tokens_per_step)
    nano = step_stats(read_jsonl(out / "nanogpt-metrics.jsonl"), warmup, tokens_per_step)
    starved = step_stats(read_jsonl(out / "starved-metrics.jsonl"), max(1, warmup // 4),
                         a.starved_micro * a.seq_len)  # fmt: skip
    if starved:
        starved["samples_per_s_median"] = starved["tokens_per_s_median"] / a.seq_len
    for stats in (tok, nano):
        if stats:
            stats["mfu"] = mfu(a.model, a.seq_len, stats["tokens_per_s_median"], gpu)
    ratio = None
    if tok and nano:
        ratio = {
            "tokens_per_s_median": tok["tokens_per_s_median"] / nano["tokens_per_s_median"],
            "tokens_per_s_overall": (tok["tokens_per_s_overall"] or 0) / (nano["tokens_per_s_overall"] or 1),
        }
    seeds = {name: seed_result(work, out, name, steps) for name in ("zero3-opt", "zero2-neo")}
    summary = {
        "env": env,
        "mode": a.mode,
        "steps": steps,
        "model": a.model,
        "seq_len": a.seq_len,
        "micro_batch": micro,
        "warmup_steps_left_out": warmup,
        "probe": probe_r,
        "tokshard": tok,
        "nanogpt": nano,
        "tokshard_over_nanogpt": ratio,
        "targets": targets(tok, ratio),
        "loader": load_json(work / "loader.json"),
        "starved": starved,
        "cpu_adam": load_json(work / "cpu-adam.json"),
        "seeds": seeds,
        "model_side": model_side(a, work, gpu),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    print((out / "summary.md").read_text())
    return summary


def run_stats(work: Path, name: str, a: argparse.Namespace, micro: int, gpu: str) -> dict[str, Any] | None:
    """A run kept under WORK: its steady-state figures, MFU, and the first step's extra time
    (with --compile: the compiler's)."""
    records = [r for r in read_jsonl(work / "runs" / name / "metrics.jsonl") if "loss" in r]
    stats = step_stats(records, a.warmup, micro * a.seq_len)
    if not stats:
        return None
    stats["mfu"] = mfu(a.model, a.seq_len, stats["tokens_per_s_median"], gpu)
    stats["first_step_extra_s"] = records[0]["elapsed_s"] - stats["step_ms_median"] / 1e3
    for key in ("padding_frac", "padding_share"):  # packed runs, where the trainer logs it
        values = [r[key] for r in records if key in r]
        if values:
            stats[key] = float(np.mean(values))
    return stats


def model_side(a: argparse.Namespace, work: Path, gpu: str) -> dict[str, Any]:
    """Issue 34: eager against --compile per micro-batch, FlexAttention against the dense mask,
    and packed batches beside the default windows."""
    compile_rows = []
    for mb in (int(x) for x in a.compile_micros.split()):
        eager, compiled = (run_stats(work, f"compile-{k}-{mb}", a, mb, gpu) for k in ("eager", "on"))
        speedup = None
        if eager and compiled:
            speedup = compiled["tokens_per_s_median"] / eager["tokens_per_s_median"]
        compile_rows.append({"micro_batch": mb, "eager": eager, "compiled": compiled, "speedup": speedup})
    mfus = [r["compiled"]["mfu"] for r in compile_rows if r["compiled"] and r["compiled"]["mfu"] is not None]
    best = max(mfus, default=None)
    return {
        "compile": compile_rows,
        "compile_mfu_best": best,
        "compile_target_45pct_mfu": None if best is None else best >= 0.45,
        "flex": load_json(work / "flex.json"),
        "packed": run_stats(work, "packed", a, a.micro_batch, gpu),
    }


def targets(tok: dict | None, ratio: dict | None) -> dict[str, Any]:
    """The issue's two pass/fail lines: not slower than nanoGPT, data wait under 1%."""
    return {
        "not_slower_than_nanogpt": None if ratio is None else ratio["tokens_per_s_median"] >= 0.99,
        "data_wait_median_under_1pct": None if tok is None else tok["data_wait_median"] < 0.01,
    }


def seed_result(work: Path, out: Path, name: str, steps: dict) -> dict[str, Any]:
    """A seed configuration's outcome: its step's exit status and its per-step times."""
    rec = read_jsonl(out / f"{name}-metrics.jsonl")
    train = [r for r in rec if "loss" in r]
    times = np.diff([0.0] + [r["elapsed_s"] for r in train]) if train else []
    return {
        "status": steps.get(name, {}).get("status", "not run"),
        "seconds": steps.get(name, {}).get("seconds"),
        "steps_done": len(train),
        "step_s": [float(t) for t in times],
        "step_s_after_first": float(np.median(times[1:])) if len(times) > 1 else None,
        "losses": [r["loss"] for r in train],
    }


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.3f}%"


def num(x: float | None, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(s: dict[str, Any]) -> str:
    env = s["env"]
    lines = [
        f"# GPU check ({s['mode']})",
        "",
        f"GPU: {env.get('gpu', 'n/a')}; driver {env.get('driver', 'n/a')}; Python {env.get('python', 'n/a')}; "
        f"torch {env.get('torch', 'n/a')} (CUDA {env.get('cuda', 'n/a')}); deepspeed {env.get('deepspeed', 'n/a')}; "
        f"transformers {env.get('transformers', 'n/a')}; {env.get('cpus', '?')} CPUs",
        "",
        "| step | status | seconds |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {k} | {v['status']} | {num(v.get('seconds'), '.1f')} |" for k, v in s["steps"].items()]
    p = s["probe"]
    if p:
        lines += ["", f"Micro-batch probe ({s['model']}, seq {s['seq_len']}): largest fitting "
                  f"{p['largest_fitting']} (out of memory at {p['oom_at']}), chosen {p['chosen']} "
                  f"(the largest whose {p['steps']} steps fit {p['budget_s']} s)", "",
                  "| micro-batch | fits | step ms | tokens/s | peak GiB |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in p["rows"]:
            lines.append(f"| {r['micro_batch']} | {r['fits']} | {num(r.get('step_s') and 1e3 * r['step_s'], '.1f')} | "
                         f"{num(r.get('tokens_per_s'))} | {num(r.get('peak_gib'), '.1f')} |")  # fmt: skip
    lines += ["", f"Training, {s['model']}, micro-batch {s['micro_batch']} x seq {s['seq_len']}, steps after "
              f"{s['warmup_steps_left_out']} (warm-up left out):", "",
              "| loader | tokens/s (median step) | tokens/s (overall) | step ms | MFU | data wait median | p99 | max | final loss |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name in ("tokshard", "nanogpt"):
        t = s[name]
        if t:
            lines.append(f"| {name} | {num(t['tokens_per_s_median'])} | {num(t['tokens_per_s_overall'])} | "
                         f"{num(t['step_ms_median'], '.1f')} | {pct(t['mfu'])} | {pct(t['data_wait_median'])} | "
                         f"{pct(t['data_wait_p99'])} | {pct(t['data_wait_max'])} | {num(t['final_loss'], '.3f')} |")  # fmt: skip
        else:
            lines.append(f"| {name} | failed or not run | | | | | | | |")
    lines += ["", "(nanoGPT's data wait is its main thread's time in get_batch, which overlaps the forward "
              "pass's GPU work; tokshard's is the trainer's own: time blocked on the prefetch queue.)"]  # fmt: skip
    r = s["tokshard_over_nanogpt"]
    if r:
        lines += ["", f"tokshard / nanoGPT tokens/s: {r['tokens_per_s_median']:.3f} (median step), "
                  f"{r['tokens_per_s_overall']:.3f} (overall). Targets: {s['targets']}"]  # fmt: skip
    if s["loader"]:
        lines += [
            "",
            f"Loader alone (Prefetcher on {s['loader']['device']}, seq {s['loader']['seq_len']}):",
            "",
        ]
        lines += [f"- micro-batch {x['micro_batch']}: {num(x['samples_per_s'])} samples/s per rank "
                  f"({num(x['tokens_per_s'])} tokens/s, {num(x['batch_us'], '.0f')} us a batch)" for x in s["loader"]["rows"]]  # fmt: skip
    if s["starved"]:
        st = s["starved"]
        lines += ["", f"Starved run: {num(st['samples_per_s_median'])} samples/s per rank (median step), data wait "
                  f"median {pct(st['data_wait_median'])}, p99 {pct(st['data_wait_p99'])}, max {pct(st['data_wait_max'])}"]  # fmt: skip
    if s["cpu_adam"]:
        lines += ["", f"CPUAdam JIT build + load: {s['cpu_adam']['build_and_load_s']:.1f} s"]
    lines += [
        "",
        "| seed configuration | status | steps | step s (after the first) | wall s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, v in s["seeds"].items():
        lines.append(f"| {name} | {v['status']} | {v['steps_done']} | {num(v['step_s_after_first'], '.2f')} | "
                     f"{num(v['seconds'], '.1f')} |")  # fmt: skip
    return "\n".join(lines + model_side_markdown(s["model_side"])) + "\n"


def model_side_markdown(m: dict[str, Any]) -> list[str]:
    lines = ["", "Model side (issue 34): eager against --compile, steps after the warm-up:", "",
             "| micro-batch | eager tokens/s | eager MFU | compiled tokens/s | compiled MFU | speed-up | "
             "compile s (first step's extra) | data wait (compiled, median) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in m["compile"]:
        e, c = r["eager"] or {}, r["compiled"] or {}
        lines.append(f"| {r['micro_batch']} | {num(e.get('tokens_per_s_median'))} | {pct(e.get('mfu'))} | "
                     f"{num(c.get('tokens_per_s_median'))} | {pct(c.get('mfu'))} | {num(r['speedup'], '.2f')} | "
                     f"{num(c.get('first_step_extra_s'), '.1f')} | {pct(c.get('data_wait_median'))} |")  # fmt: skip
    lines += [
        "",
        f"Best compiled MFU: {pct(m['compile_mfu_best'])} (target 45%: {m['compile_target_45pct_mfu']})",
    ]
    if m["flex"]:
        lines += ["", f"--doc-mask, FlexAttention against the dense SDPA mask ({m['flex']['dtype']}, batch "
                  f"{m['flex']['batch']}):", "",
                  "| seq | path | loss flex | loss SDPA | grad rel. diff | causal ms | doc-mask ms | ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in m["flex"]["rows"]:
            lines.append(f"| {r['seq']} | {r['path']} | {num(r.get('flex_loss'), '.5f')} | "
                         f"{num(r.get('sdpa_loss'), '.5f')} | {num(r.get('grad_rel_diff'), '.2e')} | "
                         f"{num(r['causal_ms'], '.1f')} | {num(r['doc_mask_ms'], '.1f')} | {num(r['ratio'], '.2f')} |")  # fmt: skip
    p = m["packed"]
    if p:
        lines += ["", f"Packed (--packing best-fit --doc-mask): {num(p['tokens_per_s_median'])} tokens/s, data wait "
                  f"median {pct(p['data_wait_median'])}, padding {pct(p.get('padding_frac', p.get('padding_share')))}"]  # fmt: skip
    return lines


# ---------------------------------------------------------------- main


def write_result(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=1))


def model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", required=True)
    p.add_argument("--model", default="gpt2-124m")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--deepspeed")
    p.add_argument("--steps", type=int, default=300)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("--text", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    pr = sub.add_parser("probe")
    model_flags(pr)
    pr.add_argument("--candidates", default="8,16,32,64,128,256")
    pr.add_argument("--budget-s", type=float, default=75.0)
    pr.add_argument("--repeats", type=int, default=3)
    n = sub.add_parser("nanogpt")
    model_flags(n)
    n.add_argument("--micro-batch", type=int, required=True)
    n.add_argument("--metrics", required=True)
    lo = sub.add_parser("loader")
    lo.add_argument("--manifest", required=True)
    lo.add_argument("--seq-len", type=int, default=1024)
    lo.add_argument("--micro-batches", default="16,64,256")
    lo.add_argument("--batches", type=int, default=200)
    sub.add_parser("cpu-adam")
    e = sub.add_parser("env")
    e.add_argument("--command", default="")
    e.add_argument("--commit", default="n/a")
    nf = sub.add_parser("without-fp16")
    nf.add_argument("--config", required=True)
    nf.add_argument("--out", required=True)
    sy = sub.add_parser("synth")
    sy.add_argument("--out", required=True)
    sy.add_argument("--tokens", type=int, default=1 << 24)
    sy.add_argument("--vocab", type=int, default=2048)
    sh = sub.add_parser("shrink")
    sh.add_argument("--config", required=True)
    sh.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--mode", default="gpu")
    r.add_argument("--model", default="gpt2-124m")
    r.add_argument("--seq-len", type=int, default=1024)
    r.add_argument("--micro-batch", type=int, required=True)
    r.add_argument("--starved-micro", type=int, required=True)
    r.add_argument("--warmup", type=int, default=20)
    r.add_argument(
        "--compile-micros", default="", help="the micro-batches of the compile runs, space-separated"
    )
    for sp in (pr, n, lo, sub.choices["cpu-adam"], sh, e, nf, sy):
        sp.add_argument("--result", help="write the step's result here (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.cmd == "manifest":
        print(build_manifest(a.text, a.out))
        return 0
    if a.cmd == "report":
        report(a)
        return 0
    steps = {"probe": probe, "nanogpt": nanogpt, "loader": loader, "cpu-adam": cpu_adam, "shrink": shrink,
             "env": env, "without-fp16": without_fp16, "synth": synth}  # fmt: skip
    step = steps[a.cmd]
    result = step(a)
    write_result(a.result, result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
