"""``tokshard tokenizer ACTION``: its actions (``train``), each with its options beside its
handler (``pipeline.encoding.tokenizer`` does the work)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.encoding.tokenizer import DEFAULT_EOS, DEFAULT_MAX_TOKEN_LENGTH, TOKEN_LENGTHS, VOCAB_SIZES
from pipeline.recipe import BAD_RECORD_POLICIES
from pipeline.storage.locations import refuse_url
from tokshard.commands.command import Command
from tokshard.usage import folder_arg, path_arg, text_arg, whole_in


def add_train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input",
        action="extend",
        nargs="+",
        required=True,
        metavar="GLOB",
        type=path_arg,
        help="training files or globs (one or more; repeatable)",
    )
    p.add_argument(
        "--vocab-size", type=whole_in(*VOCAB_SIZES), required=True, help="vocabulary size, EOS included"
    )
    p.add_argument("--out", required=True, metavar="DIR", type=folder_arg, help="folder for tokenizer.json")
    p.add_argument("--eos", default=DEFAULT_EOS, type=text_arg, help="the EOS token's text")
    p.add_argument("--text-field", default="text", type=text_arg, help="JSON/parquet field holding the text")
    p.add_argument(
        "--max-token-length",
        type=whole_in(*TOKEN_LENGTHS),
        default=DEFAULT_MAX_TOKEN_LENGTH,
        metavar="N",
        help="the longest token to learn, in characters (a leading space aside): a longer word (no spaces: "
        "DNA, base64, minified data) is learned from in pieces of N, since training time grows with the "
        "square of a word's length; ordinary text has no word this long, so its vocabulary is the same",
    )
    p.add_argument(
        "--on-bad-record",
        choices=BAD_RECORD_POLICIES,
        default="error",
        help="stop at a bad record (as prepare does), or skip and count it",
    )


def run_train(args: argparse.Namespace) -> int:
    from pipeline.encoding.tokenizer import TrainProgress, train
    from pipeline.run.progress import stderr_log
    from pipeline.run.status import skipped_text
    from trainer.console import reporting

    refuse_url(args.out, "--out")
    bar = sys.stderr.isatty()  # `tokenizers`' own bars; lines where they would not show (logs, CI)
    trained = train(
        args.input,
        args.vocab_size,
        Path(args.out),
        args.eos,
        args.text_field,
        args.on_bad_record == "skip",
        args.max_token_length,
        TrainProgress(bar=bar, log=lambda line: stderr_log(line, "tokshard tokenizer train")),
    )
    skipped = f"; {skipped_text(trained.skipped)}" if trained.skipped else ""
    short = (
        f" where --vocab-size asked for {args.vocab_size:,} (the text has no more pairs to merge: "
        "train on more text for more)"
        if trained.ids < args.vocab_size
        else ""
    )
    with reporting(f"wrote {trained.path} ({trained.ids:,} ids)"):
        print(
            f"wrote {trained.path}: {trained.ids:,} ids{short}, trained on {trained.documents:,} document{'' if trained.documents == 1 else 's'}{skipped}"
        )
    if trained.eos_in_text:
        print(
            f"note: --eos {args.eos!r} is text in {trained.eos_in_text:,} training document"
            f"{'' if trained.eos_in_text == 1 else 's'} (the first: {trained.eos_first_place}): `tokshard prepare` "
            "encodes it as text, but libraries that load the tokenizer (tokenizers, transformers) match "
            "special tokens in text first, so there it becomes the EOS id; a spelling no document holds "
            "(--eos) avoids that",
            file=sys.stderr,
        )
    return 0


TRAIN = Command(
    name="train",
    summary="train a byte-level BPE (GPT-2 style) with EOS as a special token",
    example="tokshard tokenizer train --input 'corpus/*.jsonl' --vocab-size 32000 --out tok/",
    add_options=add_train_options,
    run=run_train,
    after_stop="no tokenizer was written; rerun the same command to train from the start",
)
#: the actions of ``tokshard tokenizer``, by name
ACTIONS = {action.name: action for action in (TRAIN,)}


def add_options(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action in ACTIONS.values():
        sub = actions.add_parser(action.name, help=action.summary, **action.parser_settings())
        action.add_options(sub)
        # its mistakes point to its own --help (`tokshard tokenizer train --help`)
        sub.set_defaults(after_stop=action.after_stop, usage=sub)


def run(args: argparse.Namespace) -> int:
    return ACTIONS[args.action].run(args)


COMMAND = Command(
    name="tokenizer",
    summary="tokenizer tools",
    example=TRAIN.example,
    add_options=add_options,
    run=run,
)
