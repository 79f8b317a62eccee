"""``tokshard train``: its options, and the run they start (``trainer.loop``).

``main(argv)`` is what ``tokshard train ...`` dispatches to, and what ``python -m trainer``,
``deepspeed --module trainer`` and ``torchrun -m trainer`` run (``trainer/__main__.py``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from tokshard.usage import (
    OneLineParser,
    file_arg,
    folder_arg,
    non_negative,
    non_negative_float,
    path_arg,
    positive_float,
    positive_int,
    size_arg,
)
from trainer.loop import DEFAULT_SEED, TrainArgs
from trainer.model import SIZES

EXAMPLES = """\
examples:
  # one process (CPU, or one GPU)
  tokshard train --manifest out/manifest.json --model gpt2-124m --steps 2000 --save ckpt
  # one node, 8 GPUs, a DeepSpeed config
  deepspeed --num_gpus 8 --module trainer --manifest out/manifest.json \\
      --deepspeed trainer/configs/zero2-bf16.json --save ckpt --eval-every 200
  # torchrun works the same way
  torchrun --nproc_per_node 8 -m trainer --manifest out/manifest.json --save ckpt
  # continue after a crash or a time limit: the exact next samples, any number of ranks
  deepspeed --num_gpus 4 --module trainer --manifest out/manifest.json --save ckpt --resume
