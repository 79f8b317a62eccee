"""Object storage: `prepare` to an S3 API server against `prepare` to a local folder, and the
time to the first training step from a manifest URL with a cold cache, a warm cache, and a
local manifest (plus the steady-state data wait of each).

The S3 server is moto's `moto_server` on 127.0.0.1 (tests/support.py), so the figures show
tokshard's own overhead (scratch, uploads, HTTP) without a network's bandwidth or latency.
Prepare runs alternate local / S3 so that both see the same machine load. With
``--faults-every N`` the S3 prepares go through tests/faulty_store.py, a proxy that answers
every Nth request itself with a fault (503 SlowDown, 500, a dropped connection, in turn), as a
store under load does: what the store client's retries cost, and that no byte changes.

    python bench/bench_store.py --corpus /work/bench-data/corpus-50.jsonl --mb 20 --rounds 2
    python bench/bench_store.py --corpus /work/bench-data/corpus-50.jsonl --mb 20 --rounds 2 --steps 0 --faults-every 7
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
# the repository before tests/, whose mirrored pipeline/ folders would shadow the package
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]

from corpus import gpt2_tokenizer  # noqa: E402
from faulty_store import faults_given, faulty_store  # noqa: E402
from support import moto_server  # noqa: E402


def head_corpus(src: Path, mb: int, out: Path) -> Path:
    """The first ``mb`` MB of a JSON-lines corpus, whole lines only."""
    limit = mb * 10**6
    with open(src, "rb") as f, open(out, "wb") as g:
        written = 0
        for line in f:
            if written + len(line) > limit:
                break
            g.write(line)
            written += len(line)
    return out


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def children_cpu_seconds() -> float:
    """CPU of every finished child of this process (each `tokshard` and its Dask workers)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def shard_hashes(manifest_text: str) -> list[str]:
    return [s["hash"] for s in json.loads(manifest_text)["shards"]]


def tokshard(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tokshard.cli", *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"tokshard {' '.join(args)} failed:\n{proc.stderr}")
    return time.perf_counter() - t0


def train_run(manifest: str, run_dir: Path, cache: Path, env: dict[str, str], steps: int) -> dict:
    """Wall time from launch to the first logged step, and the data wait after step 5."""
    args = [sys.executable, "-m", "tokshard.cli", "train", "--manifest", manifest, "--data-cache", str(cache)]
    args += ["--deepspeed", str(REPO / "trainer/configs/zero0-fp32.json"), "--model", "tiny"]
    args += ["--vocab-size", "50304", "--seq-len", "256", "--micro-batch", "8", "--steps", str(steps)]
    args += ["--log-every", "1", "--run-dir", str(run_dir)]
    metrics = run_dir / "metrics.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and '"loss"' in metrics.read_text():
            first = time.perf_counter() - t0
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"train failed:\n{err.decode()}")
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if '"loss"' in x]
    note = [ln for ln in out.decode().splitlines() if "data cache" in ln]
    return {
        "first_step_s": first,
        "wall_s": time.perf_counter() - t0,
        "steady_wait_frac": statistics.mean(r["data_wait_frac"] for r in rows[5:]),
        "cache": note[0] if note else "",
    }


def first_batch_s(manifest: str, cache: Path, seq_len: int = 256, micro: int = 8) -> float:
    """Seconds from opening a manifest (local or URL) to the first micro-batch gathered: the
    trainer's own data path (data cache included), without DeepSpeed's start-up around it."""
    from trainer import remote
    from trainer.data import WindowDataset, sources_with_split
    from trainer.sampler import MixtureSampler

    t0 = time.perf_counter()
    m, fetcher = remote.open_manifest(manifest, str(cache), None)
    sources = sources_with_split(m, "train")
    dataset = WindowDataset(m, "train", seq_len, sources)
    sampler = MixtureSampler(sources, dataset.windows, {s: 1.0 for s in sources}, 1234)
    if fetcher is not None:
        remote.start_downloads([fetcher], dataset, sampler, 0)
    draws = sampler.draw(np.arange(micro, dtype=np.int64))
    dataset.batch(draws.sources, draws.windows)
    took = time.perf_counter() - t0
    if fetcher is not None:
        fetcher.cache.close()
    return took


