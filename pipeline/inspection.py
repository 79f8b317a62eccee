"""`tokshard inspect`: what a prepared folder holds, per source and split, with a sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline import manifest as manifest_mod
from pipeline.shard_reader import Shard
from pipeline.store import is_url


def doc_lengths(m: manifest_mod.Manifest, source: str, split: str) -> np.ndarray:
    """Tokens per document (EOS excluded), read from the .idx files only."""
    parts = [Shard(e.bin_path, m.dtype).index.lengths for e in m.select(source, split)]
    return (np.concatenate(parts) - 1) if parts else np.zeros(0, dtype=np.int32)


def load_any(path: str | Path) -> manifest_mod.Manifest:
    """A local manifest, or a manifest URL read through the node's data cache (all shards)."""
    if is_url(path):
        from pipeline.store_cache import open_url_manifest

        return open_url_manifest(str(path))
    return manifest_mod.load(path)


def summary(path: str | Path, sample_chars: int = 300) -> dict[str, Any]:
    m = load_any(path)
    tok = None
    report: dict[str, Any] = {
        "manifest": str(path) if is_url(path) else str(m.path),
        "dtype": m.dtype,
        "totals": m.data["totals"],
        "sources": {},
    }
    for source, info in m.data["sources"].items():
        splits = {}
        for split, stats in info["splits"].items():
            lengths = doc_lengths(m, source, split)
            row = dict(stats)
            if len(lengths):
                row["doc_tokens"] = {
                    "min": int(lengths.min()),
                    "median": float(np.median(lengths)),
                    "mean": round(float(lengths.mean()), 1),
                    "p99": float(np.percentile(lengths, 99)),
                    "max": int(lengths.max()),
                }
                first = m.select(source, split)[0]
                ids = Shard(first.bin_path, m.dtype).document(0)[:-1]
                if tok is None:
                    from pipeline.tokenizer import load

                    tok = load(m.tokenizer_path)
                text = tok.decode(ids[:sample_chars].tolist(), skip_special_tokens=False)
                row["sample"] = text[:sample_chars]
            splits[split] = row
        report["sources"][source] = {"type": info["type"], "splits": splits}
    return report


def render(report: dict[str, Any]) -> str:
    t = report["totals"]
    lines = [
        f"{report['manifest']}: {t['tokens']:,} tokens, {t['documents']:,} documents, "
        f"{t['shards']} shards ({report['dtype']})"
    ]
    for source, info in report["sources"].items():
        for split, row in info["splits"].items():
            skipped = sum(row["skipped"].values())
            lines.append(
                f"  {source}/{split} ({info['type']}): {row['documents']:,} docs, {row['tokens']:,} tokens, "
                f"{row['shards']} shards; dropped empty {row['dropped_empty']:,}, skipped bad {skipped:,}"
            )
            if "doc_tokens" in row:
                d = row["doc_tokens"]
                lines.append(
                    f"    tokens/doc: min {d['min']}, median {d['median']:g}, mean {d['mean']:g}, "
                    f"p99 {d['p99']:g}, max {d['max']}"
                )
                sample = row["sample"].replace("\n", "\\n")
                lines.append(f"    sample: {sample[:200]!s}")
    return "\n".join(lines)
