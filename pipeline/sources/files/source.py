"""The `files` source itself: its recipe section, its splits' files and origin, its plan,
and reading a partition piece by piece."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.base import (
    Cursor,
    Partition,
    Record,
    Source,
    bad_record,
    check_folder_names_differ,
    check_globs,
    check_path_name,
    check_size,
    gc_paused,
    small_partitions_note,
)
from pipeline.sources.files.access import file_size
from pipeline.sources.files.fingerprints import fingerprint, fingerprint_now, fingerprints, io_map
from pipeline.sources.files.formats import kind_of
from pipeline.sources.files.listing import InputFile, list_linked_files, refuse_non_utf8
from pipeline.sources.files.pieces import FileTable, Piece, partition_key, partition_spec, pieces_of
from pipeline.sources.files.planning import auto_partition_bytes, pack, plan_pieces
from pipeline.sources.files.readers import PartitionRead, read_partition
from pipeline.sources.files.readers.base import open_piece
from pipeline.sources.files.readers.jsonl import line_number
from pipeline.sources.files.readers.long_json import TextPieces
from pipeline.sources.files.readers.txt import TextStream
from pipeline.storage.locations import is_url

#: the smallest partition_bytes: below it a task's fixed cost is all there is
MIN_PARTITION_BYTES = 4096


class FilesSource(Source):
    type = "files"
    defaults: ClassVar[dict[str, Any]] = {
        "paths": None,
        "split": "train",
        "splits": None,
        "text_field": "text",
        "partition_bytes": "auto",
        "base_dir": ".",
    }
    location_keys = frozenset({"base_dir"})
    mixed_type_keys = frozenset({"partition_bytes"})  # "auto" or a number of bytes

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        super().__init__(name, config)
        self._listed: dict[str, list[InputFile]] = {}
        #: each split's files that have other hard links: their (device, inode), by name
        self._linked: dict[str, dict[str, tuple[int, int]]] = {}
        self._fingerprints: dict[str, list[dict[str, Any]]] = {}
        self._reading: PartitionRead | None = None

    @classmethod
    def normalize(cls, name: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
        cfg = super().normalize(name, raw, where)
        paths, splits = cfg.pop("paths"), cfg.pop("splits")
        split = cfg.pop("split")
        if (paths is None) == (splits is None):
            raise TokshardError(
                f"{where}: [sources.{name}] needs either paths = [...] (with split = ...) "
                "or splits = {train = [...], validation = [...]}"
            )
        if paths is not None:
            splits = {split: paths}
        if not isinstance(splits, dict) or not splits:
            raise TokshardError(f"{where}: [sources.{name}] splits must map split names to globs")
        table = f"{where}: [sources.{name}]"
        cfg["splits"] = {
            check_path_name("split", s, table): check_globs(
                p, f"{table} {'paths' if paths is not None else f'splits.{s}'}"
            )
            for s, p in splits.items()
        }
        check_folder_names_differ("split", cfg["splits"], table)
        if cfg["partition_bytes"] != "auto":  # else sized from each split's input
            cfg["partition_bytes"] = check_size(
                cfg["partition_bytes"],
                f'{where}: [sources.{name}] partition_bytes ("auto" or a size)',
                MIN_PARTITION_BYTES,
            )
        return cfg

    @classmethod
    def identity(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The split names, not their globs: which files a split holds, and what they hold, is
        the origin's to say (resolved paths and fingerprints, compared by `check_unchanged`), so
        ``data/*.jsonl`` and the same files named by absolute paths are one recipe."""
        return {**super().identity(config), "splits": list(config["splits"])}

    def splits(self) -> list[str]:
        return list(self.config["splits"])

    def files(self, split: str) -> list[InputFile]:
        """The split's files, listed once per source object (a plan asks for them three times:
        the read-once check, the origin and the partitions; for a bucket each is a listing)."""
        if split not in self._listed:
            with gc_paused():
                files, self._linked[split] = list_linked_files(
                    self.config["splits"][split], self.config["base_dir"]
                )
                refuse_non_utf8(files)
                for f in files:
                    if f.kind is None:
                        kind_of(f.path)  # refused by name
            self._listed[split] = files
        return self._listed[split]

    def split_fingerprints(self, split: str) -> list[dict[str, Any]]:
        """The split's origin entries (`fingerprints.fingerprint`), made once per source object."""
        if split not in self._fingerprints:
            files = self.files(split)
            with gc_paused():
                self._fingerprints[split] = fingerprints(files)
        return self._fingerprints[split]

    def named_inputs(self) -> dict[str, list[str]]:
        return {split: [f.path for f in self.files(split)] for split in self.splits()}

    def linked_inputs(self) -> dict[str, tuple[int, int]]:
        """From the listings' own stats (no stat more): `list_linked_files`."""
        for split in self.splits():
            self.files(split)
        return {path: inode for linked in self._linked.values() for path, inode in linked.items()}

    def origin(self) -> dict[str, Any]:
        return {"files": {split: self.split_fingerprints(split) for split in self.splits()}}

    @classmethod
    def specs_json(cls, partitions: list[Partition], origin: dict[str, Any]) -> list[dict[str, Any]]:
        """Each piece as a reference into its split's entries in ``origin`` (`FileTable`)."""
        tables = {split: FileTable(entries) for split, entries in origin["files"].items()}
        return [tables[p.split].spec_json(p.spec) for p in partitions]

    @classmethod
    def specs_of_json(
        cls, specs: list[tuple[str, dict[str, Any]]], origin: dict[str, Any]
    ) -> list[dict[str, Any]]:
        tables = {split: FileTable(entries) for split, entries in origin["files"].items()}
        return [tables[split].spec_of_json(spec) for split, spec in specs]

    def check_unchanged(self, recorded_origin: dict[str, Any]) -> None:
        """Every recorded input is still what it was, and the globs match no file the run did
        not plan (an object is compared by its version in one new listing)."""
        with gc_paused():
            for split, entries in recorded_origin["files"].items():
                self._check_split_unchanged(split, entries)

    def _check_split_unchanged(self, split: str, entries: list[dict[str, Any]]) -> None:
        """`check_unchanged` for one split's recorded ``entries``."""
        local = [e for e in entries if not is_url(e["path"]) or "etag" not in e]
        now = dict(zip((e["path"] for e in local), io_map(fingerprint_now, local), strict=True))
        listed = {f.path: f for f in self.files(split)}
        for entry in entries:
            found = now.get(entry["path"]) or _listed_fingerprint(entry["path"], listed)
            if found != {**found, **entry}:  # a plan of an older tokshard has fewer keys
                raise DataError(_changed(entry["path"], split))
        recorded = {e["path"] for e in entries}
        added = [path for path in listed if path not in recorded]
        if added:
            raise DataError(
                f"input {added[0]} ({split}) is new since this run started ({len(added)} files "
                "the globs match now were not planned); move them out of the globs' reach, or "
                "start over with a new --out"
            )
        left = [path for path in recorded if path not in listed]
        if left:
            raise TokshardError(
                f"input {left[0]} ({split}) is part of this run, but the recipe's globs no longer "
                f"name it ({len(left)} such files); name the same files as before, or use a new --out"
            )

    @classmethod
    def recorded_input_changed(cls, recorded_origin: dict[str, Any]) -> str | None:
        """The first local input of the origin that is gone or changed (objects in a store, and
        files the globs match now, are a rerun's to find: it has the listing and the recipe)."""
        for split, entries in recorded_origin.get("files", {}).items():
            local = [e for e in entries if not is_url(e["path"])]
            try:
                now = io_map(fingerprint_now, local)
            except DataError as exc:  # gone
                return str(exc)
            for entry, found in zip(local, now, strict=True):
                if found != {**found, **entry}:
                    return _changed(entry["path"], split)
        return None

    @classmethod
    def input_check(cls, recorded_origin: dict[str, Any]) -> Callable[[str], str | None]:
        """An input (local file or object) against its recorded fingerprint: size and time, or
        ETag, and the sampled ends where recorded, as a rerun compares them."""
        entries = {e["path"]: e for found in recorded_origin.get("files", {}).values() for e in found}

        def changed(name: str) -> str | None:
            entry = entries.get(name)
            if entry is None:
                return None
            try:
                now = fingerprint_now(entry)
            except DataError:  # (fingerprint_now's own line speaks of a run under way)
                return f"input {name} is gone since prepare read it"
            if now == {**now, **entry}:
                return None
            return f"input {name} changed since prepare read it ({_differs(entry, now)})"

        return changed

    def check_partitions_unchanged(self, partitions: list[Partition]) -> None:
        """Every planned range of a large .jsonl file still holds what was planned (its sampled
        ends: the file's own fingerprint covers its first and last MiB only), so that a rerun
        never keeps shards of one version of a file beside shards of another."""
        pieces = [p for part in partitions for p in pieces_of(part.spec, part.size)]
        io_map(_check_piece, [p for p in pieces if p.sample is not None and not p.whole])

    def partitions(self) -> list[Partition]:
        with gc_paused():
            return self._partitions()

    def _partitions(self) -> list[Partition]:
        parts: list[Partition] = []
        for split in self.splits():
            files = self.files(split)
            step = self.partition_bytes(sum(f.size for f in files))
            pieces = plan_pieces(files, self.split_fingerprints(split), step)
            for i, group in enumerate(pack(pieces, step)):
                size = sum(p.size for p in group)
                parts.append(
                    Partition(self.name, split, i, partition_key(group), size, partition_spec(group))
                )
        return parts

    def plan_note(self, partitions: list[Partition]) -> str | None:
        """A partition_bytes so small that each task's fixed cost outweighs its work (the
        default sizes partitions from each split's input) says so: it is not an error."""
        setting = self.config["partition_bytes"]
        if setting == "auto":
            return None
        totals: dict[str, int] = {}
        for part in partitions:
            totals[part.split] = totals.get(part.split, 0) + part.size
        at_default = sum(-(-total // auto_partition_bytes(total)) for total in totals.values())
        advice = "leave out --partition-bytes (or the recipe's partition_bytes) for the default, auto"
        return small_partitions_note(self.name, partitions, setting, at_default, advice)

    def partition_bytes(self, total: int) -> int:
        """The configured size, or for "auto" enough tasks to keep any cluster busy
        (``total``: the split's bytes)."""
        configured = self.config["partition_bytes"]
        return auto_partition_bytes(total) if configured == "auto" else configured

    def read(self, partition: Partition, cursor: Cursor | None) -> Iterator[Record]:
        self._reading = PartitionRead(partition.spec, partition.size, cursor, self.config["text_field"])
        return iter(self._reading)

    def check_read(self) -> None:
        """The file the last `read` took its last document from is still as planned (one stat)."""
        if self._reading is not None:
            self._reading.check()


def _listed_fingerprint(path: str, listed: dict[str, InputFile]) -> dict[str, Any]:
    """An object's fingerprint from the new listing (one gone from it is the user's to restore)."""
    if path not in listed:
        raise DataError(f"input {path} is gone since this run started; restore it or use a new --out")
    return fingerprint(listed[path], check=False)


def _check_piece(piece: Piece) -> None:
    open_piece(piece).close()


def iter_texts(
    files: Sequence[str | InputFile], field: str = "text", skipped: dict[str, int] | None = None
) -> Iterator[str]:
    """Every document's text of these files in order (`iter_documents`)."""
    return (text for text, _ in iter_documents(files, field, skipped))


def iter_documents(
    files: Sequence[str | InputFile], field: str = "text", skipped: dict[str, int] | None = None
) -> Iterator[tuple[str, Record]]:
    """Every document of these files in order with its record (`place_text` says where it is),
    for tokenizer training and tools, read as one partition, so that many small objects in a
    store are fetched ahead as `prepare` fetches them (a listed file's size is its listing's; a
    path's is asked for). A bad record stops it as it stops `prepare`, unless ``skipped`` is
    given: then each is counted there by its reason."""
    pieces = [
        Piece(f.path, f.kind or kind_of(f.path), f.size)
        if isinstance(f, InputFile)
        else Piece(f, kind_of(f), file_size(f))
        for f in files
    ]
    for rec in read_partition(partition_spec(pieces), sum(p.size for p in pieces), None, field):
        text, bad, where = _whole_text(rec)
        if bad is None:
            yield text, rec
        elif skipped is None:
            raise bad_record(where, bad, kept="nothing was written")
        else:
            skipped[bad] = skipped.get(bad, 0) + 1


def place_text(rec: Record) -> str:
    """Where a document of `iter_documents` is, as a message names it: ``file:line``, or its
    row (the line of a byte offset is counted here, so only for a message)."""
    origin = rec.origin
    if origin is None or not origin.input:
        return rec.where
    if origin.unit == "offset":
        return f"{origin.input}:{line_number(origin.input, origin.place)}"
    return (
        f"{origin.input}:{origin.place}"
        if origin.unit == "line"
        else f"{origin.input}, row {origin.place} (counting from 0)"
    )


def _whole_text(rec: Record) -> tuple[str, str | None, str]:
    """A record's text as one string, or why it has none; and where it is (a stream that is
    not UTF-8 names its byte)."""
    if rec.bad is not None:
        return "", rec.bad, rec.where
    if isinstance(rec.text, TextStream):
        try:
            return "".join(rec.text), None, rec.where
        except UnicodeDecodeError:
            return "", "invalid UTF-8", rec.text.where
    if isinstance(rec.text, TextPieces):
        return "".join(rec.text), None, rec.where
    return rec.text, None, rec.where


def _changed(path: str, split: str) -> str:
    return (
        f"input {path} ({split}) changed since this run started (size, modification time or "
        "content); restore it or start over with a new --out"
    )


#: what each fingerprint key of an input says, as a changed input's line names it
_FINGERPRINT_WORDS = {"size": "size", "mtime": "modification time", "etag": "ETag", "sample": "content"}


def _differs(recorded: dict[str, Any], now: dict[str, Any]) -> str:
    """Which of a recorded fingerprint's facts differ now: 'its size and modification time
    differ from the manifest's'."""
    words = [_FINGERPRINT_WORDS.get(k, k) for k, v in recorded.items() if k != "path" and now.get(k) != v]
    verb = "differs" if len(words) == 1 else "differ"
    return f"its {' and '.join(words) or 'record'} {verb} from the manifest's"
