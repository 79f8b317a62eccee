"""Inputs in an object store: a folder of files uploaded to an S3 API server, then one `tokshard`
command run against them at two commits, alternated (`bench_ab.py`), directly and through a
proxy that waits a network's round trip before each answer (tests/faulty_store.py).

The server is moto's `moto_server` on 127.0.0.1; without the proxy a request costs only this
machine's own time, so the latency rows show what a real store's round trips (S3 from EC2:
tens of milliseconds) do to a run of many small objects. ``BUCKET`` in the command stands for
the bucket holding the folder under ``in/``.

    python bench/bench_store_inputs.py --files /work/bench-data/small-2000 --latency-ms 0 20 \\
        --before main --rounds 2 -- prepare --input 's3://BUCKET/in/*.jsonl' \\
        --tokenizer /work/main/.vocabs/llama3/tokenizer.json --out OUT --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the repository before tests/, whose mirrored pipeline/ folders would shadow the package
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from faulty_store import faulty_store  # noqa: E402
from support import moto_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=Path, required=True, help="folder uploaded under s3://BUCKET/in/")
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with moto_server() as server:
        bucket = server.new_bucket()
        s3 = server.client()
        for path in sorted(args.files.iterdir()):
            s3.upload_file(str(path), bucket, f"in/{path.name}")
        for ms in args.latency_ms:
            with (
                faulty_store(server.endpoint, every=0, latency=ms / 1000)
                if ms
                else contextlib.nullcontext(server.endpoint) as endpoint
            ):
                print(f"\n## round trip {ms:.0f} ms before each answer ({endpoint})", flush=True)
                env = {**os.environ, **server.env, "AWS_ENDPOINT_URL": endpoint}
                argv = [sys.executable, str(REPO / "bench" / "bench_ab.py"), "--before", args.before]
                argv += ["--rounds", str(args.rounds), "--", *[a.replace("BUCKET", bucket) for a in command]]
                subprocess.run(argv, env=env, check=True)


if __name__ == "__main__":
    main()
