"""What provenance costs on disk: each prepared folder's sidecars (``NAME.origin``) against its
shards' token bytes, from the manifest's own counts, and per document.

    python bench/bench_provenance.py DIR [DIR ...]

The cost in prepare time is measured with ``bench/bench_ab.py`` against the commit before
provenance (bench/RESULTS.md gives both commands).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.format import manifest as manifest_mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args()
    print("| folder | documents | tokens/doc | shard bytes | sidecar bytes | share | bytes/doc |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for folder in args.folders:
        m = manifest_mod.load(folder)
        raw = m.data["shards"]
        docs = sum(s["documents"] for s in raw)
        shard_bytes = sum(s["bytes"] for s in raw)
        side = sum(s.get("origin_bytes", 0) for s in raw)
        tokens = sum(s["tokens"] for s in raw)
        print(
            f"| {folder.name} | {docs:,} | {tokens / docs:,.0f} | {shard_bytes:,} | {side:,} "
            f"| {100 * side / shard_bytes:.3f}% | {side / docs:.2f} |"
        )


if __name__ == "__main__":
    main()
