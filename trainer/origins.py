"""Where a trained document came from: document id in a (source, split) stream -> its input.

A stream's documents are numbered from 0 across its shards in manifest order (the order of
their ``.idx`` files), which is how ``tokshard samples`` names the documents a window covers
and how packed samples name their pieces. Each shard's provenance sidecar
(``pipeline.format.provenance``) holds one entry per document of its ``.idx``; this module
finds the shard of a document id and reads that shard's sidecar once.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.format.content_hash import bytes_hash
from pipeline.format.errors import DataError
from pipeline.format.file_kind import require_file
from pipeline.format.manifest import Manifest, ShardEntry
from pipeline.format.provenance import UNKNOWN, Origins, ProvenanceError, decode

#: (manifest, source, input as a sidecar names it) -> what changed in that input since prepare
#: read it (None: nothing that can be told). The application gives it (`tokshard samples`):
#: comparing an input with its record is the sources' knowledge, which the trainer does not import.
#: It is asked for each document traced, so it remembers its answers (``ChangedInputs`` does).
InputCheck = Callable[[Manifest, str, str], str | None]


def without_provenance(manifest: Manifest) -> DataError:
    """The one line for data prepared before shards had provenance sidecars."""
    return DataError(
        f"{manifest.path}: this data was prepared without provenance (its shards have no .origin "
        "sidecars); prepare it again with this tokshard into a new folder to record where each "
        "document came from"
    )


class UntracedShard(DataError):
    """A document in a shard that carries no provenance, in a manifest whose other shards do (a
    run an older tokshard began and this one finished): that document cannot be traced."""


def untraced_shard(manifest: Manifest, rel_path: str) -> UntracedShard:
    """The one line for a document of a shard written without a provenance sidecar."""
    return UntracedShard(
        f"{manifest.path}: shard {rel_path} was written by an older tokshard that recorded no places (it "
        "has no .origin sidecar); to trace its documents, prepare the data again into a new folder"
    )


def hub_files(origin: dict[str, Any]):
    """For a hub source (its manifest origin names a repo and a revision): input -> the repo,
    the revision and the file inside the repo, whether the input was the hub or a mirror of it."""
    if not isinstance(origin.get("repo"), str) or not isinstance(origin.get("revision"), str):
        return None
    files = [
        f["path"] for f in origin.get("files", []) if isinstance(f, dict) and isinstance(f.get("path"), str)
    ]

    def named(name: str) -> dict[str, str]:
        rel = next((f for f in files if name.endswith("/" + f)), None)
        return {"repo": origin["repo"], "revision": origin["revision"]} | ({"file": rel} if rel else {})

    return named


class StreamOrigins:
    """The origins of one (source, split) stream's documents, shard sidecars read on demand;
    refused whole for a manifest none of whose shards has one, document by document for a
    shard without one in a manifest whose others have theirs."""

    def __init__(
        self, manifest: Manifest, source: str, split: str, input_check: InputCheck | None = None
    ) -> None:
        self.manifest = manifest
        self.source = source
        self.input_check = input_check
        self.shards = manifest.select(source, split)
        if all(s.origin_hash is None for s in manifest.shards):
            raise without_provenance(manifest)
        self.starts = np.cumsum([0, *(s.documents for s in self.shards)], dtype=np.int64).tolist()
        self._sidecars: dict[int, Origins] = {}
        self.hub = hub_files(manifest.data["sources"].get(source, {}).get("origin") or {})

    @property
    def documents(self) -> int:
        return self.starts[-1]

    def _sidecar(self, i: int) -> Origins:
        side = self._sidecars.get(i)
        if side is None:
            entry = self.shards[i]
            if self.manifest.ready is not None:
                self.manifest.ready(entry.origin_path)  # a manifest URL's: fetched, hash-checked
            try:
                side = decode(self._sidecar_bytes(entry), entry.origin_path)
            except ProvenanceError as exc:
                raise DataError(f"{exc}; `tokshard verify {self.manifest.path}` checks every shard") from None
            if len(side) != entry.documents:
                raise DataError(
                    f"{entry.origin_path}: {len(side)} entries for {entry.documents} documents; "
                    f"`tokshard verify {self.manifest.path}` checks every shard"
                )
            self._sidecars[i] = side
        return side

    def _sidecar_bytes(self, entry: ShardEntry) -> bytes:
        """The sidecar's bytes, as the manifest hashed them: one edited or damaged since would
        name other inputs and places as if they were the documents' own."""
        path = entry.origin_path
        try:
            require_file(path)
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ProvenanceError(f"{path}: provenance sidecar is missing") from None
        if bytes_hash(raw) != entry.origin_hash:
            raise DataError(
                f"{path}: the provenance sidecar is not the one prepare wrote (its content hash differs from "
                f"the manifest's origin_hash: edited or damaged since); restore it from a copy of the prepared "
                f"folder, or prepare the data again into a new folder; `tokshard verify {self.manifest.path}` "
                "checks every shard"
            )
        return raw

    def changed(self, name: str) -> str | None:
        """What changed in input ``name`` since prepare read it (the check says it once and
        remembers it: every stream of a manifest asks the same inputs)."""
        if self.input_check is None or not name:
            return None
        return self.input_check(self.manifest, self.source, name)

    def origin(self, doc: int) -> dict[str, Any]:
        """Document ``doc`` of the stream: its input and place (``line``, ``row`` or ``offset``),
        and the shard holding it with the content hash the manifest records for that shard, and
        ``input_changed`` where the input is no longer what prepare read (`UntracedShard`: that
        shard has no provenance)."""
        if not 0 <= doc < self.documents:
            raise IndexError(f"document {doc} of a stream of {self.documents}")
        i = bisect.bisect_right(self.starts, doc) - 1
        entry = self.shards[i]
        if entry.origin_hash is None:
            raise untraced_shard(self.manifest, entry.rel_path)
        name, unit, place = self._sidecar(i)[doc - self.starts[i]]
        found: dict[str, Any] = {"input": name, unit: place} if (name, unit) != UNKNOWN else {"input": None}
        if self.hub is not None and name:
            found.update(self.hub(name))
        found.update(shard=entry.rel_path, shard_document=doc - self.starts[i], shard_hash=entry.hash)
        if (changed := self.changed(name)) is not None:
            found["input_changed"] = changed  # the place may now hold other bytes
        return found
