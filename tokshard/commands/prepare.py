"""``tokshard prepare RECIPE`` (or ``--input GLOB``): its options, and the run they start
(``pipeline.run.driver``).

Settings a recipe may hold (``--threads``, ``--dtype``...) default to None here, so that the
recipe's value holds unless the option is given; their help shows the default of the recipe's
`Settings`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import shlex
import time
from pathlib import Path
from typing import Any

from pipeline import recipe as recipe_mod
from pipeline.format.errors import TokshardError, counted
from pipeline.recipe import BAD_RECORD_POLICIES, DTYPES, ENCODERS, Settings
from pipeline.run.cluster import BATCH_SYSTEMS, LOCAL_MEMORY_LIMIT, BatchJobs
from pipeline.storage.locations import refuse_url
from tokshard.commands.command import Command
from tokshard.usage import bytes_arg, default_of, folder_arg, path_arg, positive_int, text_arg

RECIPES_DIR = Path(__file__).resolve().parents[2] / "manifests"
#: the source name of ``--input`` files
INPUT_SOURCE = "data"


def recipe_default(name: str) -> str:
    """How an option's help names the default of the recipe setting ``name``."""
    return f"default: the recipe's {name}, else {default_of(Settings, name)}"


def add_options(p: argparse.ArgumentParser) -> None:
    from pipeline.sources.files import FilesSource

    files = FilesSource.defaults
    p.add_argument(
        "recipe",
        nargs="?",
        type=path_arg,
        help=f"recipe TOML: a path, or the name of a bundled one ({', '.join(bundled_recipes())})",
    )
    p.add_argument(
        "--input",
        action="extend",
        nargs="+",
        metavar="GLOB",
        type=path_arg,
        help="ad hoc: local or fsspec files or globs instead of a recipe (one or more, as the shell "
        "expands a glob, or a quoted glob tokshard expands; repeatable)",
    )
    p.add_argument(
        "--text-field",
        type=text_arg,
        help=f"ad hoc: JSON/parquet field holding the text (default: {files['text_field']})",
    )
    p.add_argument(
        "--split", type=text_arg, help=f"ad hoc: split name for --input files (default: {files['split']})"
    )
    p.add_argument(
        "--name", type=text_arg, help=f"ad hoc: source name for --input files (default: {INPUT_SOURCE})"
    )
    p.add_argument(
        "--partition-bytes",
        metavar="SIZE",
        type=partition_size,
        help="ad hoc: input per Dask task, such as 16MiB or a byte count (default "
        f"{files['partition_bytes']}: sized from each split's input, the same for any number of workers)",
    )
    p.add_argument(
        "--tokenizer", metavar="TOK", type=path_arg, help="tokenizer.json, a folder with one, or a hub name"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        type=folder_arg,
        help="output folder or store URL (shards, manifest.json, run state)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="local Dask worker processes (default: one per core; never more than the partitions to do)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        help=f"encoder threads per worker process ({recipe_default('threads')})",
    )
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        type=memory_limit_arg,
        help="memory limit per local worker: a size with a unit (2GiB, at least 512MiB), a fraction of "
        f"this machine's memory (0.5), or 0 for none (default {LOCAL_MEMORY_LIMIT})",
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the Dask dashboard for the local workers (it delays their start-up; "
        "a --scheduler or --cluster run has its scheduler's own)",
    )
    p.add_argument(
        "--scheduler",
        metavar="tcp://HOST:PORT",
        help="use a running Dask scheduler (its address, or the JSON file of --scheduler-file)",
    )
    p.add_argument("--encoder", choices=ENCODERS, help=f"encoder back end ({recipe_default('encoder')})")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help=f"token dtype; auto: uint16 where every id fits, else uint32 ({recipe_default('dtype')})",
    )
    p.add_argument(
        "--eos-token",
        metavar="TEXT",
        type=text_arg,
        help="the token that ends each document (default: the recipe's eos_token, else the first of "
        "the usual spellings the tokenizer has, else the one its tokenizer_config.json names)",
    )
    p.add_argument(
        "--bos-token",
        metavar="TEXT",
        type=text_arg,
        help="the token that starts each document, or 'auto': the one the tokenizer itself puts before "
        "a text, if any (its tokenizer_config.json's add_bos_token, else its post-processor's template, "
        "as Gemma and Llama 3 have); default: the recipe's bos_token, else none",
    )
    p.add_argument(
        "--shard-tokens",
        type=positive_int,
        help=f"at most this many tokens per shard, but for a longer document, which gets one of its own ({recipe_default('shard_tokens')})",
    )
    p.add_argument(
        "--on-bad-record",
        choices=BAD_RECORD_POLICIES,
        help=f"stop at a bad record or skip and count it ({recipe_default('on_bad_record')})",
    )
    p.add_argument(
        "--mirror", metavar="DIR", type=folder_arg, help="local copy of the recipe's hub repo (same layout)"
    )
    add_batch_options(p)


