"""The `tokshard` command. Each subcommand is a thin shell over a module that does the work.

User mistakes raise `TokshardError` and end as one line on stderr with a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline import recipe as recipe_mod
from pipeline.format.errors import TokshardError
from pipeline.recipe import BAD_RECORD_POLICIES, DTYPES, ENCODERS
from pipeline.run.cluster import BATCH_SYSTEMS
from pipeline.storage.locations import is_url, refuse_url
from tokshard.demo import SIZES
from tokshard.usage import OneLineParser, file_arg, folder_arg, path_arg, positive_int, size_arg

RECIPES_DIR = Path(__file__).resolve().parent.parent / "manifests"


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):  # "(default: None)" says nothing; the help text does
            return action.help
        return super()._get_help_string(action)


def _subparser(sub, name: str, help: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help, description=f"{help}\n\nexample:\n  {example}", formatter_class=_Formatter
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tokshard",
        description="Tokenize corpora on CPU nodes into memory-mapped shards; train on them with DeepSpeed.",
        epilog="example:\n  tokshard demo --out demo-out   # the whole job on a small built-in corpus, offline\n\n"
        "Run `tokshard COMMAND --help` for a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tokshard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_prepare(sub)
    _add_tokenizer(sub)
    _add_status(sub)
    _add_verify(sub)
    _add_inspect(sub)
    _add_train(sub)
    _add_samples(sub)
    _add_megatron_args(sub)
    _add_plot(sub)
    _add_demo(sub)
    return parser


def _add_prepare(sub) -> None:
    p = _subparser(
        sub,
        "prepare",
        "tokenize a recipe's corpora (or your files) into shards and a manifest; rerun to resume",
        "tokshard prepare manifests/wikitext-103.toml --out data/wt103 --workers 8\n"
        "  tokshard prepare --input 'corpus/*.jsonl.zst' --tokenizer tok/ --out data/mine",
    )
    p.add_argument(
        "recipe", nargs="?", type=path_arg, help="recipe TOML (a path, or the name of a bundled one)"
    )
    p.add_argument(
        "--input",
        action="append",
        metavar="GLOB",
        type=path_arg,
        help="ad hoc: local or fsspec files instead of a recipe (repeatable)",
    )
    p.add_argument("--text-field", default="text", help="ad hoc: JSON/parquet field holding the text")
    p.add_argument("--split", default="train", help="ad hoc: split name for --input files")
    p.add_argument("--name", default="data", help="ad hoc: source name for --input files")
    p.add_argument(
        "--partition-bytes",
        type=positive_int,
        help="ad hoc: bytes of input per Dask task (default auto: 8 to 64 MiB, at least 8 tasks per split)",
    )
    p.add_argument(
        "--tokenizer", metavar="TOK", type=path_arg, help="tokenizer.json, a folder with one, or a hub name"
    )
    p.add_argument(
        "--out", metavar="DIR", type=folder_arg, help="output folder (shards, manifest.json, run state)"
    )
    p.add_argument("--workers", type=positive_int, help="local Dask worker processes (default: one per core)")
    p.add_argument("--threads", type=positive_int, help="encoder threads per worker process (default 1)")
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        type=memory_limit_arg,
        help="memory limit per local worker: a size (2GiB), a fraction of this machine's memory (0.5), "
        "or 0 for none (default: auto)",
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the Dask dashboard for the local workers (about half a second more start-up; "
        "a --scheduler or --cluster run has its scheduler's own)",
    )
    p.add_argument(
        "--scheduler",
        metavar="tcp://HOST:PORT",
        help="use a running Dask scheduler (its address, or the JSON file of --scheduler-file)",
    )
    p.add_argument("--encoder", choices=ENCODERS, help="encoder back end (default auto)")
    p.add_argument(
        "--dtype", choices=DTYPES, help="token dtype (default auto: uint16 where every id fits, else uint32)"
    )
    p.add_argument(
        "--shard-tokens", type=positive_int, help="at most this many tokens per shard (default 2^27)"
    )
    p.add_argument(
        "--on-bad-record",
        choices=BAD_RECORD_POLICIES,
        help="stop at a bad record (default) or skip and count it",
    )
    p.add_argument(
        "--mirror", metavar="DIR", type=folder_arg, help="local copy of the recipe's hub repo (same layout)"
    )
    _add_batch_options(p)


def _add_tokenizer(sub) -> None:
    p = _subparser(
        sub,
        "tokenizer",
        "tokenizer tools",
        "tokshard tokenizer train --input 'corpus/*.jsonl' --vocab-size 32000 --out tok/",
    )
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)
    t = _subparser(
        tsub,
        "train",
        "train a byte-level BPE (GPT-2 style) with EOS as a special token",
        "tokshard tokenizer train --input 'corpus/*.jsonl' --vocab-size 32000 --out tok/",
    )
    t.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="GLOB",
        type=path_arg,
        help="training files (repeatable)",
    )
    t.add_argument("--vocab-size", type=positive_int, required=True, help="vocabulary size, EOS included")
    t.add_argument("--out", required=True, metavar="DIR", type=folder_arg, help="folder for tokenizer.json")
    t.add_argument("--eos", default="<|endoftext|>", help="the EOS token's text")


def memory_limit_arg(text: str) -> str:
    """Dask's forms of a worker memory limit, checked before any worker starts (Dask's own
    errors come from inside the worker processes): ``auto``, 0 (none), a fraction of the
    machine's memory (0.5), or a size (2GiB, a byte count)."""
    value = text.strip().lower()
    if value in ("auto", "0"):
        return text
    try:
        number = float(value)
    except ValueError:  # a size with a unit, or a word
        with contextlib.suppress(argparse.ArgumentTypeError):
            return size_arg(text)
    else:
        if math.isfinite(number) and number > 0:
            return text
    raise argparse.ArgumentTypeError(
        f"expected auto, 0 (no limit), a fraction such as 0.5 or a size such as 2GiB, got {text!r}"
    )


