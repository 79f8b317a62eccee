"""`tokshard verify` wherever the manifest is: a local folder, or an object store.

A local manifest is checked in place by the one verifier (`pipeline.format.verify`). A
manifest URL is read from the store, and each shard is downloaded to a temporary folder,
checked exactly like a local one (`check_shard`), and deleted, so the disk needs room for one
shard only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError, TokshardError, VerifyError
from pipeline.format.verify import check_shard, check_shards
from pipeline.format.verify import verify as verify_local
from pipeline.storage.place import Place
from pipeline.storage.places import open_manifest_place

OnShard = Callable[[int, int], None]


def verify(location: str | os.PathLike, on_shard: OnShard | None = None) -> tuple[list[str], dict]:
    """All faults found (empty: the data is exactly what its manifest says) and the totals."""
    place, name = open_manifest_place(location)
    if place.local_root is not None:
        return verify_local(location, on_shard)
    return _verify_stored(place, name, on_shard)


def _verify_stored(place: Place, name: str, on_shard: OnShard | None) -> tuple[list[str], dict]:
    murl = place.where(name)
    place.check_reachable()
    data = place.read_bytes(name)
    if data is None:
        raise TokshardError(
            f"no manifest at {murl} (is `tokshard prepare` still running? `tokshard status URL` tells)"
        )
    with tempfile.TemporaryDirectory(prefix="tokshard-verify-") as tmp:
        local = Path(tmp) / manifest_mod.MANIFEST_NAME
        local.write_bytes(data)
        try:
            m = manifest_mod.load(local)
        except TokshardError as exc:  # named by its URL; a fault in it is a failed check
            said = str(exc).replace(str(local), murl)
            raise (VerifyError(said) if isinstance(exc, DataError) else TokshardError(said)) from exc
        faults: list[str] = []
        if "checksum" not in m.data:
            faults.append(f"{murl}: manifest {manifest_mod.NO_CHECKSUM}")
        elif not m.checksum_ok():
            faults.append(f"{murl}: manifest was edited after prepare wrote it (checksum mismatch)")
        tok_rel = m.data["tokenizer"]["path"]
        tok = place.read_bytes(tok_rel)
        if tok is None or hashlib.sha256(tok).hexdigest() != m.data["tokenizer"]["sha256"]:
            faults.append(f"{place.where(tok_rel)}: tokenizer missing or changed")
        shard_faults, totals = check_shards(
            m, murl, lambda entry: _check_stored_shard(place, entry, m), on_shard
        )
    return faults + shard_faults, totals


def _check_stored_shard(place: Place, entry: manifest_mod.ShardEntry, m: manifest_mod.Manifest) -> list[str]:
    idx_rel = entry.rel_path[: -len(".bin")] + ".idx"
    origin_rel = entry.origin_rel if entry.origin_hash is not None else None
    with (
        place.local_copy(entry.rel_path, entry.bin_path) as bin_path,
        place.local_copy(idx_rel, entry.idx_path) as idx_path,
        _maybe_copy(place, origin_rel, entry.origin_path) as origin_path,
    ):
        copies = [(bin_path, entry.rel_path), (idx_path, idx_rel)]
        copies += [(origin_path, origin_rel)] if origin_rel else []
        for found, rel in copies:
            if found is None:
                return [f"{entry.rel_path}: {Path(rel).name} is missing"]
        faults = check_shard(entry, m.dtype, m.eos_id, m.bos_id)
    for found, rel in copies:  # the object, not its deleted copy, is what the user can look at
        faults = [fault.replace(str(found), place.where(rel)) for fault in faults]
    return faults


@contextlib.contextmanager
def _maybe_copy(place: Place, rel: str | None, dest: Path) -> Iterator[Path | None]:
    """`Place.local_copy` of ``rel``, or nothing when there is no such file to check."""
    if rel is None:
        yield None
        return
    with place.local_copy(rel, dest) as path:
        yield path
