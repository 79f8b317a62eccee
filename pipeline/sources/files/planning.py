"""A split's files cut into pieces and the pieces packed into partitions.

A file of at most the partition size is one piece; a larger one is cut into pieces of about
that size, each a partition of its own: JSON Lines into line-aligned byte ranges from its
start, parquet into runs of row groups (a compressed file, or a .txt document, cannot be
cut). Whole files then fill partitions in file order while they fit, so many small files
share one task and one shard, and the partitions of large files are what they always were.

The partition size depends on the input alone, never on the workers, so the output does
not either."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.sources.files.access import open_binary
from pipeline.sources.files.fingerprints import SMALL_FILE, content_sample, io_map
from pipeline.sources.files.formats import kind_of
from pipeline.sources.files.listing import InputFile
from pipeline.sources.files.pieces import Piece
from pipeline.sources.files.readers.arrow import batch_sizes
from pipeline.sources.files.readers.base import corrupt_is_one_line
from pipeline.sources.files.readers.parquet import check_magic
from pipeline.storage.locations import is_url

#: partition_bytes = "auto": about AUTO_PARTITIONS tasks per split of AUTO_MIN_BYTES to
#: AUTO_MAX_BYTES each, yet at least AUTO_FEW tasks (of AUTO_SMALLEST or more) so a small split
#: still spreads over a few workers. Smaller tasks pay their fixed costs too often; 8 MiB
#: keeps the end of a run well balanced.
AUTO_PARTITIONS = 256
AUTO_MIN_BYTES = 8 << 20
AUTO_MAX_BYTES = 64 << 20
AUTO_FEW = 8
AUTO_SMALLEST = 1 << 20


def auto_partition_bytes(total: int) -> int:
    """The partition size for "auto": enough tasks to keep any cluster busy."""
    step = min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, total // AUTO_PARTITIONS))
    return min(step, max(AUTO_SMALLEST, -(-total // AUTO_FEW)))


def plan_pieces(files: list[InputFile], fingerprints: list[dict[str, Any]], step: int) -> list[Piece]:
    """The pieces of a split's files, in order, each with what a worker checks before reading
    it (``fingerprints``: the files' origin entries; a small object without a version tag
    reuses its sample). One pass, a piece per small file and little else: for 100,000 small
    files, this loop is most of the plan's time after the listing."""
    big = [
        (f.path, kind)
        for f in files
        if f.size > step and (kind := f.kind or kind_of(f.path)) in SPLIT_BY_GROUPS
    ]
    runs = dict(zip((p for p, _ in big), io_map(lambda pk: group_runs(*pk, step), big), strict=True))
    pieces: list[Piece] = []
    add = pieces.append
    for (path, size, mtime, etag, kind), entry in zip(files, fingerprints, strict=True):
        kind = kind or kind_of(path)
        if size <= SMALL_FILE:  # an object without a version tag: its file sample hashes it all
            add(Piece(path, kind, size, 0, None, None, mtime, entry.get("sample"), etag))
        elif (
            size <= step
            or kind not in (".jsonl", *SPLIT_BY_GROUPS)
            or (kind != ".jsonl" and runs[path] is None)
        ):
            add(Piece(path, kind, size, 0, None, None, mtime, None, etag))
        elif kind == ".jsonl":
            for start in range(0, size, step):
                end = min(size, start + step)
                add(Piece(path, kind, end - start, start, end, None, mtime, None, etag))
        else:
            pieces += [Piece(path, kind, n, 0, None, groups, mtime, None, etag) for groups, n in runs[path]]
    return with_range_samples(pieces)


def with_range_samples(pieces: list[Piece]) -> list[Piece]:
    """Every .jsonl piece of a file larger than `SMALL_FILE` gets a sample of its own ends
    (read on a few threads), unless it is an object with a version tag, which says more."""
    todo = [
        i
        for i, p in enumerate(pieces)
        if p.size > SMALL_FILE or not p.whole  # not a small whole file (its size tested first)
        if p.kind == ".jsonl" and p.sample is None and p.etag is None
    ]
    samples = io_map(lambda i: content_sample(pieces[i].path, pieces[i].start, pieces[i].stop), todo)
    found = list(pieces)
    for i, sample in zip(todo, samples, strict=True):
        found[i] = pieces[i]._replace(sample=sample)
    return found


def pack(pieces: Iterable[Piece], step: int) -> Iterator[list[Piece]]:
    """Consecutive whole files, as many per partition as fit in ``step`` bytes (one at least);
    each part of a file that had to be cut is a partition of its own, as it always was."""
    group: list[Piece] = []
    total = 0
    last_whole = True
    for piece in pieces:
        whole = piece.end is None and piece.row_groups is None  # (`Piece.whole`, inline: once per file)
        if group and (total + piece.size > step or not whole or not last_whole):
            yield group
            group, total = [], 0
        group.append(piece)
        total += piece.size
        last_whole = whole
    if group:
        yield group


#: the kinds a large file of which is read in runs of its groups (`Piece.row_groups`): parquet's
#: row groups, and a local Arrow file's record batches
SPLIT_BY_GROUPS = (".parquet", ".arrow")


def group_runs(path: str, kind: str, step: int) -> list[tuple[tuple[int, ...], int]] | None:
    """A large file's groups in consecutive runs of at most ``step`` bytes (one group at least),
    each with its bytes; None where the file is read whole (an object's Arrow stream, read from
    its start anyway; a stream with dictionary batches, which later batches depend on)."""
    if kind == ".parquet":
        return consecutive_runs(row_group_sizes(path), step)
    sizes = None if is_url(path) else batch_sizes(path)
    return None if sizes is None else consecutive_runs(sizes, step)


def row_group_sizes(path: str) -> list[int]:
    """A parquet file's row groups' compressed bytes: the footer is all that is read."""
    import pyarrow.parquet as pq

    with corrupt_is_one_line(path, "parquet"), open_binary(path) as f:
        check_magic(f, path)
        meta = pq.ParquetFile(f).metadata
    return [
        sum(meta.row_group(i).column(c).total_compressed_size for c in range(meta.row_group(i).num_columns))
        for i in range(meta.num_row_groups)
    ]


def consecutive_runs(sizes: list[int], step: int) -> list[tuple[tuple[int, ...], int]]:
    """Groups of these sizes in consecutive runs of at most ``step`` bytes (one group at least)."""
    runs: list[tuple[tuple[int, ...], int]] = []
    group: list[int] = []
    group_bytes = 0
    for i, rg_bytes in enumerate(sizes):
        if group and group_bytes + rg_bytes > step:
            runs.append((tuple(group), group_bytes))
            group, group_bytes = [], 0
        group.append(i)
        group_bytes += rg_bytes
    if group:
        runs.append((tuple(group), group_bytes))
    return runs