def _add_status(sub) -> None:
    p = _subparser(
        sub,
        "status",
        "what a prepare folder has done, is doing, and what a rerun would do",
        "tokshard status data/wt103",
    )
    p.add_argument("dir", type=folder_arg, help="the --out folder of a prepare run")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_verify(sub) -> None:
    p = _subparser(
        sub,
        "verify",
        "re-hash every shard and check .idx against .bin; exit 1 on any fault",
        "tokshard verify data/wt103/manifest.json",
    )
    p.add_argument("manifest", type=path_arg, help="manifest.json or its folder")


def _add_inspect(sub) -> None:
    p = _subparser(
        sub,
        "inspect",
        "counts per source and split, document-length stats, a decoded sample",
        "tokshard inspect data/wt103",
    )
    p.add_argument("manifest", type=path_arg, help="manifest.json or its folder")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--plot", action="store_true", help="also draw a histogram of document lengths per source (PNG)"
    )
    p.add_argument(
        "--plot-file",
        metavar="PNG",
        type=file_arg,
        help="where --plot writes (default: doc_lengths.png beside the manifest); implies --plot",
    )


def _add_train(sub) -> None:
    _subparser(
        sub,
        "train",
        "train a model with DeepSpeed on a manifest (see `tokshard train --help`)",
        "tokshard train --manifest data/wt103 --model gpt2-124m --deepspeed trainer/configs/zero2-bf16.json",
    )


def _add_samples(sub) -> None:
    _subparser(
        sub,
        "samples",
        "which samples (sources, windows, documents, text) each training step used, from the checkpoint",
        "tokshard samples ckpt --steps 41237 --decode | less   (see `tokshard samples --help`)",
    )


def _add_megatron_args(sub) -> None:
    _subparser(
        sub,
        "megatron-args",
        "print Megatron-LM's --data-path (weight prefix ...) for a manifest's shards, or write its blend JSON",
        "tokshard megatron-args out/manifest.json --mix wiki=0.7,code=0.3   (see `tokshard megatron-args --help`)",
    )


def _add_plot(sub) -> None:
    p = _subparser(
        sub,
        "plot",
        "draw a training run's loss, tokens/s and data wait (metrics.jsonl) into a PNG",
        "tokshard plot ckpt            # writes ckpt/report.png",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        type=path_arg,
        help="a run's --run-dir (or --save) folder, or its metrics.jsonl",
    )
    p.add_argument(
        "--out", metavar="PNG", type=file_arg, help="where to write the PNG (default: RUN_DIR/report.png)"
    )
    p.add_argument("--title", help="the figure's title (default: the run folder)")


def _add_demo(sub) -> None:
    p = _subparser(
        sub,
        "demo",
        "the whole job on a corpus tokshard writes itself, offline: build WikiText/CC-News/BookCorpus\n"
        "look-alikes in the hub's layouts, train a BPE, prepare on a local Dask cluster, verify,\n"
        "train a small GPT with DeepSpeed, evaluate, and write a report; rerun to resume.\n"
        "Exits 1 if the validation loss did not fall (the report says by how much).",
        "tokshard demo --out demo-out   # then open demo-out/report.png and demo-out/summary.md",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        type=folder_arg,
        default="demo-out",
        help="folder for everything the demo makes",
    )
    p.add_argument(
        "--size",
        choices=list(SIZES),
        default="default",
        help="default: about two minutes on two cores; quick: a fifth of the data and steps (what the tests run)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="local Dask worker processes for prepare (default: cores, at most 4)",
    )


