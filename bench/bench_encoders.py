"""Fast encoder benchmark: `prepare` with --encoder tiktoken vs tokenizers, side by side.

On one corpus and tokenizer, in one run:

* the equivalence check `auto` runs before a job (its cost and verdict), and whether the two
  encoders give identical ids on every document (texts in memory);
* ``--repeats`` rounds, each measured back to back so that all its figures share the
  machine's conditions (this box is shared; each round prints its load average):
  - tiktoken's ceiling: all texts in memory, one thread, no I/O (its own ``encode_ordinary``
    and the numpy-buffer call `prepare` makes; the faster counts), wall and CPU time; and
    the texts split over ``--workers`` processes encoding at once, measured right before
    and right after the tiktoken `prepare` (this VM's speed drifts by 10-20% within
    minutes: the mean of the two brackets the run it is compared with);
  - `tokshard prepare` for each encoder, as a user runs it: a fresh CLI process joining with
    --scheduler a fresh local cluster made exactly as `prepare` makes its own
    (`pipeline.run.cluster.connect`, ``--workers`` processes). Whole command: wall time, CPU
    time of the CLI and the workers, each worker's peak RSS (VmHWM of the worker process).
    Steady state: a worker plugin clocks every partition task (process CPU and wall time
    of the worker while it runs); the partition tasks (after the warm-up task that builds
    each worker's encoder) give the rate a long corpus runs at, with reading, encoding,
    shard writing and commits all included;
  - tiktoken `prepare` once more as a user runs it by default, booting its own local
    workers (``--workers``, no --scheduler): wall time only, since its workers cannot be
    watched;
* that both encoders wrote byte-identical shards in every round;
* with ``--also-partition-bytes``, tiktoken `prepare` again at each of these partition sizes
  (what the automatic size trades: per-task costs against balance at the end).

With ``--native``, instead: the default `prepare` (auto, which takes fastokens) against
``--encoder tiktoken``, side by side in each round, with fastokens' own one-thread ceiling
(texts in memory, the flat-buffer call `prepare` makes, in `prepare`'s 1 MB batches), and
the same text joined into documents of ``--long-mb`` MB each, through the default `prepare`
(long documents against ordinary ones, same text), and the default `prepare` once more booting
its own workers (whole-run rate with the cluster's start). Every `prepare` finds the static half of
its equivalence check kept from an earlier run (`pipeline.encoding.check_cache`), as every run
after a tokenizer's first does; bench_startup.py measures the first run's extra cost.

    python bench/kernel_corpus.py                       # once: corpus + 50k BPE
    python bench/bench_encoders.py --workers 2 --repeats 3
    python bench/bench_encoders.py --native --repeats 2 --corpus CORPUS --tokenizer TOK
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson
import psutil
from distributed.diagnostics.plugin import WorkerPlugin

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from checkout import compile_bytecode  # noqa: E402  (bench/, beside this script)

from pipeline.encoding.backend import TokenizersEncoder  # noqa: E402
from pipeline.encoding.selection import decide  # noqa: E402
from pipeline.encoding.tiktoken_backend import TiktokenEncoder  # noqa: E402
from pipeline.format import manifest  # noqa: E402
from pipeline.run import cluster  # noqa: E402
from pipeline.run.cluster import MALLOC_ENV  # noqa: E402
from pipeline.run.open_state import open_run_state  # noqa: E402

DATA = Path("/work/bench-data/fast")
ENCODERS = ("tokenizers", "tiktoken")  # the two this benchmark compares


class TaskClock(WorkerPlugin):
    """Process CPU and wall seconds of each task on a worker, in the order they ran."""

    name = "tokshard-bench-task-clock"

    def setup(self, worker) -> None:
        self.running: dict[str, tuple[float, float]] = {}
        self.done: list[tuple[str, float, float]] = []

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish == "executing":
            self.running[str(key)] = (time.process_time(), time.perf_counter())
        elif start == "executing" and str(key) in self.running:
            cpu, wall = self.running.pop(str(key))
            self.done.append((str(key), time.process_time() - cpu, time.perf_counter() - wall))


def clocked_tasks(dask_worker) -> list[tuple[str, float, float]]:
    return dask_worker.plugins[TaskClock.name].done


def peak_rss_mib() -> float:
    """This process's peak resident memory: VmHWM, which (unlike getrusage's ru_maxrss,
    kept across fork and exec) starts afresh in each worker process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def print_nothing(message: str) -> None:
    pass


