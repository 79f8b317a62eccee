"""Hub sources: documents assembled from consecutive rows of a repo's parquet files.

A split's rows are numbered globally across its files, in order. A partition is a run of
row groups of one file (at most ``partition_bytes`` compressed, so one Dask task per file
or per slice of a large one); it owns exactly the documents whose *first* row lies in
``[start, stop)`` and reads on past ``stop`` to finish its last one, like a line-aligned
byte range. How rows become documents is the one thing each corpus defines
(`HubSource.documents`); how far a document may reach past its partition is its
``lookahead_rows``, so the plan can name the files a reader may need to continue into.

Reading streams one row group at a time and only the needed columns: no worker holds a
whole file, and each downloads only the row groups it encodes (plus the bit past the end
that finishes its last document). A document's cursor is the global row just after it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.format.errors import DataError, TokshardError
from pipeline.format.provenance import Input
from pipeline.sources.base import (
    Cursor,
    Partition,
    Record,
    Source,
    check_globs,
    check_path_name,
    check_size,
    small_partitions_note,
)
from pipeline.sources.hub import (
    FileLayout,
    Repo,
    file_layouts,
    input_name,
    is_commit,
    list_data_files,
    locate_mirror,
    mirror_commit,
    pin,
    pin_mirror,
    read_error,
)
from pipeline.storage.locations import is_url, location_problem
from pipeline.storage.object_store import url_filesystem

DEFAULT_PARTITION_BYTES = 64 << 20
BATCH_ROWS = 4096


@dataclass(frozen=True)
class Rows:
    """Consecutive rows ``first``, ``first + 1``, ... of a split: one list per column."""

    first: int
    columns: list[list[Any]]
    file: str

    def __len__(self) -> int:
        return len(self.columns[0])


@dataclass(frozen=True)
class Doc:
    """A document (or a bad record) assembled from rows ``first`` .. ``end - 1``."""

    text: str | None
    first: int
    end: int
    file: str
    bad: str | None = None


class HubSource(Source):
    """A dataset repo's splits, read at a pinned revision from the hub or a mirror."""

    #: the repo when the recipe does not name one
    repo: ClassVar[str | None] = None
    #: columns a document is made from, read from every file (nothing else is downloaded)
    columns: tuple[str, ...] = ("text",)
    #: how many rows past its partition's end a document may reach
    lookahead_rows: int = 0

    defaults: ClassVar[dict[str, Any]] = {
        "repo": None,
        "config": None,
        "revision": "main",
        "splits": None,
        "data_files": None,
        "partition_bytes": DEFAULT_PARTITION_BYTES,
        "mirror": None,
        "base_dir": ".",
    }
    location_keys = frozenset({"mirror", "base_dir"})

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        super().__init__(name, config)
        self._planned: tuple[Repo, dict[str, list[FileLayout]]] | None = None
        self._mirrors: dict[str, str] = {}

    # --- recipe ------------------------------------------------------------------------

    @classmethod
    def normalize(cls, name: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
        cfg = super().normalize(name, raw, where)
        table = f"{where}: [sources.{name}]"
        cfg["repo"] = cfg["repo"] or cls.repo
        if not isinstance(cfg["repo"], str) or cfg["repo"].count("/") != 1:
            raise TokshardError(f'{table} needs repo = "OWNER/NAME" (a dataset repo on the hub)')
        for key in ("config", "revision", "mirror"):
            if cfg[key] is not None and not (isinstance(cfg[key], str) and cfg[key].strip()):
                raise TokshardError(f"{table} {key} must be a non-empty string")
        if cfg["mirror"] is not None and (problem := location_problem(cfg["mirror"])):
            raise TokshardError(f"{table} mirror: {problem}")  # as --mirror is: s3:/b is no local folder
        if cfg["revision"] is None:
            raise TokshardError(f'{table} revision must be a branch, tag or commit (default "main")')
        splits = cfg["splits"]
        if isinstance(splits, str):
            splits = [splits]
        if splits is not None and not (isinstance(splits, list) and splits):
            raise TokshardError(f'{table} splits must be a list of split names, e.g. ["train"]')
        cfg["splits"] = splits and [check_path_name("split", s, table) for s in splits]
        data_files = cfg["data_files"]
        if data_files is not None:
            if isinstance(data_files, str | list):
                data_files = {"train": data_files}
            if not isinstance(data_files, dict) or not data_files:
                raise TokshardError(f'{table} data_files must map splits to globs, e.g. {{train = "data/*"}}')
            cfg["data_files"] = {
                check_path_name("split", s, table): check_globs(p, f"{table} data_files.{s}")
                for s, p in data_files.items()
            }
        cfg["partition_bytes"] = check_size(cfg["partition_bytes"], f"{table} partition_bytes", 1)
        return cfg

    # --- where the files are -----------------------------------------------------------

    @property
    def mirror_root(self) -> str | None:
        """The folder of this run's mirror holding the repo, or None to read from the hub."""
        return self.mirror_at(self.config["revision"])

    def mirror_at(self, revision: str) -> str | None:
        """The mirror folder holding the repo at ``revision`` (a hub cache holds one per commit)."""
        mirror = self.config["mirror"]
        if mirror is None:
            return None
        if revision not in self._mirrors:
            cfg = self.config
            self._mirrors[revision] = locate_mirror(mirror, cfg["base_dir"], cfg["repo"], revision)
        return self._mirrors[revision]

    def at(self, revision: str) -> Repo:
        """The repo at a planned revision, read from this run's mirror or from the hub."""
        return Repo(self.config["repo"], revision, self.config["revision"], self.mirror_at(revision))

    def _plan(self) -> tuple[Repo, dict[str, list[FileLayout]]]:
        """Pin the revision, list the split files, read their footers (once per instance)."""
        if self._planned is None:
            cfg = self.config
            repo = pin(cfg["repo"], cfg["revision"], self.mirror_root)
            files = list_data_files(repo, cfg["config"], cfg["data_files"], cfg["splits"])
            repo = pin_mirror(repo, [f for split in files.values() for f in split])
            layouts = {split: list(file_layouts(repo, paths)) for split, paths in files.items()}
            for split_layouts in layouts.values():
                for layout in split_layouts:
                    self._check_columns(repo, layout)
            self._planned = (repo, layouts)
        return self._planned

    def _check_columns(self, repo: Repo, layout: FileLayout) -> None:
        for column in self.columns:
            kind = layout.columns.get(column)
            if kind is None:
                raise TokshardError(
                    f"{repo.url(layout.path)}: no column {column!r} (columns: {', '.join(layout.columns)}); "
                    f"{self.column_hint()}"
                )
            if column not in layout.text_columns:
                raise TokshardError(f"{repo.url(layout.path)}: column {column!r} is {kind}, not text")

    def column_hint(self) -> str:
        return f"is this the {self.config['repo']} layout? check repo, config and mirror"

    # --- Source API --------------------------------------------------------------------

    def splits(self) -> list[str]:
        return list(self._plan()[1])

    def named_inputs(self) -> dict[str, list[str]]:
        """Every file this source reads, per split, as the files source names them (a local
        mirror's by their resolved paths): one file read by two sources, from the card's layout
        or ``data_files``, or by a files source too, is refused like two file sources."""
        repo, layouts = self._plan()
        return {split: [input_name(repo, f.path) for f in files] for split, files in layouts.items()}

    def splits_may_share_inputs(self) -> bool:
        """A card's layout is its publisher's, who may list one file under two splits on
        purpose; the recipe's own ``data_files`` are held to one split each."""
        return not self.config["data_files"]

    def origin(self) -> dict[str, Any]:
        repo, layouts = self._plan()
        return {
            "repo": repo.repo,
            "config": self.config["config"],
            "revision": repo.revision,
            "requested_revision": repo.requested_revision,
            "mirror": repo.mirror,
            "files": [_file_entry(split, f) for split, files in layouts.items() for f in files],
        }

    def check_unchanged(self, recorded_origin: dict[str, Any]) -> None:
        """A resume reads the recorded commit; a mirror must still hold exactly those files."""
        revision = recorded_origin["revision"]
        repo = self.at(revision)
        mirror = repo.mirror
        if mirror is None:
            if not is_commit(revision):
                raise TokshardError(
                    f"this run was planned on mirror {recorded_origin.get('mirror')} of {repo.repo}, which "
                    "records no commit; resume it with that mirror (--mirror / mirror = ...)"
                )
            return
        now = mirror_commit(repo, [f["path"] for f in recorded_origin["files"]])
        if now is not None and now != revision:
            raise DataError(
                f"mirror {mirror} now holds {repo.repo} at {now}, this run is pinned to {revision}; "
                "restore that commit in the mirror, or start over with a new --out"
            )

        fs, root = url_filesystem(mirror)
        for entry in recorded_origin["files"]:
            path = f"{root.rstrip('/')}/{entry['path']}"
            try:
                size = fs.size(path)
            except FileNotFoundError as exc:
                raise DataError(
                    f"{repo.url(entry['path'])} is gone since this run started; restore it"
                ) from exc
            if size != entry["size"]:
                raise DataError(
                    f"{repo.url(entry['path'])} changed since this run started ({entry['size']} -> {size} "
                    "bytes); restore it, or start over with a new --out"
                )
        self._check_files_same(repo, recorded_origin)

    @classmethod
    def input_check(cls, recorded_origin: dict[str, Any]) -> Callable[[str], str | None]:
        """A file of a local mirror (as the sidecar names it: its resolved path) against the
        size and modification time the origin records; a hub file at a pinned commit, or in a
        mirror at a URL, cannot be told here (the default)."""
        mirror = recorded_origin.get("mirror")
        if not isinstance(mirror, str) or is_url(mirror):
            return super().input_check(recorded_origin)
        entries = {
            os.path.realpath(os.path.join(mirror, e["path"])): e
            for e in recorded_origin.get("files", [])
            if isinstance(e, dict) and isinstance(e.get("path"), str)
        }

        def changed(name: str) -> str | None:
            entry = entries.get(name)
            if entry is None:
                return None
            try:
                st = os.stat(name)
            except FileNotFoundError:
                return f"mirror file {name} is gone since prepare read it"
            if st.st_size != entry.get("size") or entry.get("mtime", st.st_mtime_ns) != st.st_mtime_ns:
                return (
                    f"mirror file {name} changed since prepare read it (its size or modification time "
                    "differs from the manifest's)"
                )
            return None

        return changed

    def _check_files_same(self, repo: Repo, recorded_origin: dict[str, Any]) -> None:
        """Every recorded file still has its footer (and, in the same local mirror, its
        modification time): a file rewritten in place at the same size is caught too."""
        entries = recorded_origin["files"]
        moved = repo.mirror != recorded_origin.get("mirror")  # a copy's files have new times
        layouts = file_layouts(repo, [e["path"] for e in entries])
        for entry, layout in zip(entries, layouts, strict=True):
            found = _file_entry(entry["split"], layout)
            if moved:
                entry = {k: v for k, v in entry.items() if k != "mtime"}
            if found != {**found, **entry}:  # a plan of an older tokshard has fewer keys
                raise DataError(
                    f"{repo.url(entry['path'])} changed since this run started (its modification time "
                    "or content); restore it, or start over with a new --out"
                )

    def partitions(self) -> list[Partition]:
        repo, layouts = self._plan()
        parts: list[Partition] = []
        for split, files in layouts.items():
            firsts = [0]
            for f in files:
                firsts.append(firsts[-1] + f.rows)
            index = 0
            for i, f in enumerate(files):
                for g0, g1 in _row_group_runs(f.row_group_bytes, self.config["partition_bytes"]):
                    start = firsts[i] + sum(f.row_group_rows[:g0])
                    stop = firsts[i] + sum(f.row_group_rows[: g1 + 1])
                    tail, split_end = _tail(files, firsts, i, stop, self.lookahead_rows)
                    spec = {
                        "revision": repo.revision,
                        "file": f.path,
                        "file_first": firsts[i],
                        "row_groups": [g0, g1],
                        "start": start,
                        "stop": stop,
                        "tail": tail,
                        "split_end": split_end,
                    }
                    key = f"{repo.repo}@{repo.revision}:{f.path}#rg{g0}-{g1}"
                    nbytes = max(1, sum(f.row_group_bytes[g0 : g1 + 1]))
                    parts.append(Partition(self.name, split, index, key, nbytes, spec))
                    index += 1
        return parts

    def plan_note(self, partitions: list[Partition]) -> str | None:
        """A partition_bytes so small that each task's fixed cost outweighs its work says so
        (a partition is a run of row groups: one row group at least, whatever the setting)."""
        setting = self.config["partition_bytes"]
        if setting >= DEFAULT_PARTITION_BYTES:
            return None
        _, layouts = self._plan()
        at_default = sum(
            len(list(_row_group_runs(f.row_group_bytes, DEFAULT_PARTITION_BYTES)))
            for files in layouts.values()
            for f in files
        )
        advice = (
            f"leave out the recipe's partition_bytes for the default, {DEFAULT_PARTITION_BYTES >> 20} MiB"
        )
        return small_partitions_note(self.name, partitions, setting, at_default, advice)

    def read(self, partition: Partition, cursor: Cursor | None) -> Iterator[Record]:
        spec = partition.spec
        start, stop = spec["start"], spec["stop"]
        begin = cursor["row"] if cursor else start
        if begin >= stop and cursor:
            return
        repo = self.at(spec["revision"])
        aligned = cursor is not None or start == 0
        rows = self._rows(repo, spec, begin, partition)
        span = max(1, stop - start)
        file_first = {spec["file"]: spec["file_first"], **dict(spec["tail"])}
        inputs = {name: Input(repo.url(name), "row") for name in file_first}
        for doc in self.documents(rows, begin, aligned, stop):
            where = f"{repo.describe()} {doc.file} row {doc.first}"
            progress = partition.size * min(span, doc.end - start) // span
            row = doc.first - file_first[doc.file]
            yield Record(doc.text, {"row": doc.end}, where, doc.bad, progress, inputs[doc.file], row)

    def documents(self, rows: Iterator[Rows], begin: int, aligned: bool, stop: int) -> Iterator[Doc]:
        """Documents starting at rows ``>= begin`` and ``< stop``; the default: one per row.

        ``aligned`` says a document starts at ``begin`` (the split's start or a cursor);
        otherwise a corpus whose documents span rows looks for the first start itself.
        An implementation stops pulling rows as soon as its last document is complete:
        past the rows the plan provides, pulling more is an error.
        """
        if begin >= stop:
            return
        for batch in rows:
            for i, values in enumerate(zip(*batch.columns, strict=True)):
                row = batch.first + i
                yield self.row_document(values, row, batch.file)
                if row + 1 >= stop:
                    return

    def row_document(self, values: tuple[Any, ...], row: int, file: str) -> Doc:
        """The document of one row (for corpora whose rows are documents)."""
        raise NotImplementedError

    # --- rows ----------------------------------------------------------------------------

    def _rows(self, repo: Repo, spec: dict[str, Any], begin: int, part: Partition) -> Iterator[Rows]:
        """Rows from ``begin`` on: this partition's file to its end, then the tail files."""
        yield from _file_rows(repo, spec["file"], spec["file_first"], begin, self.columns)
        for rel, first in spec["tail"]:
            yield from _file_rows(repo, rel, first, first, self.columns)
        if not spec["split_end"]:
            raise TokshardError(
                f"{repo.describe()} split {part.split}: a document of partition {part.index} runs more than "
                f"{self.lookahead_rows} rows past the partition's end; the layout is not what "
                f"{self.type!r} expects"
            )


def _file_entry(split: str, layout: FileLayout) -> dict[str, Any]:
    """One data file as the origin records it: what a resume checks it still is."""
    entry = {"split": split, "path": layout.path, "size": layout.size, "rows": layout.rows}
    entry["footer"] = layout.footer
    if layout.mtime is not None:
        entry["mtime"] = layout.mtime
    return entry


def _file_rows(repo: Repo, rel: str, file_first: int, begin: int, columns: tuple[str, ...]) -> Iterator[Rows]:
    """Rows of one file from global row ``begin`` on, one row group at a time."""
    import pyarrow.parquet as pq

    f = repo.open(rel)
    try:
        pf = pq.ParquetFile(f, page_checksum_verification=True)  # a flipped byte: an error
    except Exception as exc:
        f.close()
        raise read_error(exc, repo, rel) from exc
    with f:
        row = file_first
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if row + n <= begin:
                row += n
                continue
            try:
                batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=list(columns))
                for batch in batches:
                    lists = [batch.column(c).to_pylist() for c in range(batch.num_columns)]
                    skip = max(0, begin - row)
                    if skip:
                        lists = [col[skip:] for col in lists]
                    if lists[0]:
                        yield Rows(row + skip, lists, rel)
                    row += batch.num_rows
            except TokshardError:
                raise
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{repo.url(rel)} row group {g}: a text value is not UTF-8 ({exc.reason} at byte "
                    f"{exc.start}); the file was written without checking its text: fix that row in a "
                    "copy of the dataset and read the copy (a source's `mirror`)"
                ) from exc
            except Exception as exc:
                raise read_error(exc, repo, rel) from exc


def _row_group_runs(row_group_bytes: list[int], limit: int) -> Iterator[tuple[int, int]]:
    """Consecutive row groups, at most ``limit`` compressed bytes per run (one at least)."""
    g0, nbytes = 0, 0
    for g, b in enumerate(row_group_bytes):
        if g > g0 and nbytes + b > limit:
            yield g0, g - 1
            g0, nbytes = g, 0
        nbytes += b
    if row_group_bytes:
        yield g0, len(row_group_bytes) - 1


def _tail(
    files: list[FileLayout], firsts: list[int], i: int, stop: int, lookahead: int
) -> tuple[list[tuple[str, int]], bool]:
    """Files after file ``i`` that rows up to ``stop + lookahead`` fall in, and whether the
    rows a reader can see then end where the split ends."""
    tail: list[tuple[str, int]] = []
    j = i + 1
    while j < len(files) and firsts[j] < stop + lookahead:
        tail.append((files[j].path, firsts[j]))
        j += 1
    return tail, j == len(files)
