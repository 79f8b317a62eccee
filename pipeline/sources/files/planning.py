"""A split's files cut into partitions: line-aligned byte ranges of JSON Lines, runs of
parquet row groups, whole compressed files, runs of .txt files.

The partition size depends on the input alone, never on the workers, so the output does
not either."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.sources.files.access import decompressed, file_size, open_binary
from pipeline.sources.files.formats import PARQUET_MAGIC, check_not_json_array, is_json_name, kind_of
from pipeline.sources.files.readers.parquet import corrupt_parquet_is_one_line

#: partition_bytes = "auto": about AUTO_PARTITIONS tasks per split of AUTO_MIN_BYTES to
#: AUTO_MAX_BYTES each, yet at least AUTO_FEW tasks (of AUTO_SMALLEST or more) so a small split
#: still spreads over a few workers. Smaller tasks pay their fixed costs too often; 8 MiB
#: keeps the end of a run well balanced.
AUTO_PARTITIONS = 256
AUTO_MIN_BYTES = 8 << 20
AUTO_MAX_BYTES = 64 << 20
AUTO_FEW = 8
AUTO_SMALLEST = 1 << 20

Unit = tuple[str, int, dict[str, Any]]  # key, bytes, spec


def auto_partition_bytes(total: int) -> int:
    """The partition size for "auto": enough tasks to keep any cluster busy."""
    step = min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, total // AUTO_PARTITIONS))
    return min(step, max(AUTO_SMALLEST, -(-total // AUTO_FEW)))


def check_json_lines(path: str) -> None:
    """A .json file may be one JSON array instead of JSON Lines: say so by name at planning."""
    if not is_json_name(path):
        return
    kind = kind_of(path)
    try:
        with open_binary(path) if kind == ".jsonl" else decompressed(path, kind) as f:
            head = f.read(4096)
    except Exception:  # a damaged file is named, with its fault, when it is read
        return
    check_not_json_array(path, head)


def units(files: list[str], step: int) -> Iterator[Unit]:
    """Partitions of one split's files: byte ranges, row-group runs, or runs of .txt files."""
    txt: list[str] = []
    txt_bytes = 0
    for path in files:
        kind = kind_of(path)
        check_json_lines(path)
        if kind == ".txt":
            size = file_size(path)
            if txt and txt_bytes + size > step:
                yield f"{txt[0]}+{len(txt) - 1}", txt_bytes, {"kind": kind, "files": txt}
                txt, txt_bytes = [], 0
            txt.append(path)
            txt_bytes += size
            continue
        if txt:
            yield f"{txt[0]}+{len(txt) - 1}", txt_bytes, {"kind": ".txt", "files": txt}
            txt, txt_bytes = [], 0
        yield from _split_file(path, kind, step)
    if txt:
        yield f"{txt[0]}+{len(txt) - 1}", txt_bytes, {"kind": ".txt", "files": txt}


def _split_file(path: str, kind: str, step: int) -> Iterator[Unit]:
    if kind == ".jsonl":
        size = file_size(path)
        for start in range(0, max(size, 1), step):
            end = min(size, start + step)
            yield (
                f"{path}@{start}-{end}",
                end - start,
                {"kind": kind, "path": path, "start": start, "end": end},
            )
    elif kind == ".parquet":
        yield from _row_group_runs(path, step)
    else:
        yield path, file_size(path), {"kind": kind, "path": path}


def _row_group_runs(path: str, step: int) -> Iterator[Unit]:
    import pyarrow.parquet as pq

    with corrupt_parquet_is_one_line(path), open_binary(path) as f:
        if f.read(4) not in PARQUET_MAGIC:  # pyarrow checks only the footer's
            raise OSError("no parquet magic number at its start")
        meta = pq.ParquetFile(f).metadata
    group: list[int] = []
    group_bytes = 0
    groups: list[tuple[list[int], int]] = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_bytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if group and group_bytes + rg_bytes > step:
            groups.append((group, group_bytes))
            group, group_bytes = [], 0
        group.append(i)
        group_bytes += rg_bytes
    if group:
        groups.append((group, group_bytes))
    for rgs, nbytes in groups:
        rows = sum(meta.row_group(i).num_rows for i in rgs)
        spec = {"kind": ".parquet", "path": path, "row_groups": rgs, "rows": rows}
        yield f"{path}#rg{rgs[0]}-{rgs[-1]}", nbytes, spec