def load_texts(corpus: Path, part: int = 0, parts: int = 1) -> list[str]:
    """The corpus's texts, or the ``part``-th of ``parts`` shares of about equal size (only
    those parsed): each line goes to the share with the fewest bytes so far. Every other
    line would leave one share 1.2% larger on the prose corpora, and the larger share sets
    the wall time of a parallel ceiling."""
    texts, sizes = [], [0] * parts
    with open(corpus, "rb") as f:
        for line in f:
            share = sizes.index(min(sizes))
            sizes[share] += len(line)
            if share == part:
                texts.append(json.loads(line)["text"])
    return texts


def timed(run) -> dict:
    """One pass over the texts held in memory, on this thread: wall and CPU seconds.

    The garbage collector is off while it runs: millions of id lists kept alive would
    otherwise make Python's collections, not the encoder, the thing measured."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        ids = run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()
    return {"wall_s": wall, "cpu_s": cpu, "tokens": sum(len(x) for x in ids), "ids": ids}


_barrier = None


def _join_barrier(barrier) -> None:
    global _barrier
    _barrier = barrier


def _encode_share(job: tuple[str, str, int, int]) -> dict:
    """One of W processes: its share of the texts in memory, started with the others."""
    corpus, tokenizer, part, parts = job
    texts = load_texts(Path(corpus), part, parts)
    fast = TiktokenEncoder(tokenizer, threads=1, confirm=False)
    _barrier.wait()
    r = timed(lambda: fast.encode_batch(texts))
    r.pop("ids")
    return r


def parallel_ceiling(args) -> dict:
    """tiktoken in ``--workers`` processes at once, texts in memory: what this machine gives
    W encoders side by side (two vCPUs need not give twice one)."""
    ctx = multiprocessing.get_context("spawn")
    jobs = [(str(args.corpus), str(args.tokenizer), i, args.workers) for i in range(args.workers)]
    with ctx.Pool(args.workers, initializer=_join_barrier, initargs=(ctx.Barrier(args.workers),)) as pool:
        parts = pool.map(_encode_share, jobs)
    return {
        "tokens": sum(r["tokens"] for r in parts),
        "wall_s": max(r["wall_s"] for r in parts),
        "cpu_s": sum(r["cpu_s"] for r in parts),
    }


def _bracket(args, rep: int) -> dict:
    r = parallel_ceiling(args)
    print(f"#{rep} ceiling tiktoken, {args.workers} processes at once: {_rates(r)}")
    return r


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def steady_state(out: Path, clocks: dict[str, list]) -> dict:
    """Tokens, CPU and wall seconds of every partition task: each worker builds its encoder
    before them, in the warm-up task `prepare` sends it (left out, as is all start-up)."""
    state = open_run_state(out)
    plan = state.load_plan()
    by_index = {p.index: p for p in plan.partitions}
    tokens = cpu = wall = 0.0
    for tasks in clocks.values():
        for key, task_cpu, task_wall in tasks:
            if not key.startswith("tokshard-"):  # the warm-up
                continue
            index = int(key.rsplit("-", 2)[-2])
            tokens += state.load_checkpoint(by_index[index]).tokens
            cpu += task_cpu
            wall += task_wall
    return {"tokens": tokens, "cpu_s": cpu, "wall_s": wall}


def run_prepare(encoder: str, args, partition_bytes: int | None = None) -> dict:
    """One `tokshard prepare` joining, with --scheduler, a fresh local cluster made exactly as
    `prepare` makes its own (pipeline.run.cluster.connect), so the workers can be watched."""
    partition_bytes = args.partition_bytes if partition_bytes is None else partition_bytes
    out = args.work / f"out-{encoder}"
    with cluster.connect(
        workers=args.workers, scheduler=None, threads=1, memory_limit=None, log=print_nothing
    ) as client:
        client.register_plugin(TaskClock())
        idle = client.run(peak_rss_mib)
        workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        workers_cpu, driver_cpu = _cpu_seconds(workers), _children_cpu()
        load = os.getloadavg()[0]
        wall = _run_cli(encoder, args, out, partition_bytes, ["--scheduler", client.scheduler.address])
        workers_cpu, driver_cpu = _cpu_seconds(workers) - workers_cpu, _children_cpu() - driver_cpu
        peak = client.run(peak_rss_mib)
        clocks = client.run(clocked_tasks)
    m = manifest.load(out / "manifest.json")
    return {
        "encoder": encoder,
        "chosen": m.data["encoder"]["name"],
        "tokens": m.data["totals"]["tokens"],
        "wall_s": wall,
        "cpu_s": workers_cpu + driver_cpu,
        "driver_cpu_s": driver_cpu,
        "load_average": load,
        "steady": steady_state(out, clocks),
        "worker_peak_rss_mib": sorted(peak.values()),
        "worker_idle_rss_mib": sorted(idle.values()),
        "shard_hashes": [s.hash for s in m.shards],
        "partitions": len(open_run_state(out).load_plan().partitions),
    }


def run_prepare_own_workers(args, encoder: str = "tiktoken") -> dict:
    """`prepare` as a user types it on one machine: it boots its own local workers."""
    out = args.work / "out-own-workers"
    wall = _run_cli(encoder, args, out, args.partition_bytes, ["--workers", str(args.workers)])
    m = manifest.load(out / "manifest.json")
    return {"tokens": m.data["totals"]["tokens"], "wall_s": wall, "shard_hashes": [s.hash for s in m.shards]}


def _run_cli(encoder: str, args, out: Path, partition_bytes: int, where: list[str]) -> float:
    """Wall seconds of one fresh `tokshard prepare` process writing ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "tokshard.cli", "prepare", "--input", str(args.corpus),
        "--tokenizer", str(args.tokenizer), "--out", str(out), "--encoder", encoder, *where,
    ]  # fmt: skip
    if partition_bytes:  # 0: the default, partition_bytes = "auto"
        cmd += ["--partition-bytes", str(partition_bytes)]
    os.sync()  # the runs before wrote up to a GB: not this run's writeback to wait behind
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"prepare --encoder {encoder} failed:\n{proc.stderr}")
    return wall


