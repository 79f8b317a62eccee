"""`tokshard demo`: the whole job, end to end, offline, on a corpus the project writes itself.

Each stage runs the real piece a user would run by hand, in the same order:

1. corpus     WikiText, CC-News and BookCorpus look-alikes (``tokshard.demo_text``) written as
              parquet in the hub's own repo layouts, in one local mirror folder
2. tokenizer  a byte-level BPE trained on the mirror's train files (``tokshard tokenizer train``)
3. prepare    the OPT-mix recipe with ``mirror`` set per source, on an embedded Dask cluster
              (``tokshard prepare``), so the hub sources' code path is the one exercised
4. verify     every shard re-hashed and checked against its index (``tokshard verify``)
5. train      a small GPT with DeepSpeed (``tokshard train``) in a child process, evaluated on
              WikiText's validation split; CPU with fp32, or the GPU when there is one
6. report     the loss / tokens/s PNG (``tokshard plot``), the document-length histogram
              (``tokshard inspect --plot``), summary.json and summary.md

Rerunning on the same folder resumes: finished stages are kept (the corpus and tokenizer
files exist, ``prepare`` finds its complete manifest, training continues from its last
checkpoint or is already at its last step) and the report is written again.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.format.atomic import (
    DISK_FULL_ERRNOS,
    DiskFullError,
    check_writable_dir,
    held_by_another,
    holder_text,
    lock_file,
    name_holder,
    try_exclusive,
    write_bytes,
    write_json,
)
from pipeline.format.errors import TokshardError, VerifyError
from pipeline.run import progress
from pipeline.storage.ownership import claim_folder
from tokshard.commands.command import Terminated
from trainer.ds_config import AUTO, default_config
from trainer.run_folders import WRITER_LOCK

Log = Callable[[str], None]

DEMO_FILE = "demo.json"
#: held (a POSIX lock) by the demo running on a folder, and naming it
DEMO_LOCK = ".tokshard-demo.lock"
MIRROR = "hub-mirror"
RECIPE = "recipe.toml"
DATA = "data"
RUN = "run"
TRAIN_LOG = "train.log"
REPORT_PNG = "report.png"
LENGTHS_PNG = "doc_lengths.png"
DS_CONFIG = "deepspeed.json"
RECIPES_DIR = Path(__file__).resolve().parent.parent / "manifests"
#: the size `tokshard demo` runs unless told
DEFAULT_SIZE = "default"
#: local Dask workers for prepare when not told: this machine's cores, at most this many
MAX_WORKERS = 4
#: how much lower the last evaluation loss must be than the first for "the model learned"
LEARNED_MARGIN = 0.5


@dataclass(frozen=True)
class DemoSize:
    """How big the demo is: the corpus, the tokenizer and the training run."""

    wiki_articles: int  # train split; validation and test get a tenth each
    news_articles: int
    book_rows: int
    vocab_size: int
    model: str
    seq_len: int
    micro_batch: int
    steps: int
    lr: float
    warmup: int
    eval_every: int
    eval_samples: int
    log_every: int
    #: what the size is for, as `tokshard demo --help` shows it
    about: str


SIZES: dict[str, DemoSize] = {
    # the loss falls from ln(2048) = 7.6 to about 2
    "default": DemoSize(
        wiki_articles=1200, news_articles=1500, book_rows=40_000, vocab_size=2048, model="tiny",
        seq_len=128, micro_batch=16, steps=300, lr=3e-3, warmup=20, eval_every=50, eval_samples=64,
        log_every=10, about="about two minutes on two cores",
    ),
    "quick": DemoSize(
        wiki_articles=240, news_articles=300, book_rows=8_000, vocab_size=2048, model="tiny",
        seq_len=64, micro_batch=16, steps=60, lr=3e-3, warmup=6, eval_every=20, eval_samples=16,
        log_every=5, about="a fifth of the data and steps (what the tests run)",
    ),
}  # fmt: skip

# one seed per source and split, so no split repeats another's text
SEEDS = {("wikitext", "train"): 101, ("wikitext", "validation"): 102, ("wikitext", "test"): 103}
NEWS_SEED, BOOK_SEED = 201, 301


stderr_log = functools.partial(progress.stderr_log, prefix="tokshard demo")


# --- the folder and its record -------------------------------------------------------------


@dataclass
class DemoFolder:
    """Where every stage of one demo writes, and the record that makes a rerun a resume."""

    root: Path

    @property
    def mirror(self) -> Path:
        return self.root / MIRROR

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer" / "tokenizer.json"

    @property
    def recipe(self) -> Path:
        return self.root / RECIPE

    @property
    def data(self) -> Path:
        return self.root / DATA

    @property
    def manifest(self) -> Path:
        return self.data / "manifest.json"

    @property
    def run(self) -> Path:
        return self.root / RUN

    @property
    def train_log(self) -> Path:
        """The trainer's whole output, every attempt appended (beside ``run``, which the
        trainer's own files fill)."""
        return self.root / TRAIN_LOG

    def record(self) -> dict[str, Any]:
        path = self.root / DEMO_FILE
        if not path.exists():
            return {}
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TokshardError(
                f"{path} is damaged ({exc}); delete {self.root} to start the demo over"
            ) from exc
        stages = record.get("stages", {}) if isinstance(record, dict) else None
        if not isinstance(stages, dict) or not all(isinstance(s, dict) for s in stages.values()):
            raise TokshardError(
                f'{path} is damaged (not an object whose "stages" holds an object per stage); '
                f"delete {self.root} to start the demo over"
            )
        return record

    def save_record(self, record: dict[str, Any]) -> None:
        write_json(self.root / DEMO_FILE, record)


