"""The one owner of manifest.json, the trainer's only entry point to prepared data.

The manifest is written last and atomically beside the shards; every path in it is
relative to it, so a prepared folder can be copied anywhere. Its JSON Schema is
``manifests/schema.json`` (keep the two in step; ``FORMAT`` is the version both carry).
Standard library and the shard format only, so a GPU node reads manifests without the
pipeline's dependencies.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.format import json_kinds
from pipeline.format.atomic import write_json
from pipeline.format.errors import DataError, TokshardError, VerifyError, counted
from pipeline.format.provenance import SUFFIX as SIDECAR_SUFFIX
from pipeline.format.provenance import sidecar_path
from pipeline.format.shard_writer import ShardRecord
from pipeline.format.token_dtypes import TOKEN_DTYPES

FORMAT = 1
MANIFEST_NAME = "manifest.json"
TOKENIZER_NAME = "tokenizer.json"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as listed in a manifest; ``bin_path`` is resolved against the manifest."""

    bin_path: Path
    rel_path: str
    source: str
    split: str
    tokens: int
    documents: int
    bytes: int
    hash: str
    idx_hash: str
    #: the provenance sidecar's content hash (None: prepared without provenance)
    origin_hash: str | None = None

    @property
    def idx_path(self) -> Path:
        return self.bin_path.with_suffix(".idx")

    @property
    def origin_path(self) -> Path:
        return sidecar_path(self.bin_path)

    @property
    def origin_rel(self) -> str:
        return self.rel_path[: -len(".bin")] + SIDECAR_SUFFIX