def _add_batch_options(p: argparse.ArgumentParser) -> None:
    """`--cluster slurm|pbs`: CPU workers from a batch system via dask-jobqueue (docs/CLUSTER.md)."""
    g = p.add_argument_group("batch system (--cluster; unset knobs come from your Dask jobqueue config)")
    g.add_argument("--cluster", choices=BATCH_SYSTEMS, help="submit batch jobs of Dask workers")
    g.add_argument("--jobs", type=positive_int, default=1, help="number of batch jobs")
    g.add_argument("--cores", type=positive_int, help="cores per job (one worker process per core)")
    g.add_argument("--memory", help="memory per job, e.g. 120GB (split over its worker processes)")
    g.add_argument("--queue", help="queue / partition (Slurm -p, PBS -q)")
    g.add_argument("--account", help="account to charge (-A)")
    g.add_argument("--walltime", help="time limit per job, e.g. 04:00:00")
    g.add_argument(
        "--job-extra", action="append", metavar="DIRECTIVE", help="extra #SBATCH/#PBS directive (repeatable)"
    )
    g.add_argument(
        "--local-directory", metavar="DIR", type=folder_arg, help="node-local scratch for Dask workers"
    )
    g.add_argument(
        "--print-job-script", action="store_true", help="print the job script and exit (submits nothing)"
    )


def _batch_jobs(args: argparse.Namespace):
    if not args.cluster:
        if args.print_job_script:
            raise TokshardError("--print-job-script needs --cluster slurm or --cluster pbs")
        return None
    if args.scheduler:
        raise TokshardError("give either --scheduler or --cluster, not both")
    from pipeline.run.cluster import BatchJobs, require_batch_system

    if not args.print_job_script:
        require_batch_system(args.cluster)
    return BatchJobs(
        system=args.cluster,
        jobs=args.jobs,
        cores=args.cores,
        memory=args.memory,
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        job_extra=args.job_extra or [],
        local_directory=args.local_directory,
    )


def _train_main() -> Callable[[list[str]], int]:
    from tokshard.commands.train import main

    return main


def _samples_main() -> Callable[[list[str]], int]:
    from tokshard.commands.samples import main

    return main


def _megatron_main() -> Callable[[list[str]], int]:
    from tokshard.commands.megatron_args import main

    return main


#: commands with their own parsers (tokshard/commands/; they load torch: only when asked for)
TRAINER_COMMANDS: dict[str, Callable[[], Callable[[list[str]], int]]] = {
    "train": _train_main,
    "samples": _samples_main,
    "megatron-args": _megatron_main,
}


