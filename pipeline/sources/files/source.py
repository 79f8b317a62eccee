"""The `files` source itself: its recipe section, its splits' files and origin, its plan,
and reading a partition with the reader of its format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.base import Cursor, Partition, Record, Source, check_globs, check_path_name
from pipeline.sources.files.access import file_size
from pipeline.sources.files.fingerprints import (
    check_range_unchanged,
    io_map,
    range_sample,
    stat_key,
    stat_key_now,
)
from pipeline.sources.files.formats import kind_of
from pipeline.sources.files.listing import expand
from pipeline.sources.files.planning import auto_partition_bytes, units
from pipeline.sources.files.readers import reader_for
from pipeline.sources.files.readers.txt import TextStream


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
        self._listed: dict[str, list[str]] = {}

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
        pb = cfg["partition_bytes"]
        if pb != "auto" and (not isinstance(pb, int) or isinstance(pb, bool) or pb < 4096):
            raise TokshardError(
                f'{where}: [sources.{name}] partition_bytes must be "auto" or an integer >= 4096'
            )
        return cfg

    def splits(self) -> list[str]:
        return list(self.config["splits"])

    def files(self, split: str) -> list[str]:
        """The split's files, listed once per source object (a plan asks for them three times:
        the read-once check, the origin and the partitions; for a bucket each is a listing)."""
        if split not in self._listed:
            files = expand(self.config["splits"][split], self.config["base_dir"])
            for f in files:
                kind_of(f)
            self._listed[split] = files
        return list(self._listed[split])

    def named_inputs(self) -> dict[str, list[str]]:
        return {split: self.files(split) for split in self.splits()}

    def origin(self) -> dict[str, Any]:
        return {"files": {split: io_map(stat_key, self.files(split)) for split in self.splits()}}

    def check_unchanged(self, recorded_origin: dict[str, Any]) -> None:
        for split, entries in recorded_origin["files"].items():
            for entry, now in zip(entries, io_map(stat_key_now, entries), strict=True):
                if now != {**now, **entry}:  # a plan of an older tokshard has no sample
                    raise DataError(
                        f"input {entry['path']} ({split}) changed since this run started "
                        "(size, modification time or content); restore it or start over with a new --out"
                    )

    def check_partitions_unchanged(self, partitions: list[Partition]) -> None:
        """Every planned .jsonl range still holds what was planned (its sampled ends), so that a
        rerun never keeps shards of one version of a file beside shards of another."""
        ranges = [p.spec for p in partitions if p.spec.get("kind") == ".jsonl"]
        io_map(lambda spec: check_range_unchanged(spec["path"], spec), ranges)

    def partitions(self) -> list[Partition]:
        parts: list[Partition] = []
        for split in self.splits():
            files = self.files(split)
            step = self.partition_bytes(files)
            for i, (key, size, spec) in enumerate(units(files, step)):
                parts.append(Partition(self.name, split, i, key, size, spec))
        ranges = [p.spec for p in parts if p.spec["kind"] == ".jsonl"]
        for spec, sample in zip(ranges, io_map(range_sample, ranges), strict=True):
            spec["sample"] = sample
        return parts

    def partition_bytes(self, files: list[str]) -> int:
        """The configured size, or for "auto" enough tasks to keep any cluster busy."""
        configured = self.config["partition_bytes"]
        if configured != "auto":
            return configured
        return auto_partition_bytes(sum(file_size(f) for f in files))

    def read(self, partition: Partition, cursor: Cursor | None) -> Iterator[Record]:
        spec = partition.spec
        yield from reader_for(spec["kind"], self.config["text_field"]).read(spec, cursor, partition.size)


def iter_texts(files: list[str], field: str = "text") -> Iterator[str]:
    """Every good document of these files in order (for tokenizer training and tools)."""
    source = FilesSource("input", {"text_field": field})
    for path in files:
        for key, size, spec in units([path], step=1 << 62):
            part = Partition("input", "train", 0, key, size, spec)
            for rec in source.read(part, None):
                if isinstance(rec.text, str):
                    yield rec.text
                elif isinstance(rec.text, TextStream):
                    yield "".join(rec.text)