"""


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="tokshard train",
        description="Train a GPT-style model with DeepSpeed on a prepared manifest; batches are "
        "memory-mapped from the shards and prepared ahead on a background thread.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = TrainArgs(manifest="")
    data = p.add_argument_group("data")
    data.add_argument(
        "--manifest",
        required=True,
        action="append",
        type=path_arg,
        help="manifest.json, or the folder holding it, or its URL (s3://bucket/run/manifest.json: "
        "shards then go through --data-cache); repeat it to train on the sources of several "
        "prepared folders (one tokenizer, source names unique across them)",
    )
    data.add_argument(
        "--data-cache",
        metavar="DIR",
        type=folder_arg,
        help="node-local folder for the shards of a manifest URL, shared by the node's ranks and jobs "
        "(default ~/.cache/tokshard/data)",
    )
    data.add_argument(
        "--data-cache-limit",
        metavar="SIZE",
        type=size_arg,
        help="keep the data cache under SIZE (e.g. 500GB): least recently used shards no running job "
        "maps are evicted (default: no limit)",
    )
    data.add_argument(
        "--seq-len", type=positive_int, default=d.seq_len, help="tokens per sample (default %(default)s)"
    )
    data.add_argument(
        "--mix", metavar="SRC=W,...", help="mixture weights per source (default: by token count)"
    )
    data.add_argument("--train-split", default=d.train_split, help="split to train on (default %(default)s)")
    data.add_argument(
        "--seed",
        type=non_negative,
        help=f"sample order and model init (default {DEFAULT_SEED}; a resume keeps the checkpoint's)",
    )
    data.add_argument("--verify", action="store_true", help="re-hash every shard before training")

    model = p.add_argument_group("model")
    model.add_argument(
        "--model", default=d.model,
        help=f"{', '.join(SIZES)}, or hf:CONFIG for a Transformers causal LM built from a config "
        "(hub name, folder, config.json, or one shipped: hf:opt-125m, hf:opt-350m, hf:gpt-neo-2.7b; "
        "needs tokshard[transformers]) (default %(default)s)",
    )  # fmt: skip
    model.add_argument(
        "--vocab-size",
        type=positive_int,
        help="embedding rows (default: the tokenizer's vocabulary rounded up to a multiple of 64; "
        "an hf: config keeps its own)",
    )
    model.add_argument(
        "--doc-mask",
        action="store_true",
        help="attention within documents (block-diagonal causal mask from the EOS in each window) and "
        "position ids restarting at each document, as Megatron's reset_attention_mask + reset_position_ids",
    )
    model.add_argument(
        "--eod-mask-loss",
        action="store_true",
        help="with --doc-mask: no loss where the input is EOS (predicting the next document's first token "
        "across the boundary), as Megatron's eod_mask_loss; the loss is then that of each document alone",
    )

    run = p.add_argument_group("run")
    run.add_argument(
        "--deepspeed",
        metavar="DS.json",
        type=file_arg,
        help="a DeepSpeed config (default: ZeRO 0, AdamW, warmup + cosine, bf16 where the GPU has it)",
    )
    run.add_argument(
        "--steps", type=positive_int, default=d.steps, help="optimizer steps (default %(default)s)"
    )
    run.add_argument(
        "--stop-at",
        type=positive_int,
        metavar="STEP",
        help="stop (and save) at this step, e.g. before a job's time limit; the schedule "
        "still runs to --steps",
    )
    run.add_argument(
        "--global-batch",
        type=positive_int,
        help="samples per optimizer step over all ranks (train_batch_size; keep it when the number of "
        "ranks changes)",
    )
    run.add_argument(
        "--micro-batch",
        type=positive_int,
        help="samples per rank per micro-step (fills 'auto'; overrides the config)",
    )
    run.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps")
    run.add_argument("--lr", type=positive_float, help="peak learning rate (default 6e-4)")
    run.add_argument("--warmup", type=non_negative, help="warmup steps (default min(100, steps/10))")
    run.add_argument("--weight-decay", type=non_negative_float, help="AdamW weight decay (default 0.1)")
    run.add_argument(
        "--grad-clip", type=non_negative_float, help="gradient clipping norm (default 1.0; 0: no clipping)"
    )
    run.add_argument(
        "--prefetch",
        type=positive_int,
        default=d.prefetch,
        help="batches prepared ahead (default %(default)s)",
    )

    ev = p.add_argument_group("evaluation")
    ev.add_argument(
        "--eval-every",
        type=non_negative,
        default=d.eval_every,
        help="evaluate at step 0, every N steps and at the end (default 0: never)",
    )
    ev.add_argument("--eval-split", default=d.eval_split, help="split to evaluate (default %(default)s)")
    ev.add_argument(
        "--eval-samples",
        type=positive_int,
        default=d.eval_samples,
        help="windows per source to evaluate (default %(default)s)",
    )

    out = p.add_argument_group("checkpoints and logs")
    out.add_argument(
        "--save",
        metavar="DIR",
        type=folder_arg,
        help="DeepSpeed checkpoints go here (with the data position)",
    )
    out.add_argument(
        "--save-every",
        type=non_negative,
        default=d.save_every,
        help="save every N steps (always at the end when --save is given)",
    )
    out.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --save")
    out.add_argument(
        "--allow-data-change",
        action="store_true",
        help="resume although a source's content, the split or --seq-len differ from the checkpoint's "
        "(a new --mix or added sources need no flag: every source continues where it stopped)",
    )
    out.add_argument(
        "--allow-batch-change",
        action="store_true",
        help="resume although the global batch (samples per step) differs from the checkpoint's",
    )
    out.add_argument(
        "--run-dir",
        metavar="DIR",
        type=folder_arg,
        help="metrics.jsonl and run.json go here (default: --save, else runs/TIME)",
    )
    out.add_argument(
        "--log-every", type=positive_int, default=d.log_every, help="log every N steps (default %(default)s)"
    )
    out.add_argument(
        "--log-samples",
        action="store_true",
        help="write each rank's sample positions, windows and checksums to RUN_DIR/samples-rankR.jsonl",
    )
    # the deepspeed launcher and torch.distributed.launch pass this; LOCAL_RANK in the environment says the same
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def parse(argv: list[str]) -> TrainArgs:
    ns = vars(parser().parse_args(argv))
    names = {f.name for f in fields(TrainArgs)}
    if len(ns["manifest"]) == 1:
        ns["manifest"] = ns["manifest"][0]
    return TrainArgs(**{k: v for k, v in ns.items() if k in names})


def main(argv: list[str] | None = None) -> int:
    """Run ``tokshard train``; TokshardError propagates (the caller prints it as one line)."""
    from trainer.loop import train

    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    train(args)
    return 0
