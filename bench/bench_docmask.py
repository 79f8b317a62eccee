"""Cost of ``--doc-mask`` per training step against the default causal attention.

    python bench/bench_docmask.py                      # CPU: SDPA with a dense mask
    python bench/bench_docmask.py --device cuda        # GPU: FlexAttention block mask (compiled)

One model, one optimizer, the same batches; default and ``--doc-mask`` (+ ``--eod-mask-loss``)
steps alternate so machine noise hits both alike. Windows hold documents of random lengths
(``--doc-len`` mean) separated by EOS, as a real shard does. Prints a Markdown row for
bench/RESULTS.md: median step time of each and their ratio.
"""

from __future__ import annotations

import argparse
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


def step(model, opt, tokens: torch.Tensor, doc_mask: bool, sync) -> float:
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    t0 = time.perf_counter()
    if doc_mask:
        doc = docmask.document_ids(inputs, EOS)
        loss = model(inputs, docmask.loss_targets(inputs, targets, EOS, True), doc)
    else:
        loss = model(inputs, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--doc-len", type=int, default=200, help="mean document length in tokens")
    p.add_argument("--steps", type=int, default=20, help="timed steps of each kind")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = GPTConfig(args.layers, args.heads, args.width, vocab_size=8192, block_size=args.seq)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    batches = [windows(args.batch, args.seq, cfg.vocab_size, args.doc_len, gen).to(device) for _ in range(4)]
    for b in batches[:2]:  # warm-up (and FlexAttention's compile)
        step(model, opt, b, False, sync)
        step(model, opt, b, True, sync)
    plain, masked = [], []
    for i in range(args.steps):
        b = batches[i % len(batches)]
        plain.append(step(model, opt, b, False, sync))
        masked.append(step(model, opt, b, True, sync))
    a, m = statistics.median(plain), statistics.median(masked)
    path = "FlexAttention" if docmask.flex_available(device) else "SDPA + dense mask"
    print(
        f"| {device.type} | {path} | {args.layers}x{args.width}, seq {args.seq}, batch {args.batch}, "
        f"docs ~{args.doc_len} tok | {a * 1e3:.1f} ms | {m * 1e3:.1f} ms | {m / a:.2f} |"
    )


if __name__ == "__main__":
    main()