@contextlib.contextmanager
def one_demo(out: Path) -> Iterator[None]:
    """The folder, made if missing, locked for this demo to its end: a second demo started on it
    meanwhile is refused in one line naming the first, not left to write the same files (a
    holder that dies lets go at once). A folder that holds something else gets no lock file."""
    if out.exists() and not out.is_dir():
        raise TokshardError(f"--out {out} is a file; choose a folder for the demo")
    check_writable_dir(out, "--out")
    lock = out / DEMO_LOCK
    _refuse_if_running(lock, out)  # before judging the folder: a first demo's lock may be all it holds
    found = set(os.listdir(out)) - {DEMO_LOCK}
    if found:
        claim_folder(out, "--out", "the demo", DEMO_FILE)
    made = not lock.exists()
    fd = lock_file(lock)
    try:
        if not try_exclusive(fd, lock):
            _refuse_if_running(lock, out, held=True)
        name_holder(fd, lock)
        yield
    except BaseException:  # refused or stopped before it wrote: the lock file it made goes too
        if made and set(os.listdir(out)) - {DEMO_LOCK} == found:
            lock.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _refuse_if_running(lock: Path, out: Path, held: bool = False) -> None:
    if held or held_by_another(lock):
        raise TokshardError(
            f"another tokshard demo ({holder_text(lock)}) is running on {out}; wait for it or stop it"
        )


def open_folder(out: Path, size_name: str) -> tuple[DemoFolder, dict[str, Any]]:
    """The demo folder (locked by `one_demo`), refusing a demo of another size."""
    folder = DemoFolder(out)
    record = folder.record()
    if record and "size" not in record:  # a demo.json of the user's, or of another tool
        raise TokshardError(
            f"{out} holds a {DEMO_FILE} that tokshard demo did not write (it names no size); "
            "use another --out, or delete the folder to start over"
        )
    if record and record.get("size") != size_name:
        raise TokshardError(
            f"{out} holds a demo of size {record.get('size')!r}, not {size_name!r}; "
            "use another --out, or delete the folder to start over"
        )
    record.setdefault("size", size_name)
    record.setdefault("stages", {})
    folder.save_record(record)  # first, so a demo stopped in its first stage is still ours to resume
    return folder, record


# --- stage 1: the corpus, in the hub's layouts ---------------------------------------------