class Terminated(BaseException):
    """SIGTERM as an exception of the main thread: the command stops as on Ctrl-C (workers
    closed, committed work kept) and says so in one line, where the default would end it
    without a word. A BaseException, so that no ``except Exception`` on the way swallows it."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] and argv[0] in TRAINER_COMMANDS:
            return TRAINER_COMMANDS[argv[0]]()(argv[1:])
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminated)
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except TokshardError as exc:
        print(f"tokshard: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tokshard: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Terminated:
        print("tokshard: stopped by SIGTERM; rerun the same command to resume", file=sys.stderr)
        return 128 + signal.SIGTERM


def _recipe_path(name: str) -> Path:
    refuse_url(name, "recipe")
    path = Path(name)
    if path.exists():
        return path
    bundled = RECIPES_DIR / (name if name.endswith(".toml") else f"{name}.toml")
    if bundled.exists():
        return bundled
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
    raise TokshardError(f"recipe {name} does not exist (bundled recipes: {known or 'none'})")


def cmd_prepare(args: argparse.Namespace) -> int:
    from pipeline.run.driver import RunOptions, prepare
    from pipeline.run.open_state import open_run_state

    batch = _batch_jobs(args)
    if args.print_job_script:
        from pipeline.run.cluster import job_script

        print(job_script(batch, args.threads or 1))
        return 0

    recipe = _recipe_from_args(args)
    out = recipe.settings.out
    if not out:
        raise TokshardError('no output folder: pass --out DIR (or set out = "..." in the recipe)')
    state = open_run_state(out)  # a recipe's out = "..." has not been through argparse: checked here
    refuse_url(args.local_directory, "--local-directory")
    if not (args.scheduler or args.cluster):
        from pipeline.run.cluster import check_local_workers

        check_local_workers(args.workers)
    started = time.monotonic()
    options = RunOptions(
        workers=args.workers,
        scheduler=args.scheduler,
        memory_limit=args.memory_limit,
        dashboard=args.dashboard,
        batch=batch,
    )
    path = prepare(recipe, state, options)
    print(_prepared_line(path, state.manifest_doc() or {}, time.monotonic() - started))
    return 0


def _prepared_line(path: Path | str, data: dict[str, Any], seconds: float) -> str:
    """The final line: where the manifest is, what it holds, and what was skipped."""
    from pipeline.run.status import skipped_text

    totals = data["totals"]
    skipped: dict[str, int] = {}
    for src in data["sources"].values():
        for split in src["splits"].values():
            for reason, n in split.get("skipped", {}).items():
                skipped[reason] = skipped.get(reason, 0) + n
    routed = data.get("encoder", {}).get("routed")
    routed_text = (
        f"; {routed['documents']:,} documents holding {routed['class']} encoded by {routed['to']}"
        if routed
        else ""
    )
    return (
        f"{path}: {totals['tokens']:,} tokens, {totals['documents']:,} documents, "
        f"{totals['shards']} shards ({seconds:.1f} s)"
        + (f"; {skipped_text(skipped)}" if skipped else "")
        + routed_text
    )


def _recipe_from_args(args: argparse.Namespace) -> recipe_mod.Recipe:
    """The recipe `prepare` runs: a RECIPE file or --input files, command-line settings on top."""
    overrides: dict[str, Any] = {
        "tokenizer": args.tokenizer,
        "out": args.out,
        "threads": args.threads,
        "encoder": args.encoder,
        "dtype": args.dtype,
        "shard_tokens": args.shard_tokens,
        "on_bad_record": args.on_bad_record,
    }
    if args.input and args.recipe:
        raise TokshardError("give either a RECIPE or --input files, not both")
    if args.input:
        from pipeline.sources.base import check_path_name

        check_path_name("split", args.split, "--split")  # it names a folder: checked before any work
        check_path_name("source", args.name, "--name")
        source: dict[str, Any] = {
            "type": "files",
            "paths": args.input,
            "text_field": args.text_field,
            "split": args.split,
        }
        if args.partition_bytes:
            source["partition_bytes"] = args.partition_bytes
        if args.mirror:
            raise TokshardError("--mirror applies to hub recipes, not to --input files")
        return recipe_mod.from_dict({"sources": {args.name: source}}, "--input", overrides)
    if args.recipe:
        return recipe_mod.load(_recipe_path(args.recipe), overrides, mirror=args.mirror)
    raise TokshardError("nothing to prepare: give a RECIPE file or --input 'GLOB' (see --help)")


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from pipeline.encoding.tokenizer import train
    from pipeline.storage.ownership import claim_folder

    refuse_url(args.out, "--out")
    claim_folder(args.out, "--out", "tokenizer train")
    path = train(args.input, args.vocab_size, Path(args.out), args.eos)
    print(f"wrote {path}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from pipeline.run.status import render, status

    s = status(args.dir)
    print(json.dumps(s, indent=1) if args.json else render(s))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from pipeline.storage.verify_place import verify

    faults, totals = verify(args.manifest)
    for fault in faults:
        print(f"FAULT {fault}")
    if faults:
        print(f"tokshard: verify found {len(faults)} fault(s)", file=sys.stderr)
        return 1
    print(f"OK: {totals['shards']} shards, {totals['tokens']:,} tokens match the manifest")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from pipeline.inspection import render, summary

    report = summary(args.manifest)
    print(json.dumps(report, indent=1) if args.json else render(report))
    if args.plot or args.plot_file:
        from tokshard.inspection_plot import plot_doc_lengths

        refuse_url(args.plot_file, "--plot-file")
        if is_url(args.manifest) and not args.plot_file:
            raise TokshardError("--plot of a manifest URL needs --plot-file PNG (a local file to write)")

        png = plot_doc_lengths(args.manifest, args.plot_file)
        print(f"wrote {png}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from trainer.report import describe, write_report

    refuse_url(args.run_dir, "RUN_DIR")
    refuse_url(args.out, "--out")

    print(describe(write_report(args.run_dir, args.out, args.title)))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.run.cluster import check_local_workers
    from tokshard import demo

    refuse_url(args.out, "--out")
    check_local_workers(args.workers)
    summary = demo.run(Path(args.out), args.size, args.workers)
    print(demo.console_summary(summary))
    if not summary["learned"]:
        print(
            "tokshard demo: the evaluation loss did not fall as expected; see the report above",
            file=sys.stderr,
        )
        return 1
    return 0


COMMANDS = {
    "prepare": cmd_prepare,
    "tokenizer": cmd_tokenizer,
    "status": cmd_status,
    "verify": cmd_verify,
    "inspect": cmd_inspect,
    "plot": cmd_plot,
    "demo": cmd_demo,
}


if __name__ == "__main__":
    sys.exit(main())