def memory_limit_arg(text: str) -> str:
    """Dask's forms of a worker memory limit, checked before any worker starts (Dask's own
    errors come from inside the worker processes, and a limit too small for a worker has its
    nanny kill it as it starts, again and again): ``auto``, 0 (none), a fraction of the
    machine's memory (0.5), or a size with a unit (2GiB). A bare number of 1 or more is
    refused: Dask would take 1.5 as 1.5 bytes."""
    value = text.strip().lower()
    if value in ("auto", "0"):
        return text
    size = None
    try:
        number = float(value)
    except ValueError:  # a size with a unit, or a word
        with contextlib.suppress(argparse.ArgumentTypeError):
            size = bytes_arg(text)
    else:
        if math.isfinite(number) and 0 < number < 1:
            import psutil

            size = int(number * psutil.virtual_memory().total)
    if size is not None:
        return worker_memory(text, size)
    raise argparse.ArgumentTypeError(
        f"expected auto, 0 (no limit), a fraction of this machine's memory between 0 and 1 such as 0.5, "
        f"or a size with a unit such as 2GiB, got {text!r}"
    )


def worker_memory(text: str, size: int) -> str:
    """``text`` if the ``size`` it names is enough for a worker process (`MIN_WORKER_MEMORY`)."""
    from pipeline.run.cluster import MIN_WORKER_MEMORY

    if size < MIN_WORKER_MEMORY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {size / 2**20:.0f} MiB per worker, below the {MIN_WORKER_MEMORY >> 20} MiB a worker "
            "process needs (Dask and the encoder loaded, before any text): its nanny would kill it as "
            "it starts, again and again"
        )
    return text


