"""``tokshard train``: its options, and the run they start (``trainer.loop``).

Launchers start it as a module: ``python -m tokshard train``, ``deepspeed --module tokshard
train``, ``torchrun -m tokshard train`` (``tokshard/__main__.py``). Describing ``--model``
names the model sizes, which loads torch: the options are added only when ``train`` is the
command run (or its help asked for).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.format.errors import TokshardError
from pipeline.storage.locations import is_url
from tokshard.commands.command import INTERRUPTED, STOPPING, Command, Terminated
from tokshard.usage import (
    add_data_cache_options,
    auto_or_non_negative,
    folder_arg,
    non_negative,
    non_negative_float,
    path_arg,
    positive_float,
    positive_int,
)
from trainer.ds_config import (
    DEFAULT_CONFIG,
    DEFAULT_GRAD_CLIP,
    DEFAULT_LR,
    DEFAULT_WEIGHT_DECAY,
    config_path,
    shipped_configs,
)
from trainer.sampler import DEFAULT_SEED, parse_mix
from trainer.settings import (
    PACKING_MODES,
    WARMUP_DIVISOR,
    WARMUP_MAX,
    CheckpointSettings,
    DataSettings,
    EvalSettings,
    LogSettings,
    ModelSettings,
    OptimSettings,
    Packing,
    TrainSettings,
)

EXAMPLES = """\
# one process (CPU, or one GPU)
tokshard train --manifest out/manifest.json --model gpt2-124m --steps 2000 --save ckpt
# one node, 8 GPUs, a DeepSpeed config
deepspeed --num_gpus 8 --module tokshard train --manifest out/manifest.json \\
    --deepspeed zero2-bf16 --save ckpt --eval-every 200