class Manifest:
    """A loaded manifest: shards in order, with the facts a reader must check."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        #: called with a shard's .bin path (or its .origin sidecar's, or its .idx's where only that
        #: is read) before it is opened; the data cache of a manifest URL sets it to download the
        #: file first (None: they are local already)
        self.ready: Callable[[Path], None] | None = None
        self.path = path
        #: the folder the shard paths are relative to: a manifest.json that is itself a symbolic
        #: link (``latest.json -> run3/manifest.json``) names shards beside the file it leads to
        self.folder = Path(os.path.realpath(path)).parent if path.is_symlink() else path.parent
        #: the folder with every symlink resolved (where another tool is told the shards are)
        self.real_folder = Path(os.path.realpath(self.folder))
        self.data = data
        self.dtype: str = data["dtype"]
        tok = data["tokenizer"]
        self.vocab_size: int = tok["vocab_size"]
        self.eos_id: int = tok["eos_id"]
        #: the token each document starts with (None: its text; a manifest before it names none)
        self.bos_id: int | None = tok.get("bos_id")
        self.shards = [self._entry(s) for s in data["shards"]]

    def _entry(self, s: dict[str, Any]) -> ShardEntry:
        return ShardEntry(
            bin_path=self.resolve(s["path"]),
            rel_path=s["path"],
            source=s["source"],
            split=s["split"],
            tokens=s["tokens"],
            documents=s["documents"],
            bytes=s["bytes"],
            hash=s["hash"],
            idx_hash=s["idx_hash"],
            origin_hash=s.get("origin_hash"),
        )

    @property
    def has_provenance(self) -> bool:
        """Whether every shard has a provenance sidecar (prepared by a tokshard that writes them)."""
        return all(s.origin_hash is not None for s in self.shards)

    def resolve(self, rel: str) -> Path:
        """A path under the manifest's folder; a name that escapes it is refused unopened.

        A symbolic link there may lead anywhere (DVC's and git-annex's caches link every file;
        a shard moved to another disk): its target is read as long as it is a file, which
        every reader checks before it opens one (`pipeline.format.file_kind`)."""
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise VerifyError(
                f"{self.path}: shard path {rel!r} leaves the manifest's folder; refusing to open it"
            )
        return self.folder / rel

    @property
    def tokenizer_path(self) -> Path:
        return self.resolve(self.data["tokenizer"]["path"])

    def sources(self) -> list[str]:
        return list(self.data["sources"])

    def splits(self, source: str | None = None) -> list[str]:
        seen: dict[str, None] = {}
        for s in self.shards:
            if source is None or s.source == source:
                seen.setdefault(s.split)
        return list(seen)

    def split_counts(self, source: str, split: str) -> dict[str, Any] | None:
        """What prepare recorded of ``source``'s ``split`` (`empty_split_stats`'s counts); None
        where it records no such split of it. A split of no documents has counts and no shards:
        prepare dropped every one (`dropped_text`)."""
        splits = (self.data["sources"].get(source) or {}).get("splits") or {}
        return splits.get(split)

    def select(self, source: str | None = None, split: str | None = None) -> list[ShardEntry]:
        return [
            s
            for s in self.shards
            if (source is None or s.source == source) and (split is None or s.split == split)
        ]

    def fingerprint(self) -> str:
        """Identifies the data, not the run that made it (creation time left out)."""
        return content_hash({k: v for k, v in self.data.items() if k not in ("created", "checksum")})

    def checksum_ok(self) -> bool:
        """False if the file was edited after `prepare` wrote it."""
        return self.data.get("checksum") == checksum(self.data)

    def check_sealed(self) -> None:
        """Refuse a manifest edited by hand (a shard listed twice, a split renamed, a count
        changed) before its counts or shards are used: every shard may still check out."""
        if "checksum" not in self.data:
            raise DataError(f"{self.path}: {NO_CHECKSUM}; re-run prepare to write it with one")
        if not self.checksum_ok():
            raise DataError(
                f"{self.path}: edited after `tokshard prepare` wrote it (its checksum does not match its "
                f"content); re-run prepare, or run `tokshard verify {self.path}` to see what else differs"
            )


def content_hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


#: what a manifest with no checksum field is (not "edited": nothing says whether it was)
NO_CHECKSUM = "without a checksum: an older tokshard wrote it, or its checksum field was removed"


def checksum(data: dict[str, Any]) -> str:
    return content_hash({k: v for k, v in data.items() if k != "checksum"})


def seal_problem(data: Any) -> str | None:
    """Why parsed JSON is not a manifest exactly as a `prepare` of this format wrote it (not a
    manifest, another format, with no checksum, or edited since: its checksum is off); None if it
    is. A rerun
    writes such a manifest again instead of calling its run complete."""
    if json_kinds.kind_of(data) != json_kinds.MANIFEST:
        return "not a manifest"
    if data.get("format") != FORMAT:
        return f"of manifest format {data.get('format')!r}, not this tokshard's {FORMAT}"
    if "checksum" not in data:
        return NO_CHECKSUM
    if data.get("checksum") != checksum(data):
        return "edited since `tokshard prepare` wrote it: its checksum does not match its content"
    return None


def find(path: str | os.PathLike) -> Path:
    """Accept a manifest file or the folder holding one (local: URLs go through the data cache)."""
    if isinstance(path, str) and "://" in path:
        raise TokshardError(
            f"{path} is a URL; this command reads a local manifest (or see `tokshard train --help`)"
        )
    given = Path(path)
    p = given / MANIFEST_NAME if given.is_dir() else given
    if not p.is_file():
        if p.parent.is_dir() and (p is not given or given.name == MANIFEST_NAME):
            trained_on = train_runs_manifests(p.parent)
            hint = (
                f" ({p.parent} is the folder of a `tokshard train` run, which trained on {trained_on}: "
                "pass that)"
                if trained_on
                else f" (is `tokshard prepare` still running? `tokshard status {p.parent}` tells)"
            )
        elif not given.exists():
            pattern = any(c in str(path) for c in "*?[")
            hint = ": there is no such file or folder" + (
                " (a pattern such as 'runs/*' is expanded by the shell only where it is not quoted)"
                if pattern
                else ""
            )
        else:
            hint = ""
        raise TokshardError(f"no manifest at {p}{hint}")
    return p


def train_runs_manifests(folder: Path) -> str | None:
    """The manifests a `tokshard train` run whose folder (its ``run.json``) is ``folder`` trained
    on, as its record names them (None: not such a folder): the folder a user gives where a
    manifest is asked is often the run's, not its data's."""
    try:
        data = json.loads((folder / "run.json").read_text())["data"]
        named = data.get("manifest") or data.get("manifests")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if isinstance(named, str):
        return named
    if isinstance(named, list) and named and all(isinstance(m, str) for m in named):
        return ", ".join(named)
    return None


def load(path: str | os.PathLike) -> Manifest:
    """Read and sanity-check a manifest; a wrong format version is refused by name.

    A manifest that is there but damaged (not JSON, a field of the wrong type, an unknown
    dtype) is bad data: exit 1, one line naming the file and the field."""
    p = find(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{p}: not a readable manifest ({exc})") from exc
    kind = json_kinds.kind_of(data)
    if kind != json_kinds.MANIFEST:
        what = kind or "JSON without a manifest's fields (format, tokenizer, shards)"
        raise TokshardError(
            f"{p} is {what}, not a tokshard manifest: pass the manifest.json that `tokshard prepare` "
            "wrote, or its folder"
        )
    if data.get("format") != FORMAT:
        found = data.get("format")
        raise DataError(
            f"{p}: manifest format {found!r}, this tokshard reads format {FORMAT}; "
            "re-run `tokshard prepare` with this version"
        )
    for key in ("dtype", "tokenizer", "sources", "shards", "totals"):
        if key not in data:
            raise DataError(f"{p}: manifest lacks {key!r}; it is damaged, re-run prepare")
    check_fields(p, data)
    try:
        return Manifest(p, data)
    except (KeyError, TypeError) as exc:
        raise DataError(f"{p}: manifest entry lacks {exc}; it is damaged, re-run prepare") from exc


_SHARD_COUNTS = ("tokens", "documents", "bytes")
_SHARD_TEXTS = ("path", "source", "split", "hash", "idx_hash")


def check_fields(p: Path, data: dict[str, Any]) -> None:
    """The fields every reader computes with have the type they need (a hand edit may not)."""

    def damaged(where: str, what: str) -> DataError:
        return DataError(f"{p}: {where} {what}; the manifest is damaged, re-run `tokshard prepare`")

    if not isinstance(data["dtype"], str) or data["dtype"] not in TOKEN_DTYPES:  # a list: unhashable
        raise damaged("'dtype'", f"is {data['dtype']!r}, not one of {', '.join(TOKEN_DTYPES)}")
    tok = data["tokenizer"]
    if not isinstance(tok, dict):
        raise damaged("'tokenizer'", "is not an object")
    for key in ("path", "sha256"):
        if not isinstance(tok.get(key), str) or not tok[key]:
            raise damaged(f"tokenizer {key!r}", f"is {tok.get(key)!r}, not a name")
    for key in ("vocab_size", "eos_id"):
        if not _count(tok.get(key)):
            raise damaged(f"tokenizer {key!r}", f"is {tok.get(key)!r}, not a whole number")
    if tok["eos_id"] >= tok["vocab_size"]:
        raise damaged("tokenizer 'eos_id'", f"{tok['eos_id']} is not below vocab_size {tok['vocab_size']}")
    bos = tok.get("bos_id")
    if bos is not None and not (_count(bos) and bos < tok["vocab_size"]):
        raise damaged(
            "tokenizer 'bos_id'", f"is {bos!r}, not a whole number below vocab_size {tok['vocab_size']}"
        )
    if not isinstance(data["sources"], dict):
        raise damaged("'sources'", "is not an object")
    if not isinstance(data["shards"], list):
        raise damaged("'shards'", "is not a list")
    for i, shard in enumerate(data["shards"]):
        if not isinstance(shard, dict):
            raise damaged(f"shard {i}", "is not an object")
        for key in _SHARD_COUNTS:
            if not _count(shard.get(key)):
                raise damaged(f"shard {i} {key!r}", f"is {shard.get(key)!r}, not a whole number")
        for key in _SHARD_TEXTS:
            if not isinstance(shard.get(key), str) or not shard[key]:
                raise damaged(f"shard {i} {key!r}", f"is {shard.get(key)!r}, not a name")
        if "origin_hash" in shard and (not isinstance(shard["origin_hash"], str) or not shard["origin_hash"]):
            raise damaged(f"shard {i} 'origin_hash'", f"is {shard['origin_hash']!r}, not a hash")
    totals = data["totals"]
    if not isinstance(totals, dict) or not all(_count(totals.get(k)) for k in _TOTALS):
        raise damaged("'totals'", f"is {totals!r}, not whole numbers of {', '.join(_TOTALS)}")
    for name, source in data["sources"].items():
        _check_source(name, source, damaged)


_TOTALS = ("tokens", "documents", "shards", "bytes")


def _check_source(name: str, source: Any, damaged: Callable[[str, str], DataError]) -> None:
    """One ``sources`` entry: its type and, per split, the counts `empty_split_stats` lists."""
    if not isinstance(source, dict) or not isinstance(source.get("type"), str):
        raise damaged(f"source {name!r}", "has no 'type' name")
    splits = source.get("splits")
    if not isinstance(splits, dict):
        raise damaged(f"source {name!r} 'splits'", f"is {splits!r}, not an object")
    for split, stats in splits.items():
        where = f"source {name!r} split {split!r}"
        if not isinstance(stats, dict):
            raise damaged(where, f"is {stats!r}, not an object of counts")
        for key, empty in empty_split_stats().items():
            value = stats.get(key)
            if isinstance(empty, dict):
                if not isinstance(value, dict) or not all(_count(v) for v in value.values()):
                    raise damaged(f"{where} {key!r}", f"is {value!r}, not counts by reason")
            elif not _count(value):
                raise damaged(f"{where} {key!r}", f"is {value!r}, not a whole number")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def dropped_text(counts: dict[str, Any]) -> str:
    """What prepare dropped of a split, from its counts: "20 empty, 3 bad records (2 malformed
    JSON, 1 invalid UTF-8)"."""
    parts = [f"{counts['dropped_empty']:,} empty"] if counts["dropped_empty"] else []
    skipped = counts.get("skipped") or {}
    if skipped:
        total = sum(skipped.values())
        why = ", ".join(
            f"{n:,} {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        parts.append(f"{counted(total, 'bad record')} ({why})")
    return ", ".join(parts) or "none"


def empty_split_stats() -> dict[str, Any]:
    """A split's counts in ``sources.NAME.splits``, before any partition is added."""
    return {"documents": 0, "tokens": 0, "shards": 0, "partitions": 0, "dropped_empty": 0, "skipped": {}}


def add_partition(
    stats: dict[str, Any],
    documents: int,
    tokens: int,
    dropped_empty: int,
    skipped: dict[str, int],
    shards: int,
) -> None:
    """Count one finished partition into its split's stats."""
    stats["documents"] += documents
    stats["tokens"] += tokens
    stats["partitions"] += 1
    stats["dropped_empty"] += dropped_empty
    for reason, n in skipped.items():
        stats["skipped"][reason] = stats["skipped"].get(reason, 0) + n
    stats["shards"] += shards


def shard_entry(record: ShardRecord, source: str, split: str) -> dict[str, Any]:
    """One item of the manifest's ``shards`` list: a written shard, where its tokens came from
    (``origin_hash``/``origin_bytes``: its provenance sidecar, where it has one)."""
    entry = {
        "path": record.path,
        "source": source,
        "split": split,
        "tokens": record.tokens,
        "documents": record.documents,
        "bytes": record.bytes,
        "hash": record.hash,
        "idx_hash": record.idx_hash,
    }
    if record.origin_hash is not None:
        entry["origin_hash"] = record.origin_hash
        entry["origin_bytes"] = record.origin_bytes
    return entry


def build(
    *,
    recipe: dict[str, Any],
    recipe_hash: str,
    dtype: str,
    tokenizer: dict[str, Any],
    encoder: dict[str, Any],
    sources: dict[str, Any],
    shards: list[dict[str, Any]],
) -> dict[str, Any]:
    """Assemble the manifest document; ``sources`` maps name -> origin and per-split counts."""
    totals = {
        "tokens": sum(s["tokens"] for s in shards),
        "documents": sum(s["documents"] for s in shards),
        "shards": len(shards),
        "bytes": sum(s["bytes"] for s in shards),
    }
    return {
        "format": FORMAT,
        "tool": {"name": "tokshard", "version": __version__},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "dtype": dtype,
        "recipe": recipe,
        "recipe_hash": recipe_hash,
        "tokenizer": tokenizer,
        "encoder": encoder,
        "sources": sources,
        "shards": shards,
        "totals": totals,
    }


def write(folder: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Seal the manifest with its checksum and write it atomically."""
    path = Path(folder) / MANIFEST_NAME
    write_json(path, sealed(manifest))
    return path


def sealed(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as written: with the checksum that `Manifest.checksum_ok` tests."""
    return {**manifest, "checksum": checksum(manifest)}