def partition_size(text: str) -> int:
    """An argparse type for ``--partition-bytes``: a size (16MiB, a byte count) no smaller than a
    files source allows."""
    from pipeline.sources.files.source import MIN_PARTITION_BYTES

    realistic = "such as 16MiB or 64MiB (a partition is a task's share of the input)"
    try:
        size = bytes_arg(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a size above 0, {realistic}, got {text!r}") from None
    if size < MIN_PARTITION_BYTES:
        raise argparse.ArgumentTypeError(
            f"expected {MIN_PARTITION_BYTES} bytes (4KiB) or more, {realistic}, got {text!r}"
        )
    return size


def add_batch_options(p: argparse.ArgumentParser) -> None:
    """`--cluster slurm|pbs`: CPU workers from a batch system via dask-jobqueue (docs/CLUSTER.md)."""
    g = p.add_argument_group("batch system (--cluster; unset knobs come from your Dask jobqueue config)")
    g.add_argument("--cluster", choices=BATCH_SYSTEMS, help="submit batch jobs of Dask workers")
    g.add_argument(
        "--jobs", type=positive_int, help=f"number of batch jobs (default {default_of(BatchJobs, 'jobs')})"
    )
    g.add_argument("--cores", type=positive_int, help="cores per job (one worker process per core)")
    g.add_argument(
        "--memory",
        type=job_memory_arg,
        help="memory per job, a size with a unit, e.g. 120GB (split over its worker processes)",
    )
    g.add_argument("--queue", help="queue / partition (Slurm -p, PBS -q)")
    g.add_argument("--account", help="account to charge (-A)")
    g.add_argument(
        "--walltime", help="time limit per job: HH:MM:SS (Slurm also D-HH:MM:SS, MM:SS or minutes)"
    )
    g.add_argument(
        "--job-extra", action="append", metavar="DIRECTIVE", help="extra #SBATCH/#PBS directive (repeatable)"
    )
    g.add_argument(
        "--local-directory", metavar="DIR", type=folder_arg, help="node-local scratch for Dask workers"
    )
    g.add_argument(
        "--print-job-script", action="store_true", help="print the job script and exit (submits nothing)"
    )


def job_memory_arg(text: str) -> str:
    """A job's --memory: a size with a unit (dask-jobqueue fails on a bare number with a
    TypeError), enough for one worker process at least."""
    if not any(c.isalpha() for c in text):
        raise argparse.ArgumentTypeError(f"expected a size with a unit, such as 120GB, got {text!r}")
    return worker_memory(text, bytes_arg(text))


#: the time limits each batch system reads (Slurm's sbatch --time; PBS's walltime): the forms
#: said, and a pattern of (days, first field, second field, third field)
WALLTIMES = {
    "slurm": ("HH:MM:SS, D-HH:MM:SS, D-HH, MM:SS or minutes", r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?"),
    "pbs": ("HH:MM:SS", r"()(\d+):(\d+):(\d+)"),
}


def check_walltime(system: str, text: str) -> None:
    """Refuse a --walltime the batch system would reject (or read otherwise) before any job:
    minutes and seconds below 60, and hours below 24 after a day count."""
    forms, pattern = WALLTIMES[system]
    m = re.fullmatch(pattern, text)
    if m is not None:
        days, first, *rest = m.groups()
        if all(int(f) < 60 for f in rest if f is not None) and (not days or int(first) < 24):
            return
    raise TokshardError(f"--walltime {text!r}: {system} reads {forms}, e.g. 04:00:00")


def check_no_control_characters(args: argparse.Namespace) -> None:
    """A newline (or any control character) in a value written into the job script would start
    a directive of its own there (#SBATCH ...): refused in every such option."""
    values = [
        ("--memory", args.memory),
        ("--queue", args.queue),
        ("--account", args.account),
        ("--walltime", args.walltime),
        ("--local-directory", args.local_directory),
        *(("--job-extra", extra) for extra in args.job_extra or []),
    ]
    for flag, value in values:
        if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise TokshardError(
                f"{flag} {value!r}: holds a control character (a newline?), which would be a line of "
                "its own in the job script; give the value on one line"
            )


#: the options of the run's own local workers, and those of --cluster's batch jobs
LOCAL_OPTIONS = {"--workers": "workers", "--memory-limit": "memory_limit", "--dashboard": "dashboard"}
BATCH_OPTIONS = {
    "--jobs": "jobs",
    "--cores": "cores",
    "--memory": "memory",
    "--queue": "queue",
    "--account": "account",
    "--walltime": "walltime",
    "--job-extra": "job_extra",
    "--local-directory": "local_directory",
}


def check_option_conflicts(args: argparse.Namespace) -> None:
    """Refuse an option that the chosen kind of workers would ignore without a word: the local
    workers' with --scheduler or --cluster, a batch job's without --cluster."""
    given = {
        flag
        for flag, name in {**LOCAL_OPTIONS, **BATCH_OPTIONS}.items()
        if getattr(args, name) not in (None, False)  # False: a switch left off
    }
    elsewhere = "--scheduler" if args.scheduler else "--cluster" if args.cluster else None
    local = [flag for flag in LOCAL_OPTIONS if flag in given]
    if elsewhere and local:
        owner = "the scheduler's" if args.scheduler else "the jobs'"
        raise TokshardError(
            f"{local[0]} sets the local workers, which {elsewhere} does not start; drop it ({owner} "
            "workers have their own settings)"
        )
    batch = [flag for flag in BATCH_OPTIONS if flag in given]
    if batch and not args.cluster:
        raise TokshardError(
            f"{batch[0]} sets the batch jobs of --cluster slurm|pbs; add --cluster, or drop {batch[0]}"
        )


def batch_jobs(args: argparse.Namespace) -> BatchJobs | None:
    """What ``--cluster`` asks of the batch system (None: no batch system)."""
    check_option_conflicts(args)
    if not args.cluster:
        if args.print_job_script:
            raise TokshardError("--print-job-script needs --cluster slurm or --cluster pbs")
        return None
    if args.scheduler:
        raise TokshardError("give either --scheduler or --cluster, not both")
    from pipeline.run.cluster import require_batch_system

    check_no_control_characters(args)
    if args.walltime is not None:
        check_walltime(args.cluster, args.walltime)
    refuse_url(args.local_directory, "--local-directory")  # with --print-job-script too
    if not args.print_job_script:
        require_batch_system(args.cluster)
    return BatchJobs(
        system=args.cluster,
        jobs=args.jobs or default_of(BatchJobs, "jobs"),
        cores=args.cores,
        memory=args.memory,
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        job_extra=args.job_extra or [],
        local_directory=args.local_directory,
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.run.code_check import check_driver_libraries
    from pipeline.run.driver import RunOptions, prepare
    from pipeline.run.open_state import open_run_state
    from trainer.console import reporting

    batch = batch_jobs(args)
    if args.print_job_script:
        from pipeline.run.cluster import job_script

        print(job_script(batch, args.threads or default_of(Settings, "threads")))
        return 0

    recipe = recipe_from_args(args)
    out = recipe.settings.out
    if not out:
        raise TokshardError('no output folder: pass --out DIR (or set out = "..." in the recipe)')
    check_driver_libraries(encoder_libraries(recipe.settings.encoder))  # before --out is touched
    state = open_run_state(out)  # a recipe's out = "..." has not been through argparse: checked here
    if not (args.scheduler or args.cluster):
        from pipeline.run.cluster import check_local_workers

        check_local_workers(recipe.settings.workers, recipe.settings.threads)
    started = time.monotonic()
    options = RunOptions(
        workers=recipe.settings.workers,
        scheduler=args.scheduler,
        memory_limit=args.memory_limit,
        dashboard=args.dashboard,
        batch=batch,
    )
    path = prepare(recipe, state, options)
    doc = state.written_manifest or state.manifest_doc() or {}  # (already complete: read)
    with reporting(f"prepared {path}"):
        print(prepared_line(path, doc, time.monotonic() - started))
    return 0


def encoder_libraries(encoder: str) -> tuple[str, ...]:
    """The libraries a run with ``--encoder`` must import here: the reference always, and the
    back end named (auto: whichever the check picks, and it passes over one that fails)."""
    from pipeline.encoding import BACKEND_NAMES
    from pipeline.encoding.backend import REFERENCE

    return tuple(dict.fromkeys((REFERENCE, *([encoder] if encoder in BACKEND_NAMES else []))))


def prepared_line(path: Path | str, data: dict[str, Any], seconds: float) -> str:
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
        f"; {counted(routed['documents'], 'document')} ({routed['class']}) encoded by {routed['to']}"
        if routed
        else ""
    )
    return (
        f"{path}: {totals['tokens']:,} tokens, {counted(totals['documents'], 'document')}, "
        f"{counted(totals['shards'], 'shard')} ({seconds:.1f} s)"
        + (f"; {skipped_text(skipped)}" if skipped else "")
        + routed_text
    )


def recipe_from_args(args: argparse.Namespace) -> recipe_mod.Recipe:
    """The recipe `prepare` runs: a RECIPE file or --input files, command-line settings on top."""
    overrides: dict[str, Any] = {
        "tokenizer": args.tokenizer,
        "out": args.out,
        "workers": args.workers,
        "threads": args.threads,
        "encoder": args.encoder,
        "dtype": args.dtype,
        "eos_token": args.eos_token,
        "bos_token": args.bos_token,
        "shard_tokens": args.shard_tokens,
        "on_bad_record": args.on_bad_record,
    }
    if args.input and args.recipe:
        raise TokshardError("give either a RECIPE or --input files, not both")
    if args.input:
        return recipe_mod.from_dict(
            {"sources": {source_name(args): input_source(args)}}, "--input", overrides
        )
    if args.recipe:
        ad_hoc = [flag for flag, value in AD_HOC.items() if getattr(args, value) is not None]
        if ad_hoc:  # they were ignored: the run wrote the recipe's own splits and names
            raise TokshardError(
                f"{ad_hoc[0]} applies to --input files; a recipe sets it in its [sources.NAME] table"
            )
        path = recipe_path(args.recipe)
        return recipe_mod.load(path, overrides, mirror=args.mirror, bundled=is_bundled(path))
    raise TokshardError("nothing to prepare: give a RECIPE file or --input 'GLOB' (see --help)")


#: the options that describe --input files (flag -> its attribute)
AD_HOC = {
    "--text-field": "text_field",
    "--split": "split",
    "--name": "name",
    "--partition-bytes": "partition_bytes",
}


def input_source(args: argparse.Namespace) -> dict[str, Any]:
    """The one source of an ad hoc run: the --input files, as the options describe them."""
    from pipeline.sources.base import check_path_name
    from pipeline.sources.files import FilesSource

    files = FilesSource.defaults
    split = files["split"] if args.split is None else args.split
    check_path_name("split", split, "--split")  # it names a folder: checked before any work
    check_path_name("source", source_name(args), "--name")
    if args.mirror:
        raise TokshardError("--mirror applies to hub recipes, not to --input files")
    source: dict[str, Any] = {
        "type": "files",
        "paths": args.input,
        "text_field": files["text_field"] if args.text_field is None else args.text_field,
        "split": split,
    }
    if args.partition_bytes:
        source["partition_bytes"] = args.partition_bytes
    return source


def source_name(args: argparse.Namespace) -> str:
    return INPUT_SOURCE if args.name is None else args.name


def recipe_path(name: str) -> Path:
    """A recipe file by its path, or by the name of one bundled in ``manifests/``."""
    refuse_url(name, "recipe")
    path = Path(name)
    if path.exists():
        return path
    bundled = RECIPES_DIR / (name if name.endswith(".toml") else f"{name}.toml")
    if bundled.exists():
        return bundled
    known = ", ".join(bundled_recipes())
    raise TokshardError(f"recipe {name} does not exist (bundled recipes: {known or 'none'})")


def is_bundled(path: Path) -> bool:
    """Whether ``path`` is a recipe tokshard ships (its file is in the install)."""
    return path.resolve().parent == RECIPES_DIR


def bundled_recipes() -> list[str]:
    """The names of the recipes tokshard ships (in the wheel too), as `recipe_path` takes them."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def data_files_as_recipe(args: argparse.Namespace, words: list[str]) -> None:
    """`tokshard prepare a.jsonl b.jsonl` (a shell's expanded glob where the recipe goes): the
    files go with --input, one option for all of them."""
    data = args.recipe and Path(args.recipe).exists() and not args.recipe.lower().endswith(".toml")
    if data and not any(w.startswith("-") for w in words):
        files = " ".join(shlex.quote(f) for f in (args.recipe, *words))
        raise TokshardError(
            f"{args.recipe} is not a recipe (a .toml file); to tokenize data files, give them with "
            f"--input: tokshard prepare --input {files} --tokenizer TOKENIZER --out DIR"
        )


COMMAND = Command(
    name="prepare",
    summary="tokenize a recipe's corpora (or your files) into shards and a manifest; rerun to resume",
    example="tokshard prepare wikitext-103 --out data/wt103 --workers 8   # a bundled recipe, by name\n"
    "tokshard prepare --input 'corpus/*.jsonl.zst' --tokenizer tok/ --out data/mine",
    add_options=add_options,
    run=run,
    after_stop="rerun the same command to resume",
    stray_words=data_files_as_recipe,
)