# torchrun works the same way
torchrun --nproc_per_node 8 -m tokshard train --manifest out/manifest.json --save ckpt
# continue after a crash or a time limit: the exact next samples, any number of ranks
deepspeed --num_gpus 4 --module tokshard train --manifest out/manifest.json --save ckpt --resume"""


def add_options(p: argparse.ArgumentParser) -> None:
    _data_options(p.add_argument_group("data"))
    _model_options(p.add_argument_group("model"))
    _run_options(p.add_argument_group("run"))
    _eval_options(p.add_argument_group("evaluation"))
    _output_options(p.add_argument_group("checkpoints and logs"))


def _data_options(g) -> None:
    d = DataSettings(manifests=())
    g.add_argument(
        "--manifest",
        required=True,
        action="extend",
        nargs="+",
        type=path_arg,
        help="manifest.json, or the folder holding it, or its URL (s3://bucket/run/manifest.json: "
        "shards then go through --data-cache); give several (or repeat it) to train on the sources "
        "of several prepared folders (one tokenizer, source names unique across them)",
    )
    add_data_cache_options(g)
    g.add_argument(
        "--seq-len", type=positive_int, default=d.seq_len, help="tokens per sample (default %(default)s)"
    )
    g.add_argument(
        "--packing",
        choices=PACKING_MODES,
        default=d.packing.mode,
        help="none: fixed windows of --seq-len + 1 tokens over each source's stream, cutting documents "
        "at their edges; best-fit: whole documents packed into such windows by best fit (only a "
        "document longer than a window is cut; the rest of a window is padding the loss ignores) "
        "(default %(default)s)",
    )
    g.add_argument(
        "--packing-buffer",
        type=positive_int,
        metavar="DOCS",
        help=f"with --packing best-fit: documents per best-fit block, consecutive in each source "
        f"(default {d.packing.buffer})",
    )
    g.add_argument(
        "--mix",
        metavar="SRC=W,...",
        help="mixture weights per source; a source left out is not trained (default: by token count)",
    )
    g.add_argument("--train-split", default=d.train_split, help="split to train on (default %(default)s)")
    g.add_argument(
        "--seed",
        type=non_negative,
        help=f"sample order and model init (default {DEFAULT_SEED}; a resume keeps the checkpoint's)",
    )
    g.add_argument("--verify", action="store_true", help="re-hash every shard before training")


def _model_options(g) -> None:
    from trainer.model import SIZES  # loads torch: only when train's options are built
    from trainer.models import CHUNKABLE_MODELS, VOCAB_MULTIPLE

    d = ModelSettings()
    g.add_argument(
        "--model", default=d.name,
        help=f"{', '.join(SIZES)}, or hf:CONFIG for a Transformers causal LM built from a config "
        "(hub name, folder, config.json, or one shipped: hf:opt-125m, hf:opt-350m, hf:gpt-neo-2.7b; "
        "needs tokshard[transformers]) (default %(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--vocab-size",
        type=positive_int,
        help=f"embedding rows (default: the tokenizer's vocabulary rounded up to a multiple of {VOCAB_MULTIPLE}; "
        "an hf: config keeps its own)",
    )
    g.add_argument(
        "--doc-mask",
        action="store_true",
        help="attention within documents (block-diagonal causal mask from the EOS in each window) and "
        "position ids restarting at each document, as Megatron's reset_attention_mask + reset_position_ids",
    )
    g.add_argument(
        "--eod-mask-loss",
        action="store_true",
        help="with --doc-mask: no loss where the input is EOS (predicting the next document's first token "
        "across the boundary), as Megatron's eod_mask_loss; the loss is then that of each document alone",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (in place: checkpoints load with or without it); the first steps "
        "wait for the compiler, so a step-time figure leaves them out",
    )
    g.add_argument(
        "--loss-chunk",
        metavar="TOKENS|auto",
        type=auto_or_non_negative,
        help="make the loss's logits TOKENS tokens at a time, made again in the backward pass, so a step "
        "holds one chunk's logits instead of the micro-batch's (a 100k-256k vocabulary's outweigh the "
        "model); 0: all at once; auto (default): chunked only on a CPU whose memory could not hold them; "
        f"{CHUNKABLE_MODELS} only",
    )


def deepspeed_arg(text: str) -> str:
    """`path_arg` for ``--deepspeed``, refused now if it names neither a file nor a shipped
    config (`trainer.ds_config.config_path`), rather than after the ranks have started."""
    text = path_arg(text)  # a folder named as a shipped config is no config: config_path says
    if is_url(text):
        raise argparse.ArgumentTypeError(f"{text} is a URL; this option takes a local path or a name")
    try:
        config_path(text)
    except TokshardError as exc:  # an argparse type's refusal: exit 2, naming the option
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--deepspeed ")) from None
    return text


def _run_options(g) -> None:
    d = OptimSettings()
    g.add_argument(
        "--deepspeed",
        metavar="CONFIG",
        type=deepspeed_arg,
        help=f"a DeepSpeed config: a JSON file, or the name of one tokshard ships ({', '.join(shipped_configs())}) "
        f"(default: {DEFAULT_CONFIG.stem}, with bf16 where the GPU has it)",
    )
    g.add_argument(
        "--steps", type=positive_int, default=d.steps, help="optimizer steps (default %(default)s)"
    )
    g.add_argument(
        "--stop-at",
        type=positive_int,
        metavar="STEP",
        help="stop (and save) at this step, e.g. before a job's time limit; the schedule "
        "still runs to --steps",
    )
    g.add_argument(
        "--global-batch",
        type=positive_int,
        help="samples per optimizer step over all ranks (train_batch_size; keep it when the number of "
        "ranks changes)",
    )
    g.add_argument(
        "--micro-batch",
        type=positive_int,
        help="samples per rank per micro-step (fills 'auto'; overrides the config)",
    )
    g.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps")
    g.add_argument("--lr", type=positive_float, help=f"peak learning rate (default {DEFAULT_LR:g})")
    g.add_argument(
        "--warmup",
        type=non_negative,
        help=f"warmup steps (default: --steps // {WARMUP_DIVISOR}, at most {WARMUP_MAX}, at least 1; "
        "0: no warmup)",
    )
    g.add_argument(
        "--weight-decay",
        type=non_negative_float,
        help=f"AdamW weight decay (default {DEFAULT_WEIGHT_DECAY:g})",
    )
    g.add_argument(
        "--grad-clip",
        type=non_negative_float,
        help=f"gradient clipping norm (default {DEFAULT_GRAD_CLIP:g}; 0: no clipping)",
    )
    g.add_argument(
        "--prefetch",
        type=positive_int,
        default=DataSettings(manifests=()).prefetch,
        help="batches prepared ahead (default %(default)s)",
    )


def _eval_options(g) -> None:
    d = EvalSettings()
    g.add_argument(
        "--eval-every",
        type=non_negative,
        default=d.every,
        help="evaluate at step 0, every N steps and at the end (default %(default)s: never)",
    )
    g.add_argument("--eval-split", default=d.split, help="split to evaluate (default %(default)s)")
    g.add_argument(
        "--eval-samples",
        type=positive_int,
        default=d.samples,
        help="windows per source to evaluate (default %(default)s)",
    )


def _output_options(g) -> None:
    from trainer.run_folders import RUNS

    d, log = CheckpointSettings(), LogSettings()
    g.add_argument(
        "--save",
        metavar="DIR",
        type=folder_arg,
        help="DeepSpeed checkpoints go here (with the data position); SIGTERM saves the step in progress, then stops",
    )
    g.add_argument(
        "--save-every",
        type=non_negative,
        default=d.every,
        help="save every N steps (always at the end when --save is given)",
    )
    g.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --save")
    g.add_argument(
        "--allow-data-change",
        action="store_true",
        help="resume although a source's content, the split or --seq-len differ from the checkpoint's "
        "(a new --mix or added sources need no flag: every source continues where it stopped)",
    )
    g.add_argument(
        "--allow-batch-change",
        action="store_true",
        help="resume although the global batch (samples per step) differs from the checkpoint's",
    )
    g.add_argument(
        "--run-dir",
        metavar="DIR",
        type=folder_arg,
        help=f"metrics.jsonl and run.json go here (default: --save, else {RUNS}/TIME)",
    )
    g.add_argument(
        "--log-every", type=positive_int, default=log.every, help="log every N steps (default %(default)s)"
    )
    g.add_argument(
        "--log-samples",
        action="store_true",
        help="write each rank's sample positions, windows and checksums to RUN_DIR/samples-rankR.jsonl",
    )


def settings_from(ns: argparse.Namespace) -> TrainSettings:
    """The run's settings, each component's from its options."""
    return TrainSettings(
        data=DataSettings(
            manifests=tuple(ns.manifest),
            seq_len=ns.seq_len,
            packing=packing_from(ns),
            mix=parse_mix(ns.mix),
            train_split=ns.train_split,
            seed=ns.seed,
            verify=ns.verify,
            prefetch=ns.prefetch,
            cache=ns.data_cache,
            cache_limit=ns.data_cache_limit,
        ),
        model=ModelSettings(
            name=ns.model,
            vocab_size=ns.vocab_size,
            doc_mask=ns.doc_mask,
            eod_mask_loss=ns.eod_mask_loss,
            compile=ns.compile,
            loss_chunk=ns.loss_chunk,
        ),
        optim=OptimSettings(
            deepspeed=ns.deepspeed,
            steps=ns.steps,
            global_batch=ns.global_batch,
            micro_batch=ns.micro_batch,
            grad_accum=ns.grad_accum,
            lr=ns.lr,
            warmup=ns.warmup,
            weight_decay=ns.weight_decay,
            grad_clip=ns.grad_clip,
        ),
        eval=EvalSettings(every=ns.eval_every, split=ns.eval_split, samples=ns.eval_samples),
        checkpoint=CheckpointSettings(
            save=ns.save,
            every=ns.save_every,
            resume=ns.resume,
            allow_data_change=ns.allow_data_change,
            allow_batch_change=ns.allow_batch_change,
        ),
        log=LogSettings(run_dir=ns.run_dir, every=ns.log_every, samples=ns.log_samples),
        stop_at=ns.stop_at,
    )


def packing_from(ns: argparse.Namespace) -> Packing:
    if ns.packing_buffer is not None and ns.packing != "best-fit":
        raise TokshardError("train: --packing-buffer goes with --packing best-fit; pass both, or neither")
    return Packing(ns.packing, ns.packing_buffer or Packing.buffer)


def parse(argv: list[str]) -> TrainSettings:
    """The settings of a ``tokshard train`` command line (its words after ``train``)."""
    return settings_from(COMMAND.parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Train; Ctrl-C, SIGTERM and SIGHUP end in one line saying where the run can continue from.
    With ``--save``, SIGTERM (a job's time limit) first saves the step in progress
    (`trainer.stop_request`)."""
    from trainer.loop import train
    from trainer.run_folders import how_to_continue
    from trainer.stop_request import StoppedBySignal

    settings = settings_from(args)
    try:
        train(settings)
    except (KeyboardInterrupt, Terminated, StoppedBySignal) as stop:
        if isinstance(stop, StoppedBySignal):
            what, code = (
                f"stopped by {STOPPING[stop.signum]} after saving step {stop.step}",
                128 + stop.signum,
            )
        elif isinstance(stop, Terminated):
            what, code = stop.what, stop.exit_code
        else:
            what, code = "interrupted", INTERRUPTED
        save = Path(settings.checkpoint.save) if settings.checkpoint.save else None
        if os.environ.get("RANK", "0") == "0":  # one line per run, not per rank
            print(
                f"tokshard: train {what}; {how_to_continue(save, settings.checkpoint.resume)}",
                file=sys.stderr,
            )
        return code
    return 0


COMMAND = Command(
    name="train",
    summary="train a model with DeepSpeed on a manifest",
    details="Batches are memory-mapped from the shards and prepared ahead on a background thread.",
    example=EXAMPLES,
    add_options=add_options,
    run=run,
)


def main(argv: list[str]) -> int:
    """``tokshard train ARGV`` in this process (scripts, tests); mistakes raise TokshardError."""
    return COMMAND.main(argv)
