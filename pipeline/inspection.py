"""`tokshard inspect`: what a prepared folder holds, per source and split, with a sample.

A split's ``tokens`` are every token of its shards, each document's EOS included (as the
manifest and the trainer count them); its per-document statistics (``doc_tokens``) leave the
EOS out, as the length histogram does: a document's own tokens. Both outputs say so
(``COUNTED``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError
from pipeline.format.manifest import ShardEntry
from pipeline.format.shard_reader import Shard, ShardFormatError
from pipeline.format.verify import files_faults
from pipeline.storage.data_cache import load_manifest

#: what the counts of a report hold, as its JSON says it (``counted``) and its text labels them
COUNTED = {
    "tokens": "every token of the shards, each document's EOS included",
    "doc_tokens": "the tokens of one document, its EOS excluded (a BOS the tokenizer adds included)",
}


def doc_lengths(m: manifest_mod.Manifest, source: str, split: str) -> np.ndarray:
    """Tokens per document (EOS excluded), read from the .idx files only (a manifest URL's
    fetched alone: `ready`)."""
    parts = [_index(m, e).lengths for e in m.select(source, split)]
    return (np.concatenate(parts) - 1) if parts else np.zeros(0, dtype=np.int32)


def _index(m: manifest_mod.Manifest, entry: ShardEntry):
    """A shard's parsed .idx, as many documents and tokens as the manifest says it holds; a
    missing or damaged one is one line naming it (exit 1). (A flipped length showed as a
    document of a million tokens in the statistics.) A local .bin's size is checked too; a
    manifest URL's .bin stays in its store unless its tokens are read (`_first_document`)."""
    path = entry.idx_path
    dtype = m.dtype
    if m.ready is not None:
        m.ready(path)
    try:
        index = Shard(entry.bin_path, dtype).index
    except (OSError, ShardFormatError) as exc:
        if m.ready is None:
            _refuse_files_faults(entry)  # a file gone, a pointer, a pipe: said as `verify` says it
        raise _damaged(path, exc) from exc
    if (
        m.ready is None and _size(entry.bin_path) != entry.bytes
    ):  # a .bin gone or cut left its .idx shown as sound
        _refuse_files_faults(entry)
    tokens = int(index.lengths.sum(dtype=np.int64))
    if (index.documents, tokens) != (entry.documents, entry.tokens):
        raise _damaged(
            path,
            ValueError(
                f"it describes {index.documents:,} documents of {tokens:,} tokens, the manifest "
                f"{entry.documents:,} of {entry.tokens:,}"
            ),
        )
    return index


def _refuse_files_faults(entry: ShardEntry) -> None:
    faults = files_faults(entry)
    if faults:
        raise DataError(f"{faults[0]} (`tokshard verify` shows every fault)")


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _first_document(m: manifest_mod.Manifest, entry: ShardEntry) -> np.ndarray:
    """The shard's first document, where the .bin is the one the manifest names (a replaced
    one would show its bytes as a sample of text: `_index` has looked at its local files, and
    the data cache checks a URL's .bin as it fetches it)."""
    dtype = m.dtype
    if m.ready is not None:
        m.ready(entry.bin_path)
    try:
        return np.array(Shard(entry.bin_path, dtype).document(0)[:-1])
    except (OSError, ValueError, IndexError) as exc:  # missing, empty or short .bin
        raise _damaged(entry.bin_path, exc) from exc


def _damaged(path: Path, exc: Exception) -> DataError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).removeprefix(f"{path}: ")
    return DataError(f"{path}: {reason}; run `tokshard verify` to see every fault, re-run `tokshard prepare`")


def summary(
    path: str | Path, sample_chars: int = 300, cache: tuple[str | None, str | None] = (None, None)
) -> dict[str, Any]:
    """What ``tokshard inspect`` shows of one manifest; a URL's files go through the data cache
    ``cache`` names (folder and size limit; None: the default, no limit)."""
    m = load_manifest(path, *cache)
    tok = None
    report: dict[str, Any] = {
        # a stored manifest is named as the user named it, a local one by its file
        "manifest": str(path) if getattr(m, "source_url", None) else str(m.path),
        "dtype": m.dtype,
        "totals": m.data["totals"],
        # counts a hand edit changed are shown as they are, but not as the run's own
        "edited_after_prepare": not m.checksum_ok(),
        "encoder": m.data.get("encoder"),
        "counted": COUNTED,
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
                # none of its text's tokens, only its framing: the tokenizer dropped every character
                framing = 0 if m.bos_id is None else 1
                row["documents_without_text"] = int(np.count_nonzero(lengths == framing))
                first = m.select(source, split)[0]
                ids = _first_document(m, first)
                if tok is None:
                    from pipeline.encoding.tokenizer import load

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
        f"{t['shards']} shard{'' if t['shards'] == 1 else 's'} ({report['dtype']})"
    ]
    encoder = report.get("encoder")
    if isinstance(encoder, dict):  # a manifest of an older tokshard may have none
        line = f"  encoder: {encoder.get('library')} {encoder.get('version')} ({encoder.get('reason')})"
        routed = encoder.get("routed")
        if isinstance(routed, dict):
            line += f"; {routed.get('documents', 0):,} documents sent to {routed.get('to')}: {routed.get('class')}"
        lines.append(line)
    for source, info in report["sources"].items():
        for split, row in info["splits"].items():
            skipped = sum(row["skipped"].values())
            lines.append(
                f"  {source}/{split} ({info['type']}): {row['documents']:,} docs, {row['tokens']:,} tokens with EOS, "
                f"{row['shards']} shard{'' if row['shards'] == 1 else 's'}; dropped empty {row['dropped_empty']:,}, skipped bad {skipped:,}"
            )
            if "doc_tokens" in row:
                d = row["doc_tokens"]
                lines.append(
                    f"    tokens/doc without EOS: min {d['min']}, median {d['median']:g}, mean {d['mean']:g}, "
                    f"p99 {d['p99']:g}, max {d['max']}"
                )
                if row["documents_without_text"]:
                    lines.append(
                        f"    note: {row['documents_without_text']:,} documents hold none of their text's tokens "
                        "(the tokenizer dropped every character: one whose vocabulary lacks them, such as a "
                        "byte-level BPE trained without its byte alphabet)"
                    )
                sample = row["sample"].replace("\n", "\\n")
                lines.append(f"    sample: {sample[:200]!s}")
    if report["edited_after_prepare"]:
        lines.append(
            "  note: the manifest was edited after `tokshard prepare` wrote it (its checksum does not match): "
            "these counts are the edit's; `tokshard verify` says what differs"
        )
    return "\n".join(lines)