def _faults(endpoint: str, every: int | None) -> contextlib.AbstractContextManager[str | None]:
    return faulty_store(endpoint, every) if every else contextlib.nullcontext()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=20, help="use the first MB of the corpus")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (0: no training runs)")
    ap.add_argument(
        "--faults-every", type=int, help="the S3 prepares through a store failing every Nth request"
    )
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    data = head_corpus(a.corpus, a.mb, work / "corpus.jsonl")
    tok = gpt2_tokenizer(work / "tokenizer.json")
    with moto_server() as server, _faults(server.endpoint, a.faults_every) as faulty:
        env = server.env
        s3_env = {**env, "AWS_ENDPOINT_URL": faulty} if faulty else env
        bucket = server.new_bucket()
        common = ["--input", str(data), "--tokenizer", str(tok), "--workers", "2"]
        server_proc = psutil.Process(server.proc.pid)
        local_s, s3_s, identical = [], [], []
        for r in range(a.rounds):
            cpu0 = children_cpu_seconds()
            local_s.append(tokshard(["prepare", *common, "--out", str(work / f"local{r}")], env))
            cpu1, server0 = children_cpu_seconds(), cpu_seconds(server_proc)
            s3_s.append(tokshard(["prepare", *common, "--out", f"s3://{bucket}/run{r}"], s3_env))
            cpu2, server1 = children_cpu_seconds(), cpu_seconds(server_proc)
            s3_manifest = (
                server.client().get_object(Bucket=bucket, Key=f"run{r}/manifest.json")["Body"].read()
            )
            identical.append(
                shard_hashes((work / f"local{r}/manifest.json").read_text())
                == shard_hashes(s3_manifest.decode())
            )
            print(
                f"round {r}: local {local_s[-1]:.1f} s ({cpu1 - cpu0:.1f} s CPU), s3 {s3_s[-1]:.1f} s "
                f"({cpu2 - cpu1:.1f} s CPU in tokshard, {server1 - server0:.1f} s in the S3 server); "
                f"shards identical: {identical[-1]}"
                + (f"; {faults_given(faulty)} faults answered so far" if faulty else ""),
                flush=True,
            )
        url = f"s3://{bucket}/run0/manifest.json"
        os.environ.update(env)
        local_m = str(work / "local0/manifest.json")
        data_path = {
            "local manifest": [first_batch_s(local_m, work / "c") for _ in range(3)],
            "URL, cold cache": [first_batch_s(url, work / f"cold{i}") for i in range(3)],
            "URL, warm cache": [first_batch_s(url, work / "cold0") for _ in range(3)],
        }
        runs = {}
        if a.steps:
            runs = {
                "local manifest": train_run(
                    str(work / "local0/manifest.json"), work / "t-local", work / "c", env, a.steps
                ),
                "URL, cold cache": train_run(url, work / "t-cold", work / "cache", env, a.steps),
                "URL, warm cache": train_run(url, work / "t-warm", work / "cache", env, a.steps),
            }
    print(f"corpus: {data.stat().st_size / 1e6:.1f} MB, 2 workers, {a.rounds} rounds (local, s3 alternating)")
    print(f"prepare local folder: {', '.join(f'{x:.1f}' for x in local_s)} s")
    print(f"prepare s3 (moto):    {', '.join(f'{x:.1f}' for x in s3_s)} s")
    print(
        f"ratio s3 / local per round: {', '.join(f'{s / loc:.2f}' for s, loc in zip(s3_s, local_s, strict=True))}"
    )
    for name, times in data_path.items():
        print(f"first micro-batch, {name}: {', '.join(f'{t:.3f}' for t in times)} s (3 runs)")
    for name, r in runs.items():
        print(
            f"train {name}: first step {r['first_step_s']:.1f} s after launch, whole run {r['wall_s']:.1f} s, "
            f"steady data wait {100 * r['steady_wait_frac']:.2f}% {r['cache']}"
        )


if __name__ == "__main__":
    main()
