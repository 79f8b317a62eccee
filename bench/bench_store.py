"""Object storage: `prepare` to an S3 API server against `prepare` to a local folder, and the
time to the first training step from a manifest URL with a cold cache, a warm cache, and a
local manifest (plus the steady-state data wait of each).

The S3 server is moto's `moto_server` on 127.0.0.1 (tests/s3_support.py), so the figures show
tokshard's own overhead (scratch, uploads, HTTP) without a network's bandwidth or latency.
Prepare runs alternate local / S3 so that both see the same machine load.

    python bench/bench_store.py --corpus /work/bench-data/corpus-50.jsonl --mb 20 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from corpus import gpt2_tokenizer  # noqa: E402
from s3_support import moto_server  # noqa: E402


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


def tokshard(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"tokshard {' '.join(args)} failed:\n{proc.stderr}")
    return time.perf_counter() - t0


def train_run(manifest: str, run_dir: Path, cache: Path, env: dict[str, str], steps: int) -> dict:
    """Wall time from launch to the first logged step, and the data wait after step 5."""
    args = [sys.executable, "-m", "pipeline.cli", "train", "--manifest", manifest, "--data-cache", str(cache)]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=20, help="use the first MB of the corpus")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    data = head_corpus(a.corpus, a.mb, work / "corpus.jsonl")
    tok = gpt2_tokenizer(work / "tokenizer.json")
    with moto_server() as server:
        env = server.env
        bucket = server.new_bucket()
        common = ["--input", str(data), "--tokenizer", str(tok), "--workers", "2"]
        local_s, s3_s = [], []
        for r in range(a.rounds):
            local_s.append(tokshard(["prepare", *common, "--out", str(work / f"local{r}")], env))
            s3_s.append(tokshard(["prepare", *common, "--out", f"s3://{bucket}/run{r}"], env))
            print(f"round {r}: local {local_s[-1]:.1f} s, s3 {s3_s[-1]:.1f} s", flush=True)
        url = f"s3://{bucket}/run0/manifest.json"
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
    for name, r in runs.items():
        print(
            f"train {name}: first step {r['first_step_s']:.1f} s after launch, whole run {r['wall_s']:.1f} s, "
            f"steady data wait {100 * r['steady_wait_frac']:.2f}% {r['cache']}"
        )


if __name__ == "__main__":
    main()
