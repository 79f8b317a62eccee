"""Cost of ``--doc-mask`` per training step against the default causal attention.

    python bench/bench_docmask.py                      # CPU: SDPA with a dense mask
    python bench/bench_docmask.py --device cuda        # GPU: FlexAttention block mask (compiled)
    python bench/bench_docmask.py --device cuda --bf16 --seqs 1024,2048,4096 --compare --result flex.json

One model, one optimizer, the same batches; default and ``--doc-mask`` (+ ``--eod-mask-loss``)
steps alternate so machine noise hits both alike. Windows hold documents of random lengths
(``--doc-len`` mean) separated by EOS, as a real shard does. Prints a Markdown row for
bench/RESULTS.md: median step time of each and their ratio. ``--compare`` also computes the loss
and gradients of one batch both ways, FlexAttention and the dense SDPA mask (the path CPUs take),
with the same weights: the GPU check's proof that the two paths agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import docmask
from trainer.model import GPT, GPTConfig

EOS = 0


def windows(batch: int, seq: int, vocab: int, doc_len: int, gen: torch.Generator) -> torch.Tensor:
    """``[batch, seq + 1]`` random ids with an EOS after each document (exponential lengths)."""
    tokens = torch.randint(1, vocab, (batch, seq + 1), generator=gen)
    ends = torch.rand(batch, seq + 1, generator=gen) < 1.0 / doc_len
    return tokens.masked_fill(ends, EOS)


def masked_loss(model, tokens: torch.Tensor, flex: bool | None = None) -> torch.Tensor:
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    doc = docmask.document_ids(inputs, EOS)
    return model(inputs, docmask.loss_targets(inputs, targets, EOS, True), doc, flex)


def step(model, opt, tokens: torch.Tensor, doc_mask: bool, sync, dtype) -> float:
    t0 = time.perf_counter()
    with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = masked_loss(model, tokens) if doc_mask else model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t0


def compare_paths(model, tokens: torch.Tensor, dtype) -> dict[str, float]:
    """One batch's loss and gradients through FlexAttention and through the dense SDPA mask
    (gradients on CUDA only: FlexAttention has no backward on CPU)."""
    backward = tokens.device.type == "cuda"
    results = []
    for flex in (True, False):
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(backward):
            with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = masked_loss(model, tokens, flex)
            if backward:
                loss.backward()
        grads = [p.grad.float().flatten() for p in model.parameters() if p.grad is not None]
        results.append((loss.item(), torch.cat(grads) if grads else None))
    model.zero_grad(set_to_none=True)
    (flex_loss, g_flex), (sdpa_loss, g_sdpa) = results
    return {
        "flex_loss": flex_loss,
        "sdpa_loss": sdpa_loss,
        "loss_abs_diff": abs(flex_loss - sdpa_loss),
        "grad_rel_diff": ((g_flex - g_sdpa).norm() / g_sdpa.norm()).item() if backward else None,
    }


def measure(args, device, seq: int, dtype) -> dict:
    torch.manual_seed(0)
    cfg = GPTConfig(args.layers, args.heads, args.width, vocab_size=args.vocab, block_size=seq)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    batches = [windows(args.batch, seq, cfg.vocab_size, args.doc_len, gen).to(device) for _ in range(4)]
    row = {"seq": seq, "path": "FlexAttention" if docmask.flex_available(device) else "SDPA + dense mask"}
    if args.compare:
        row.update(compare_paths(model, batches[0], dtype))
    for b in batches[:2]:  # warm-up (and FlexAttention's compile)
        step(model, opt, b, False, sync, dtype)
        step(model, opt, b, True, sync, dtype)
    plain, masked = [], []
    for i in range(args.steps):
        b = batches[i % len(batches)]
        plain.append(step(model, opt, b, False, sync, dtype))
        masked.append(step(model, opt, b, True, sync, dtype))
    row.update(causal_ms=1e3 * statistics.median(plain), doc_mask_ms=1e3 * statistics.median(masked))
    row["ratio"] = row["doc_mask_ms"] / row["causal_ms"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seqs", default="512", help="sequence lengths, comma-separated")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--doc-len", type=int, default=200, help="mean document length in tokens")
    p.add_argument("--steps", type=int, default=20, help="timed steps of each kind")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast, as training on a GPU runs")
    p.add_argument(
        "--compare", action="store_true", help="also FlexAttention against the dense mask, one batch"
    )
    p.add_argument("--result", type=Path, help="write the rows as JSON here")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    rows = []
    for seq in (int(x) for x in args.seqs.split(",")):
        r = measure(args, device, seq, dtype)
        rows.append(r)
        cmp = (
            f" | loss {r['flex_loss']:.5f} vs {r['sdpa_loss']:.5f}, grads {r['grad_rel_diff']}"
            if args.compare
            else ""
        )
        print(
            f"| {device.type} | {r['path']} | {args.layers}x{args.width}, seq {seq}, batch {args.batch}, "
            f"docs ~{args.doc_len} tok | {r['causal_ms']:.1f} ms | {r['doc_mask_ms']:.1f} ms | {r['ratio']:.2f}{cmp} |",
            flush=True,
        )
    if args.result:
        args.result.write_text(json.dumps({"dtype": str(dtype), "batch": args.batch, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
