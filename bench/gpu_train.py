"""GPU benchmark: gpt2-124m in bf16 for 200 steps; tokens/s, model FLOPs utilization, data wait.

    python bench/gpu_train.py                            # one GPU; synthesizes a manifest
    python bench/gpu_train.py --manifest out/manifest.json --micro-batch 16
    deepspeed --num_gpus 8 bench/gpu_train.py            # every GPU of the node

It runs the real trainer (``trainer.loop.train``: memory-mapped batches, prefetch thread with
pinned memory and non-blocking copies on a side stream, DeepSpeed engine) and reads its
``metrics.jsonl``. Steps 1-20 are warm-up and left out of the numbers. MFU counts
``6 N + 12 L H T`` FLOPs per token (N: parameters without position embeddings; PaLM /
nanoGPT's estimate) against the GPU's dense bf16 peak (``--peak-tflops`` or the table below).
Results: a Markdown row on stdout and ``bench/out/gpu_train.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_trainer_data import synth_manifest, warm_page_cache  # noqa: E402
from trainer.loop import train  # noqa: E402
from trainer.model import GPT, gpt_config  # noqa: E402
from trainer.settings import DataSettings, LogSettings, ModelSettings, OptimSettings, TrainSettings  # noqa: E402

#: dense bf16 tensor-core peak, TFLOP/s (vendor data sheets, no sparsity)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}
WARMUP_STEPS = 20


def peak_tflops(name: str, given: float | None) -> float | None:
    if given:
        return given
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def flops_per_token(model: str, seq_len: int) -> float:
    cfg = gpt_config(model)
    with torch.device("meta"):
        n = GPT(cfg).num_params(non_embedding=True)
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * seq_len


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", help="a prepared manifest (default: synthesize one under --data)")
    p.add_argument("--data", type=Path, default=Path("/tmp/tokshard-gpu-bench"))
    p.add_argument("--model", default="gpt2-124m")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--deepspeed", help="a DeepSpeed config (default: ZeRO 0, bf16, AdamW, warmup + cosine)")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, if not in the table")
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (checks the script only)")
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        sys.exit("gpu_train.py: no CUDA GPU on this machine; nothing to measure")
    rank = int(os.environ.get("RANK", "0"))
    manifest = Path(args.manifest) if args.manifest else args.data / "manifest" / "manifest.json"
    if not args.manifest and rank == 0:
        synth_manifest(manifest.parent, tokens=2**28, shard_tokens=1 << 27, doc_len=(50, 4000))
    if rank == 0:
        warm_page_cache(manifest)
    # one folder per launch (the launcher's port is the same on every rank): a fresh run writes
    # only into a folder of its own
    run_dir = args.data / f"run-{os.environ.get('MASTER_PORT', 'local')}"
    if rank == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    while not manifest.is_file():  # other ranks wait for rank 0 to synthesize it
        time.sleep(1)
    train(
        TrainSettings(
            data=DataSettings(manifests=(str(manifest),), seq_len=args.seq_len),
            model=ModelSettings(name=args.model),
            optim=OptimSettings(
                deepspeed=args.deepspeed,
                steps=args.steps,
                micro_batch=args.micro_batch,
                grad_accum=args.grad_accum,
            ),
            log=LogSettings(run_dir=str(run_dir), every=10),
        )
    )
    if rank != 0:
        return
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [x for x in lines if "loss" in x and x["step"] > WARMUP_STEPS]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokens_per_s = float(np.median([x["tokens_per_s"] for x in steady]))
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    peak = peak_tflops(name, args.peak_tflops)
    fpt = flops_per_token(args.model, args.seq_len) if not args.model.startswith("hf:") else None
    mfu = fpt * tokens_per_s / (world * peak * 1e12) if (peak and fpt) else None
    result = {
        "gpu": name,
        "gpus": world,
        "model": args.model,
        "precision": "bf16" if torch.cuda.is_available() else "fp32 (CPU check run)",
        "steps": args.steps,
        "batch_per_gpu": [args.micro_batch, args.grad_accum, args.seq_len],
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / world,
        "mfu": mfu,
        "peak_tflops": peak,
        "data_wait_frac_mean": float(np.mean([x["data_wait_frac"] for x in steady])),
        "data_wait_frac_max": float(np.max([x["data_wait_frac"] for x in steady])),
        "final_loss": lines[-1].get("loss"),
        "torch": torch.__version__,
    }
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_train.json").write_text(json.dumps(result, indent=1))
    mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a (pass --peak-tflops)"
    print(
        f"| {world} x {name} | {args.model} {result['precision']}, {args.micro_batch}x{args.grad_accum}x{args.seq_len} per GPU, "
        f"{args.steps} steps | {tokens_per_s:,.0f} tok/s ({tokens_per_s / world:,.0f}/GPU) | MFU {mfu_text} | "
        f"data wait mean {100 * result['data_wait_frac_mean']:.3f}%, max {100 * result['data_wait_frac_max']:.3f}% |"
    )


if __name__ == "__main__":
    main()
