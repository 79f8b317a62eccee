"""`tokshard verify`: re-hash every shard and check each .idx against its .bin and the manifest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline import manifest as manifest_mod
from pipeline.errors import TokshardError, VerifyError
from pipeline.shard_reader import Shard
from pipeline.shard_writer import file_hash
from pipeline.store import is_url
from pipeline.tokenizer import sha256_file


def verify(path: str | Path, on_shard: Callable[[int, int], None] | None = None) -> tuple[list[str], dict]:
    """All faults found (empty: the folder is exactly what its manifest says) and totals.

    A manifest that exists but cannot be read, or that points outside its folder, is a
    fault too (VerifyError, exit 1); only a missing one is a usage error. A URL is checked
    in the store, shard by shard (`pipeline.store_run.verify_in_store`).
    """
    if is_url(path):
        from pipeline.store_run import verify_in_store

        return verify_in_store(str(path), on_shard)
    found = manifest_mod.find(path)
    try:
        m = manifest_mod.load(found)
    except VerifyError:
        raise
    except TokshardError as exc:
        raise VerifyError(str(exc)) from exc
    faults: list[str] = []
    if not m.checksum_ok():
        faults.append(f"{m.path}: manifest was edited after prepare wrote it (checksum mismatch)")
    try:
        if sha256_file(m.tokenizer_path) != m.data["tokenizer"]["sha256"]:
            faults.append(f"{m.tokenizer_path}: tokenizer differs from the one the shards were made with")
    except OSError as exc:
        faults.append(f"{m.tokenizer_path}: {exc.strerror}")
    totals = {"tokens": 0, "documents": 0, "bytes": 0, "shards": len(m.shards)}
    for i, entry in enumerate(m.shards):
        faults += check_shard(entry, m.dtype, m.eos_id)
        totals["tokens"] += entry.tokens
        totals["documents"] += entry.documents
        totals["bytes"] += entry.bytes
        if on_shard:
            on_shard(i + 1, len(m.shards))
    if totals != m.data["totals"]:
        faults.append(f"{m.path}: totals {m.data['totals']} disagree with the shard list {totals}")
    return faults, totals


def check_shard(entry: manifest_mod.ShardEntry, dtype: str, eos_id: int) -> list[str]:
    name = entry.rel_path
    for p in (entry.bin_path, entry.idx_path):
        if not p.is_file():
            return [f"{name}: {p.name} is missing"]
    size = entry.bin_path.stat().st_size
    if size != entry.bytes:
        return [f"{name}: .bin is {size} bytes, the manifest says {entry.bytes} (truncated or replaced)"]
    faults = []
    if file_hash(entry.bin_path) != entry.hash:
        faults.append(f"{name}: .bin content hash differs from the manifest (corrupted)")
    if file_hash(entry.idx_path) != entry.idx_hash:
        faults.append(f"{name}: .idx content hash differs from the manifest (corrupted)")
    shard = Shard(entry.bin_path, dtype)
    problems = shard.problems(eos_id)
    faults += [f"{name}: {p}" for p in problems]
    if not problems:
        if len(shard) != entry.documents:
            faults.append(f"{name}: .idx lists {len(shard)} documents, the manifest {entry.documents}")
        if int(shard.index.lengths.sum()) != entry.tokens:
            faults.append(
                f"{name}: .idx holds {int(shard.index.lengths.sum())} tokens, the manifest {entry.tokens}"
            )
    return faults


def verify_or_raise(path: str | Path) -> None:
    faults, _ = verify(path)
    if faults:
        raise TokshardError(faults[0])
