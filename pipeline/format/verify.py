"""The one verifier: re-hash every shard and check each .idx against its .bin and the manifest.

`tokshard verify` reports every fault (`verify`); `tokshard train --verify` stops at the
first (`first_fault`). Both check each shard with `check_shard`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.format import lfs_pointer
from pipeline.format import manifest as manifest_mod
from pipeline.format.content_hash import file_hash, sha256_file
from pipeline.format.errors import DataError, VerifyError
from pipeline.format.file_kind import not_a_file
from pipeline.format.provenance import ProvenanceError
from pipeline.format.provenance import read as read_origins
from pipeline.format.shard_reader import Shard

#: what to do about a shard that fails the checks: a rerun of a finished prepare checks its
#: shards' sizes, not their contents, so a damaged one of the right size stays until removed
REMAKE = (
    "delete the damaged files and re-run `tokshard prepare` with the same --out: it makes missing "
    "shards again"
)


def verify(path: str | Path, on_shard: Callable[[int, int], None] | None = None) -> tuple[list[str], dict]:
    """All faults found (empty: the folder is exactly what its manifest says) and totals.

    A manifest that exists but cannot be read, or that points outside its folder, is a
    fault too (VerifyError, exit 1); a missing one, or another file given for it (a
    tokenizer.json), is a usage error. A URL is checked
    in the store, shard by shard, by `pipeline.storage.verify_place.verify` (with
    `check_shard` on each).
    """
    found = manifest_mod.find(path)
    try:
        m = manifest_mod.load(found)
    except VerifyError:
        raise
    except DataError as exc:
        raise VerifyError(str(exc)) from exc
    faults: list[str] = []
    if "checksum" not in m.data:
        faults.append(f"{m.path}: manifest {manifest_mod.NO_CHECKSUM}")
    elif not m.checksum_ok():
        faults.append(f"{m.path}: manifest was edited after prepare wrote it (checksum mismatch)")
    try:
        if sha256_file(m.tokenizer_path) != m.data["tokenizer"]["sha256"]:
            faults.append(f"{m.tokenizer_path}: tokenizer differs from the one the shards were made with")
    except OSError as exc:
        faults.append(f"{m.tokenizer_path}: {exc.strerror}")
    shard_faults, totals = check_shards(
        m, str(m.path), lambda entry: check_shard(entry, m.dtype, m.eos_id, m.bos_id), on_shard
    )
    return faults + shard_faults, totals


def check_shards(
    m: manifest_mod.Manifest,
    where: str,
    check_one: Callable[[manifest_mod.ShardEntry], list[str]],
    on_shard: Callable[[int, int], None] | None = None,
) -> tuple[list[str], dict]:
    """Every shard's faults (``check_one`` finds them, wherever the shard lives) and the totals
    the shard list adds up to, which must be the manifest's own (``where`` names it)."""
    faults: list[str] = []
    totals = {"tokens": 0, "documents": 0, "bytes": 0, "shards": len(m.shards)}
    for i, entry in enumerate(m.shards):
        faults += check_one(entry)
        totals["tokens"] += entry.tokens
        totals["documents"] += entry.documents
        totals["bytes"] += entry.bytes
        if on_shard:
            on_shard(i + 1, len(m.shards))
    if totals != m.data["totals"]:
        faults.append(f"{where}: totals {m.data['totals']} disagree with the shard list {totals}")
    return faults, totals


def files_faults(entry: manifest_mod.ShardEntry) -> list[str]:
    """What a look at the shard's two files finds, without reading them through: one missing,
    a Git LFS pointer (a prepared folder in a repo, cloned without git-lfs), a .bin of another size."""
    name = entry.rel_path
    for p in (entry.bin_path, entry.idx_path):
        found = not_a_file(p)
        if found:
            return [f"{name}: {p.name} is {_said(found)}"]
    pointers = [p.suffix for p in (entry.bin_path, entry.idx_path) if lfs_pointer.is_pointer_file(p)]
    if pointers:
        return [f"{name}: {p} is a Git LFS pointer, not the file; {lfs_pointer.FETCH}" for p in pointers]
    size = entry.bin_path.stat().st_size
    if size != entry.bytes:
        return [f"{name}: .bin is {size} bytes, the manifest says {entry.bytes} (truncated or replaced)"]
    return []


def _said(found: str) -> str:
    return found if found == "missing" else f"{found}, not a file"


def check_shard(
    entry: manifest_mod.ShardEntry, dtype: str, eos_id: int, bos_id: int | None = None
) -> list[str]:
    name = entry.rel_path
    faults = files_faults(entry)
    if faults:
        return faults
    if file_hash(entry.bin_path) != entry.hash:
        faults.append(f"{name}: .bin content hash differs from the manifest (corrupted)")
    if file_hash(entry.idx_path) != entry.idx_hash:
        faults.append(f"{name}: .idx content hash differs from the manifest (corrupted)")
    shard = Shard(entry.bin_path, dtype)
    problems = shard.problems(eos_id, bos_id)
    faults += [f"{name}: {p}" for p in problems]
    if not problems:
        if len(shard) != entry.documents:
            faults.append(f"{name}: .idx lists {len(shard)} documents, the manifest {entry.documents}")
        if int(shard.index.lengths.sum()) != entry.tokens:
            faults.append(
                f"{name}: .idx holds {int(shard.index.lengths.sum())} tokens, the manifest {entry.tokens}"
            )
        faults += check_origins(entry, len(shard))
    return faults


def check_origins(entry: manifest_mod.ShardEntry, documents: int) -> list[str]:
    """The shard's provenance sidecar, where the manifest lists one: present, of the recorded
    content hash, readable, with one entry per document of the .idx."""
    if entry.origin_hash is None:
        return []
    name = entry.rel_path
    found = not_a_file(entry.origin_path)
    if found:
        return [f"{name}: {entry.origin_path.name} (provenance) is {_said(found)}"]
    if file_hash(entry.origin_path) != entry.origin_hash:
        return [f"{name}: {entry.origin_path.name} content hash differs from the manifest (corrupted)"]
    try:
        found = len(read_origins(entry.origin_path))
    except ProvenanceError as exc:
        return [f"{name}: {exc}"]
    if found != documents:
        return [f"{name}: {entry.origin_path.name} has {found} entries, the .idx {documents} documents"]
    return []


def first_fault(m: manifest_mod.Manifest) -> str | None:
    """The first shard that is not exactly what the manifest says (None: all are)."""
    for entry in m.shards:
        faults = check_shard(entry, m.dtype, m.eos_id, m.bos_id)
        if faults:
            return faults[0]
    return None