def write_mirror(mirror: Path, size: DemoSize) -> dict[str, int]:
    """Write the three repos as the hub serves them, into a temporary folder renamed at the end.

    Layouts (the ones ``docs/CORPORA.md`` lists):
    ``Salesforce/wikitext/wikitext-103-raw-v1/{train-0000N-of-00002,validation-...,test-...}.parquet``
    with the repo card naming them, ``vblagoje/cc_news/data/train-0000N-of-00002.parquet``, and
    ``bookcorpus/bookcorpus/plain_text/train/000N.parquet`` (its ``refs/convert/parquet`` branch).
    """
    from tokshard import demo_text

    tmp = mirror.with_name(mirror.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rows: dict[str, int] = {}

    wiki = tmp / "Salesforce" / "wikitext"
    _write_text(wiki / "README.md", WIKITEXT_CARD)
    for split in ("train", "validation", "test"):
        n = size.wiki_articles if split == "train" else max(4, size.wiki_articles // 10)
        lines = [""]  # the hub's files start with a blank row
        for article in demo_text.wiki_articles(SEEDS[("wikitext", split)], n):
            lines += [line if line != "\n" else "" for line in article]
        files = 2 if split == "train" else 1  # the real train split has two files, cut mid-article
        for i, chunk in enumerate(_cut(lines, files)):
            _parquet(wiki / f"wikitext-103-raw-v1/{split}-{i:05d}-of-{files:05d}.parquet", {"text": chunk})
        rows[f"wikitext/{split}"] = len(lines)

    news = list(demo_text.news_articles(NEWS_SEED, size.news_articles))
    columns = {key: [r[key] for r in news] for key in news[0]}
    for i, part in enumerate(_cut(list(range(len(news))), 2)):
        chunk = {key: [values[j] for j in part] for key, values in columns.items()}
        _parquet(tmp / f"vblagoje/cc_news/data/train-{i:05d}-of-00002.parquet", chunk)
    rows["cc_news/train"] = len(news)

    sentences = list(demo_text.book_sentences(BOOK_SEED, size.book_rows))
    for i, chunk in enumerate(_cut(sentences, 2)):
        _parquet(tmp / f"bookcorpus/bookcorpus/plain_text/train/{i:04d}.parquet", {"text": chunk})
    rows["bookcorpus/train"] = len(sentences)

    os.replace(tmp, mirror)
    return rows


WIKITEXT_CARD = """---
pretty_name: WikiText
configs:
- config_name: wikitext-103-raw-v1
  data_files:
  - split: test
    path: wikitext-103-raw-v1/test-*
  - split: train
    path: wikitext-103-raw-v1/train-*
  - split: validation
    path: wikitext-103-raw-v1/validation-*
---
# WikiText look-alike written by `tokshard demo` (the project's own text, not Wikipedia's)
"""


def _cut(items: list, parts: int) -> Iterator[list]:
    """``items`` in ``parts`` consecutive slices of nearly equal length (not aligned to documents)."""
    step = -(-len(items) // parts)
    for i in range(parts):
        yield items[i * step : (i + 1) * step]


def _parquet(path: Path, columns: dict[str, list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    # small row groups, as the hub's files have: partitions and reads work in row groups
    pq.write_table(pa.table(columns), path, row_group_size=2000)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- stage 2 and 3: tokenizer, recipe, prepare ---------------------------------------------


#: the train splits' files, as `tokshard tokenizer train --input` globs (relative to the mirror)
TRAIN_FILES = (
    "Salesforce/wikitext/wikitext-103-raw-v1/train-*.parquet",
    "vblagoje/cc_news/data/train-*.parquet",
    "bookcorpus/bookcorpus/plain_text/train/*.parquet",
)


def train_tokenizer(folder: DemoFolder, size: DemoSize) -> Path:
    """``tokshard tokenizer train`` on the mirror's train files (each one's ``text`` column)."""
    from pipeline.encoding.tokenizer import train

    tmp = folder.tokenizer.parent.with_name("tokenizer.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trained = train([str(folder.mirror / g) for g in TRAIN_FILES], size.vocab_size, tmp)
    shutil.rmtree(folder.tokenizer.parent, ignore_errors=True)
    os.replace(tmp, folder.tokenizer.parent)  # a stopped run never leaves half a tokenizer.json
    return folder.tokenizer.parent / trained.path.name


def tokenizer_command(mirror: str, out: str, size: DemoSize) -> str:
    """The `tokshard tokenizer train` line that makes the tokenizer `train_tokenizer` makes."""
    globs = " ".join(f"'{mirror}/{g}'" for g in TRAIN_FILES)
    return f"tokshard tokenizer train --input {globs} --vocab-size {size.vocab_size} --out {out}"


def recipe_text(folder: DemoFolder) -> str:
    """The bundled OPT-mix recipe, with this demo's tokenizer and ``mirror`` in every source."""
    base = tomllib.loads((RECIPES_DIR / "opt-mix.toml").read_text())
    lines = [
        "# manifests/opt-mix.toml as `tokshard demo` runs it: the same sources, read from the local",
        f"# mirror folder {MIRROR}/ (relative to this file) instead of the hub, and the demo's tokenizer.",
        f"#   tokshard prepare {folder.recipe} --out {folder.data}",
        f"tokenizer = {json.dumps(str(folder.tokenizer.resolve()))}",
    ]
    for name, section in base["sources"].items():
        lines += ["", f"[sources.{name}]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in {**section, "mirror": MIRROR}.items()]
    return "\n".join(lines) + "\n"


def run_prepare(folder: DemoFolder, workers: int | None, log: Log) -> Path:
    from pipeline import recipe
    from pipeline.run.driver import RunOptions, prepare

    write_bytes(folder.recipe, recipe_text(folder).encode())
    r = recipe.load(folder.recipe, {"out": str(folder.data)})
    options = RunOptions(workers=workers or min(os.cpu_count() or 1, MAX_WORKERS), progress_interval=2.0)
    return prepare(r, folder.data, options, log=lambda msg: log(f"  {msg}"))


def encode_rate(folder: DemoFolder) -> dict[str, float]:
    """Encoding throughput from the partitions' own records (kept across reruns)."""
    from pipeline.run.open_state import open_run_state

    state = open_run_state(folder.data)
    plan = state.load_plan()
    tokens = busy = 0.0
    for ck in state.load_checkpoints(plan).values() if plan else []:
        if ck is not None:
            tokens += ck.tokens
            busy += ck.busy_seconds
    return {"tokens": tokens, "busy_seconds": busy, "tokens_per_worker_s": tokens / busy if busy else 0.0}


# --- stage 5: training in a child process --------------------------------------------------


def train_args(folder: DemoFolder, size: DemoSize, resume: bool) -> list[str]:
    """The ``tokshard train`` command line of the demo (also what the summary shows)."""
    args = [
        *("--manifest", str(folder.manifest), "--deepspeed", str(folder.root / DS_CONFIG)),
        *("--model", size.model, "--seq-len", str(size.seq_len), "--micro-batch", str(size.micro_batch)),
        *("--steps", str(size.steps), "--lr", str(size.lr), "--warmup", str(size.warmup)),
        *("--eval-every", str(size.eval_every), "--eval-samples", str(size.eval_samples)),
        *("--log-every", str(size.log_every), "--save", str(folder.run)),
        *("--save-every", str(size.eval_every)),  # an interrupted demo resumes from here
    ]
    return [*args, "--resume"] if resume else args


def trained_step(folder: DemoFolder) -> int:
    """The step of the newest checkpoint (0: none yet)."""
    from trainer.checkpoint.state import latest_tag, read_state

    if latest_tag(folder.run) is None:
        return 0
    return read_state(folder.run)[1].step


def run_training(folder: DemoFolder, size: DemoSize, log: Log) -> None:
    """``python -m tokshard train`` as a single-process DeepSpeed run, its console lines echoed.

    A child process keeps DeepSpeed's process group and globals out of this one. Its full
    output goes to ``train.log``; the step and eval lines are shown as they come. Without a
    checkpoint the run starts over: what an earlier attempt left in ``run`` (its record,
    nothing to resume) goes first, since a new run writes only into an empty folder. The
    child stops with the demo (`_stop_child`, `_dies_with` for a SIGKILL), so a rerun finds
    no trainer still writing there; one that is (from a demo of an older version) is refused.
    """
    _refuse_if_trained_now(folder)
    resume = trained_step(folder) > 0
    write_json(folder.root / DS_CONFIG, default_config(bf16=AUTO))
    if not resume:
        shutil.rmtree(folder.run, ignore_errors=True)
    cmd = [sys.executable, "-m", "tokshard", "train", *train_args(folder, size, resume)]
    shown = re.compile(r"^(step|eval|tokshard(?!: error:))")  # its error: in the demo's own line
    last_error = ""
    with open(folder.train_log, "a") as logfile:
        logfile.write(f"$ {' '.join(cmd)}\n")
        logfile.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_child_env(),
            bufsize=1,
            process_group=0,  # a terminal's Ctrl-C reaches the demo alone, which passes it on once
            preexec_fn=_dies_with(os.getpid()),
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                logfile.write(line)
                logfile.flush()  # `tail -f train.log` follows the run as it goes
                if shown.match(line):
                    log(f"  {line.rstrip()}")
                if line.startswith("tokshard: error:"):
                    last_error = line.removeprefix("tokshard: error:").strip()
            code = proc.wait()
        except BaseException as stop:  # Ctrl-C, SIGTERM, SIGHUP: the trainer saves its step and stops
            _stop_child(proc, stop, logfile)
            raise
    if code != 0 and re.search(r"disk full|no space left", last_error, re.IGNORECASE):
        raise disk_full(folder.run, f" while training ({last_error.split(';')[0]})")
    if code != 0:
        why = last_error or f"exit status {code}"
        raise TokshardError(f"training failed ({why}); the full log is {folder.train_log}")


def _refuse_if_trained_now(folder: DemoFolder) -> None:
    """A trainer still writing into ``run`` keeps it: the folder is neither removed under it
    nor given a second trainer."""
    if held_by_another(folder.run / WRITER_LOCK):
        raise TokshardError(
            f"a `tokshard train` of an earlier demo is still writing into {folder.run} (see "
            f"{folder.run / WRITER_LOCK}); wait for it to end or stop it, then rerun the demo"
        )


#: the environment the demo was started with, before its prepare's Dask workers (whose nannies
#: set their pre-spawn variables in this process again each time one restarts)
_STARTED_WITH = dict(os.environ)


def _child_env() -> dict[str, str]:
    """The trainer's environment: the user's with tokshard importable, the same whether or not
    this demo ran its prepare."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {
        k: v for k, v in _STARTED_WITH.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", "1")  # the demo's small model: one thread an op, as torchrun's ranks
    return env


#: prctl(2) option: the signal a process gets when its parent dies
PR_SET_PDEATHSIG = 1


def _dies_with(parent: int) -> Callable[[], None] | None:
    """What the trainer runs before its program (Linux): SIGTERM when the demo dies, however it
    dies (a SIGKILL runs none of the demo's own code), so no orphan keeps writing into ``run``;
    SIGTERM lets it save its step. A demo already gone by then ends it at once."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return set_death_signal


def _stop_child(proc: subprocess.Popen, stop: BaseException, logfile: Any) -> None:
    """Pass the demo's stop on to the trainer and wait for it, its output still logged (a full
    pipe would block it); a second stop meanwhile kills it."""
    signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT
    if isinstance(stop, (Terminated, KeyboardInterrupt)):
        proc.send_signal(signum)
    else:  # an error of the demo itself: nothing is left running
        proc.terminate()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            logfile.write(line)
        proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


# --- the whole demo ------------------------------------------------------------------------


def run(out: Path, size_name: str = DEFAULT_SIZE, workers: int | None = None, log: Log = stderr_log) -> dict:
    """Run (or resume) the demo into ``out``; returns the summary it also writes there."""
    try:
        with one_demo(out):
            return _run(out, size_name, workers, log)
    except DiskFullError as exc:  # its line says to rerun a command the demo runs for the user
        raise disk_full(out) from exc
    except OSError as exc:  # pyarrow's parquet writer, train.log: the demo's own writes
        if exc.errno not in DISK_FULL_ERRNOS and "No space left on device" not in str(exc):
            raise
        raise disk_full(out) from exc


def disk_full(path: Path, doing: str = "") -> TokshardError:
    """The demo's one line for a full disk: it is the demo, not a stage's own command, that the
    user reruns, and the rerun resumes."""
    return TokshardError(
        f"no space left on the device of {path}{doing}; free space and rerun the demo: it resumes"
    )


def _run(out: Path, size_name: str, workers: int | None, log: Log) -> dict:
    size = SIZES[size_name]
    folder, record = open_folder(out, size_name)
    stages: dict[str, dict[str, Any]] = record["stages"]
    started = time.monotonic()

    def stage(name: str, what: str, done: bool, work: Callable[[], Any], recheck: bool = False) -> Any:
        """Run a stage, or keep what an earlier run made (``recheck``: let the stage say so itself)."""
        if done:
            log(f"{name}: already done ({what}); kept")
            stages.setdefault(name, {})["ran"] = False
            return work() if recheck else None
        log(f"{name}: {what}")
        t0 = time.monotonic()
        result = work()
        stages[name] = {"seconds": round(time.monotonic() - t0, 2), "ran": True}
        folder.save_record(record)
        return result

    rows = stage(
        "corpus",
        f"WikiText, CC-News and BookCorpus look-alikes in the hub's layouts -> {folder.mirror}",
        folder.mirror.is_dir(),
        lambda: write_mirror(folder.mirror, size),
    )
    if rows is not None:
        record["rows"] = rows
    stage(
        "tokenizer",
        f"byte-level BPE, vocabulary {size.vocab_size} -> {folder.tokenizer}",
        _tokenizer_reads(folder, log),
        lambda: train_tokenizer(folder, size),
    )
    stage(
        "prepare",
        f"OPT-mix recipe on the mirror, embedded Dask cluster -> {folder.data}",
        _prepared(folder),
        lambda: run_prepare(folder, workers, log),
        recheck=True,  # prepare itself confirms the folder is complete for this recipe (no cluster)
    )
    stage("verify", f"re-hash every shard of {folder.manifest}", False, lambda: _verify(folder, log))
    stage(
        "train",
        f"{size.model} GPT, {size.steps} steps of {size.micro_batch} x {size.seq_len} tokens with DeepSpeed "
        f"-> {folder.run}",
        trained_step(folder) >= size.steps,
        lambda: run_training(folder, size, log),
    )
    summary = stage(
        "report", "loss curve, tokens/s, document lengths, summary", False, lambda: report(folder)
    )
    summary["stages"] = stages
    summary["seconds_this_run"] = round(time.monotonic() - started, 1)
    write_json(folder.root / "summary.json", summary)
    write_bytes(folder.root / "summary.md", summary_markdown(summary, size).encode())
    folder.save_record(record)
    return summary


def _tokenizer_reads(folder: DemoFolder, log: Log) -> bool:
    """Whether the tokenizer stage is done: a tokenizer.json that no longer reads (edited, or
    damaged on disk) is trained again, as a deleted one is, instead of failing in prepare."""
    from tokenizers import Tokenizer

    if not folder.tokenizer.is_file():
        return False
    try:
        Tokenizer.from_file(str(folder.tokenizer))
    except Exception:  # tokenizers raises a bare Exception for a file it cannot parse
        log(f"tokenizer: {folder.tokenizer} does not read as a tokenizer; training it again")
        return False
    return True


def _prepared(folder: DemoFolder) -> bool:
    from pipeline.format import manifest

    if not folder.manifest.is_file():
        return False
    try:
        manifest.load(folder.manifest)
    except TokshardError:
        return False
    return True


def _verify(folder: DemoFolder, log: Log) -> None:
    from pipeline.format.verify import verify

    faults, totals = verify(folder.manifest)
    if faults:
        raise VerifyError(f"{len(faults)} fault(s) in {folder.data}, first: {faults[0]}")
    log(f"  OK: {totals['shards']} shards, {totals['tokens']:,} tokens match the manifest")


def report(folder: DemoFolder) -> dict[str, Any]:
    """The PNGs and the summary numbers (everything read back from files, so a rerun agrees)."""
    from pipeline.format import manifest as manifest_mod
    from tokshard.inspection_plot import plot_doc_lengths
    from trainer.report import write_report

    training = write_report(folder.run, folder.root / REPORT_PNG, title="tokshard demo")
    plot_doc_lengths(folder.manifest, folder.root / LENGTHS_PNG)
    m = manifest_mod.load(folder.manifest)
    sources = {
        name: {
            split: {k: s[k] for k in ("documents", "tokens", "shards")} for split, s in info["splits"].items()
        }
        for name, info in m.data["sources"].items()
    }
    return {
        "sources": sources,
        "totals": m.data["totals"],
        "encode": {**encode_rate(folder), "encoder": m.data.get("encoder", {}).get("name")},
        "training": training,
        "learned": _learned(training),
        "paths": {
            "folder": str(folder.root),
            "mirror": str(folder.mirror),
            "tokenizer": str(folder.tokenizer),
            "recipe": str(folder.recipe),
            "data": str(folder.data),
            "manifest": str(folder.manifest),
            "run": str(folder.run),
            "report_png": str(folder.root / REPORT_PNG),
            "doc_lengths_png": str(folder.root / LENGTHS_PNG),
        },
    }


def _learned(training: dict[str, Any]) -> bool:
    first, last = training.get("first_eval_loss"), training.get("last_eval_loss")
    return first is not None and last is not None and last < first - LEARNED_MARGIN


# --- what the user reads -------------------------------------------------------------------


def _fmt_s(record: dict[str, Any] | None) -> str:
    if not record or "seconds" not in record:
        return "-"
    return f"{record['seconds']:.1f} s" + ("" if record.get("ran", True) else " (earlier run)")


def summary_markdown(s: dict[str, Any], size: DemoSize) -> str:
    t, tr, enc, p = s["totals"], s["training"], s["encode"], s["paths"]
    lines = [
        "# tokshard demo",
        "",
        f"Prepared **{t['tokens']:,} tokens** in {t['documents']:,} documents and **{t['shards']} shards**, "
        f"then trained a `{size.model}` GPT for {tr['steps']} steps.",
        "",
        "| source | split | documents | tokens | shards |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, splits in s["sources"].items():
        for split, row in splits.items():
            lines.append(f"| {name} | {split} | {row['documents']:,} | {row['tokens']:,} | {row['shards']} |")
    lines += [
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| encode tokens/s (per busy worker, {enc['encoder']}) | {enc['tokens_per_worker_s']:,.0f} |",
        f"| train tokens/s (median) | {tr['tokens_per_s']:,.0f} |",
        f"| data-wait fraction (mean) | {100 * tr['data_wait_frac']:.2f} % |",
        f"| eval loss, first -> last | {_num(tr['first_eval_loss'])} -> {_num(tr['last_eval_loss'])} |",
        f"| eval perplexity, first -> last | {_num(tr['first_eval_ppl'])} -> {_num(tr['last_eval_ppl'])} |",
    ]
    lines += [f"| wall time: {name} | {_fmt_s(rec)} |" for name, rec in s["stages"].items()]
    lines += ["", "Files:", ""]
    lines += [f"- {key}: `{value}`" for key, value in p.items()]
    lines += [
        "",
        "Run the pieces yourself:",
        "",
        "```bash",
        tokenizer_command(p["mirror"], str(Path(p["tokenizer"]).parent), size),
        f"tokshard prepare {p['recipe']} --out {p['data']}",
        f"tokshard verify {p['manifest']}",
        f"tokshard inspect {p['manifest']} --plot",
        f"tokshard train {' '.join(train_args(DemoFolder(Path(p['folder'])), size, resume=True))}",
        f"tokshard plot {p['run']}",
        "```",
    ]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3f}"


def console_summary(s: dict[str, Any]) -> str:
    t, tr, enc = s["totals"], s["training"], s["encode"]
    per_source = ", ".join(
        f"{name} {sum(r['tokens'] for r in splits.values()):,}" for name, splits in s["sources"].items()
    )
    return "\n".join(
        [
            f"tokens per source: {per_source} ({t['shards']} shards)",
            f"encode: {enc['tokens_per_worker_s']:,.0f} tokens/s per worker; train: "
            f"{tr['tokens_per_s']:,.0f} tokens/s, data wait {100 * tr['data_wait_frac']:.2f}%",
            f"eval loss {_num(tr['first_eval_loss'])} -> {_num(tr['last_eval_loss'])} "
            f"(perplexity {_num(tr['first_eval_ppl'])} -> {_num(tr['last_eval_ppl'])}) after {tr['steps']} steps",
            f"report: {s['paths']['report_png']}, {s['paths']['doc_lengths_png']}, "
            f"{Path(s['paths']['folder']) / 'summary.md'}",
        ]
    )