def fastokens_ceiling(
    corpus: Path, tokenizer: Path, processes: int = 1, as_published: bool = False, with_reading: bool = False
) -> dict:
    """fastokens on one thread, texts in memory, in the ~1 MB batches `prepare` encodes, in a
    fresh process with a worker's allocator settings (`pipeline.run.cluster.MALLOC_ENV`), as
    each worker is: in a process that has encoded before (an earlier round, the check) the same
    measurement ran up to 1.4x faster (bench/RESULTS.md). With ``processes``, that many at once,
    each on its share of the texts, started together: what this machine gives that many
    encoders side by side (the wall time is the slowest one's). ``as_published``: fastokens
    built from the file's own text, as a user of fastokens alone builds it (only the id gaps
    it refuses closed), not as `FastokensEncoder` builds it (`rewritten_text`). ``with_reading``:
    the timed pass also reads its share of the file's lines (page cache) and parses each with
    orjson, as `prepare`'s JSON-lines reader does: what any `prepare` pays at the least, start-up,
    writing and everything else left out (a floor under its wall time)."""
    saved = {k: os.environ.get(k) for k in MALLOC_ENV}
    os.environ.update({k: os.environ.get(k) or v for k, v in MALLOC_ENV.items()})  # a worker's allocator
    try:
        ctx = multiprocessing.get_context("spawn")
        jobs = [
            (str(corpus), str(tokenizer), i, processes, as_published, with_reading) for i in range(processes)
        ]
        with ctx.Pool(processes, initializer=_join_barrier, initargs=(ctx.Barrier(processes),)) as pool:
            parts = pool.map(_fastokens_pass, jobs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return {
        "tokens": sum(r["tokens"] for r in parts),
        "wall_s": max(r["wall_s"] for r in parts),
        "cpu_s": sum(r["cpu_s"] for r in parts),
    }


def _fastokens_pass(job: tuple[str, str, int, int, bool, bool]) -> dict:
    from pipeline.encoding.fastokens_backend import FastokensEncoder, encoding_part
    from pipeline.encoding.tokenizer import read_spec

    corpus, tokenizer, part, parts, as_published, with_reading = job
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    if as_published:
        import fastokens

        fast = FastokensEncoder.wrapping(
            fastokens.Tokenizer.from_json_str(encoding_part(read_spec(tokenizer)))
        )
    else:
        fast = FastokensEncoder(tokenizer, threads=1, confirm=False)
    if with_reading:
        lines = line_share(Path(corpus), part, parts)
        _barrier.wait()
        r = timed(
            lambda: [fast.encode_flat(b)[0] for b in in_batches(orjson.loads(x)["text"] for x in lines)]
        )
    else:
        batches = list(in_batches(load_texts(Path(corpus), part, parts)))
        _barrier.wait()
        r = timed(lambda: [fast.encode_flat(b)[0] for b in batches])
    r.pop("ids")
    return r


def in_batches(texts: Iterable[str]) -> Iterator[list[str]]:
    """Texts grouped as `prepare` groups them for the encoder (about ``BATCH_CHARS`` each)."""
    from pipeline.encoding.documents import BATCH_CHARS

    batch, chars = [], 0
    for t in texts:
        batch.append(t)
        chars += len(t)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def line_share(corpus: Path, part: int, parts: int) -> Iterator[bytes]:
    """The lines of the ``part``-th of ``parts`` byte ranges of the file (a line belongs to
    the range it starts in), read as they are consumed."""
    size = corpus.stat().st_size
    start, end = size * part // parts, size * (part + 1) // parts
    with open(corpus, "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()  # the rest of the line that started in the range before
        while f.tell() < end:
            line = f.readline()
            if not line:
                break
            yield line


def read_through(path: Path) -> None:
    """Read a file once, untimed: a round's first run must not be the only one to read it from disk."""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def long_corpus(texts: list[str], out: Path, megabytes: int) -> Path:
    """The same texts joined (by a blank line) into documents of about ``megabytes`` MB each."""
    if out.exists():
        return out
    docs, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= megabytes * 1_000_000:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    tmp.rename(out)
    return out


def native(args, texts: list[str]) -> None:
    """The --native rounds: default prepare vs tiktoken, fastokens' ceiling, long documents."""
    import copy

    long_args = copy.copy(args)
    long_args.corpus = long_corpus(texts, args.work / f"long-{args.long_mb}mb.jsonl", args.long_mb)
    read_through(long_args.corpus)  # in the page cache, as the ordinary corpus is once loaded above
    long_args.work = args.work / "long"
    long_args.work.mkdir(exist_ok=True)
    for name in ("fastokens", "tiktoken"):  # every timed run then finds its check kept, as a
        started = time.perf_counter()  # user's runs after a tokenizer's first do (ENCODERS.md)
        decide(name, str(args.tokenizer), lambda: texts[:64])
        print(f"{name} check (kept for the runs below): {time.perf_counter() - started:.2f} s")
    rows = []
    for rep in range(args.repeats):
        ceiling = fastokens_ceiling(args.corpus, args.tokenizer)
        print(f"#{rep} ceiling fastokens, 1 thread: {_rates(ceiling)}")
        tik_ceiling = timed(lambda: TiktokenEncoder(str(args.tokenizer), confirm=False).encode_batch(texts))
        tik_ceiling.pop("ids")
        print(f"#{rep} ceiling tiktoken, 1 thread: {_rates(tik_ceiling)}")
        auto = run_prepare("auto", args)
        own = run_prepare_own_workers(args, "auto")
        print(f"#{rep} prepare default, booting its own {args.workers} workers: wall {own['wall_s']:.1f} s")
        tik = run_prepare("tiktoken", args)
        long = run_prepare("auto", long_args)
        for label, r in (("default", auto), ("tiktoken", tik), ("default, long documents", long)):
            print(
                f"#{rep} prepare {label} -> {r['chosen']} (load {r['load_average']:.1f}): {r['tokens']:,} tokens, "
                f"wall {r['wall_s']:.1f} s, steady {_rates(r['steady'])}; worker peak RSS "
                f"{', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mib'])} MiB"
            )
        ceil2 = 2 * ceiling["tokens"] / ceiling["wall_s"] * args.workers / 2
        rate = {
            k: r["tokens"] / r["wall_s"]
            for k, r in (("auto", auto), ("own", own), ("tik", tik), ("long", long))
        }
        steady = {
            k: r["steady"]["tokens"] / r["steady"]["wall_s"] * args.workers
            for k, r in (("auto", auto), ("long", long))
        }
        rows.append(
            {
                "load": auto["load_average"],
                "ceil_ratio_cpu": (ceiling["tokens"] / ceiling["cpu_s"])
                / (tik_ceiling["tokens"] / tik_ceiling["cpu_s"]),
                "auto": rate["auto"],
                "tik": rate["tik"],
                "speedup": tik["wall_s"] / auto["wall_s"],
                "ceil": ceil2,
                "whole_vs_ceil": rate["auto"] / ceil2,
                "own": rate["own"],
                "own_vs_ceil": rate["own"] / ceil2,
                "steady_vs_ceil": steady["auto"] / ceil2,
                "long_vs_ordinary": rate["long"] / rate["auto"],
                "long_steady_vs_ordinary": steady["long"] / steady["auto"],
                "rss": max(auto["worker_peak_rss_mib"] + long["worker_peak_rss_mib"]),
                "identical": auto["shard_hashes"] == tik["shard_hashes"],
            }
        )
    w = args.workers
    print()
    print(
        f"| round (load) | default `prepare` (fastokens) | `--encoder tiktoken` | speed-up | fastokens / "
        f"tiktoken, 1 thread, per CPU-s | fastokens 1 thread x {w} | default / ceiling: whole, steady, whole "
        f"booting its own workers | long docs / ordinary: whole, steady | "
        f"peak RSS per worker | shards identical |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for i, r in enumerate(rows):
        print(
            f"| {i} ({r['load']:.1f}) | {r['auto'] / 1e6:.2f} M tok/s | {r['tik'] / 1e6:.2f} M tok/s | "
            f"{r['speedup']:.2f}x | {r['ceil_ratio_cpu']:.2f}x | {r['ceil'] / 1e6:.2f} M tok/s | {r['whole_vs_ceil']:.2f}, "
            f"{r['steady_vs_ceil']:.2f}, {r['own_vs_ceil']:.2f} | {r['long_vs_ordinary']:.2f}, {r['long_steady_vs_ordinary']:.2f} | "
            f"{r['rss']:.0f} MiB | {'yes' if r['identical'] else 'NO'} |"
        )
    # a one-thread ceiling alone on the machine moves more from round to round than the runs do
    auto, own = statistics.median(r["auto"] for r in rows), statistics.median(r["own"] for r in rows)
    ceil = statistics.median(r["ceil"] for r in rows)
    print(
        f"\nmedians over the rounds: fastokens 1 thread x {w} {ceil / 1e6:.2f} M tok/s; default `prepare` "
        f"{auto / 1e6:.2f} M tok/s ({auto / ceil:.2f} of it), booting its own workers {own / 1e6:.2f} M tok/s "
        f"({own / ceil:.2f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=DATA / "kernel.jsonl")
    ap.add_argument("--tokenizer", type=Path, default=DATA / "bpe50k" / "tokenizer.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--partition-bytes", type=int, default=4 << 20, help="0: prepare's default (auto)")
    ap.add_argument("--work", type=Path, default=DATA / "work")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument(
        "--also-partition-bytes",
        type=int,
        nargs="*",
        default=[],
        help="each round, also run tiktoken `prepare` with these partition sizes (0 = auto)",
    )
    ap.add_argument(
        "--check-docs",
        type=int,
        default=0,
        help="compare both encoders' ids (and time tokenizers in memory) on the first N documents "
        "only; 0 = all (a 500 MB corpus needs about 20 GB for all)",
    )
    ap.add_argument(
        "--native", action="store_true", help="default prepare (fastokens) vs tiktoken, long docs"
    )
    ap.add_argument("--long-mb", type=int, default=9, help="--native: size of each long document")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    compile_bytecode(REPO)  # each `prepare` below runs tokshard as .ci/setup installs it
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["FASTOKENS_BPE_THREADS"] = "1"

    texts = load_texts(args.corpus)
    utf8 = sum(len(t.encode("utf-8")) for t in texts)
    print(f"corpus {args.corpus}: {len(texts):,} documents, {utf8 / 1e6:.1f} MB of UTF-8 text")
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    if args.native:
        native(args, texts)
        return

    started = time.perf_counter()
    decision = decide("auto", str(args.tokenizer), lambda: texts[:64])
    name, reason = decision.name, decision.reason
    print(f"auto check: {name} in {time.perf_counter() - started:.2f} s ({reason})")

    fast = TiktokenEncoder(str(args.tokenizer), threads=1)
    ref = TokenizersEncoder(str(args.tokenizer), threads=1)
    ordinary = fast.encoding.encode_ordinary
    ceilings = {
        "tiktoken": lambda: [ordinary(t) for t in texts],  # tiktoken's own API
        "tiktoken-numpy": lambda: fast.encode_batch(texts),  # the buffer API prepare uses
    }
    checked = texts[: args.check_docs] if args.check_docs else texts
    fast_ids = timed(lambda: [ordinary(t) for t in checked])["ids"]
    r = timed(lambda: ref.encode_batch(checked))
    same = sum(a == b for a, b in zip(r.pop("ids"), fast_ids, strict=True))
    del fast_ids
    results: dict = {"tokenizers_ceiling": r, "identical_documents": same, "rounds": []}
    print(f"ceiling tokenizers: {_rates(r)}; identical ids on {same:,}/{len(checked):,} documents")

    for rep in range(args.repeats):
        rnd: dict = {"ceiling": {}, "prepare": {}}
        for key, run in ceilings.items():
            r = timed(run)
            r.pop("ids")
            rnd["ceiling"][key] = r
            print(f"#{rep} ceiling {key}: {_rates(r)}")
        brackets = rnd["parallel_ceilings"] = []
        for enc in ENCODERS:
            if enc == "tiktoken":  # the 2-process ceiling right before and right after it
                brackets.append(_bracket(args, rep))
            rnd["prepare"][enc] = r = run_prepare(enc, args)
            print(
                f"#{rep} prepare {enc} (load {r['load_average']:.1f}): {r['tokens']:,} tokens, "
                f"wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s ({r['driver_cpu_s']:.1f} s CLI); steady "
                f"state {_rates(r['steady'])}; worker peak RSS "
                f"{', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mib'])} MiB "
                f"(idle {', '.join(f'{x:.0f}' for x in r['worker_idle_rss_mib'])})"
            )
        rnd["own_workers"] = r = run_prepare_own_workers(args)
        print(f"#{rep} prepare tiktoken booting its own workers: wall {r['wall_s']:.1f} s")
        brackets.append(_bracket(args, rep))
        rnd["parallel_ceiling"] = {
            key: statistics.mean(b[key] for b in brackets) for key in ("tokens", "wall_s", "cpu_s")
        }
        rnd["sizes"] = {}
        for pb in args.also_partition_bytes:
            rnd["sizes"][pb] = r = run_prepare("tiktoken", args, pb)
            print(
                f"#{rep} prepare tiktoken, partition_bytes {pb or 'auto'} ({r['partitions']} partitions): "
                f"wall {r['wall_s']:.1f} s, {r['tokens'] / r['wall_s'] / 1e6:.2f} M tok/s"
            )
        results["rounds"].append(rnd)
    hashes = {
        tuple(r["shard_hashes"])
        for rnd in results["rounds"]
        for r in (*rnd["prepare"].values(), rnd["own_workers"])
    }
    results["identical_shards"] = len(hashes) == 1
    print()
    print(summary(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _rates(r: dict) -> str:
    return (
        f"{r['tokens']:,.0f} tokens, {r['tokens'] / r['wall_s'] / 1e6:.2f} M tokens/s over wall time, "
        f"{r['tokens'] / r['cpu_s'] / 1e6:.2f} M per CPU-second"
    )


def summary(results: dict, args) -> str:
    """The RESULTS.md table: every round (all measured back to back), then the median."""
    w = args.workers
    rows = []
    for rnd in results["rounds"]:
        ceil_wall = max(r["tokens"] / r["wall_s"] for r in rnd["ceiling"].values())
        ceil_cpu = max(r["tokens"] / r["cpu_s"] for r in rnd["ceiling"].values())
        par = rnd["parallel_ceiling"]["tokens"] / rnd["parallel_ceiling"]["wall_s"]
        own = rnd["own_workers"]
        h, t = rnd["prepare"]["tokenizers"], rnd["prepare"]["tiktoken"]
        hs, ts = h["steady"], t["steady"]
        rows.append(
            {
                "load": (h["load_average"] + t["load_average"]) / 2,
                "h_wall": h["tokens"] / h["wall_s"],
                "t_wall": t["tokens"] / t["wall_s"],
                "speedup_wall": h["wall_s"] / t["wall_s"],
                "speedup_cpu": h["cpu_s"] / t["cpu_s"],
                "speedup_steady": (ts["tokens"] / ts["cpu_s"]) / (hs["tokens"] / hs["cpu_s"]),
                "ceil_x_w": ceil_wall * w,
                "whole_vs_ceiling": t["tokens"] / t["wall_s"] / (ceil_wall * w),
                "steady_vs_ceiling_wall": ts["tokens"] / ts["wall_s"] / ceil_wall,
                "steady_vs_ceiling_cpu": ts["tokens"] / ts["cpu_s"] / ceil_cpu,
                "par": par,
                "steady_vs_par_wall": ts["tokens"] / ts["wall_s"] * w / par,
                "whole_vs_par": t["tokens"] / t["wall_s"] / par,
                "own_vs_par": own["tokens"] / own["wall_s"] / par,
                "h_rss": max(h["worker_peak_rss_mib"]),
                "t_rss": max(t["worker_peak_rss_mib"]),
            }
        )
    lines = [
        f"| round (load) | tokenizers `prepare` | tiktoken `prepare` | tiktoken speed-up: wall, CPU, "
        f"steady CPU | tiktoken ceiling: 1 thread x {w}, {w} processes | tiktoken `prepare` / 1 thread "
        f"x {w}: whole, steady wall, steady CPU | tiktoken `prepare` / {w} processes: whole, whole booting "
        f"its own workers, steady | "
        f"peak RSS per worker: tokenizers, tiktoken |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def line(label: str, r: dict, b: str = "") -> str:
        return (
            f"| {label} | {r['h_wall'] / 1e6:.2f} M tok/s | {r['t_wall'] / 1e6:.2f} M tok/s | "
            f"{b}{r['speedup_wall']:.2f}x{b}, {r['speedup_cpu']:.2f}x, {r['speedup_steady']:.2f}x | "
            f"{r['ceil_x_w'] / 1e6:.2f}, {r['par'] / 1e6:.2f} M tok/s | {r['whole_vs_ceiling']:.2f}, "
            f"{r['steady_vs_ceiling_wall']:.2f}, {r['steady_vs_ceiling_cpu']:.2f} | "
            f"{r['whole_vs_par']:.2f}, {r['own_vs_par']:.2f}, {b}{r['steady_vs_par_wall']:.2f}{b} | "
            f"{r['h_rss']:.0f}, {r['t_rss']:.0f} MiB |"
        )

    for i, r in enumerate(rows):
        lines.append(line(f"{i} ({r['load']:.1f})", r))
    lines.append(line("**median**", {k: statistics.median(r[k] for r in rows) for k in rows[0]}, "**"))
    if rows and results["rounds"][0]["sizes"]:
        lines += ["", _sizes_table(results, args)]
    hc = results["tokenizers_ceiling"]
    lines += [
        "",
        f"tokenizers' own ceiling (in memory, 1 thread): {hc['tokens'] / hc['wall_s'] / 1e6:.2f} M tokens/s, "
        f"{hc['tokens'] / hc['cpu_s'] / 1e6:.2f} M per CPU-second. "
        f"Identical ids on {results['identical_documents']:,} documents in memory; "
        f"shards byte-identical across encoders and rounds: {results['identical_shards']}.",
    ]
    return "\n".join(lines)


def _sizes_table(results: dict, args) -> str:
    """tiktoken `prepare` per partition size, against the 2-process ceiling of its round."""
    first = results["rounds"][0]
    runs0 = [first["prepare"]["tiktoken"], *first["sizes"].values()]
    sizes = [args.partition_bytes, *first["sizes"]]
    heads = [
        f"{f'{pb >> 20} MiB' if pb else 'auto'} ({r['partitions']} partitions)"
        for pb, r in zip(sizes, runs0, strict=True)
    ]
    lines = [
        f"| round | tiktoken `prepare` / {args.workers} processes at once: " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    per: list[list[float]] = []
    for i, rnd in enumerate(results["rounds"]):
        par = rnd["parallel_ceiling"]["tokens"] / rnd["parallel_ceiling"]["wall_s"]
        runs = [rnd["prepare"]["tiktoken"], *rnd["sizes"].values()]
        per.append([r["tokens"] / r["wall_s"] / par for r in runs])
        lines.append(f"| {i} | " + " | ".join(f"{x:.2f}" for x in per[-1]) + " |")
    medians = [statistics.median(col) for col in zip(*per, strict=True)]
    lines.append("| **median** | " + " | ".join(f"**{x:.2f}**" for x in medians) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
