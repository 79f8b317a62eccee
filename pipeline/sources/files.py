"""The `files` source: local or fsspec paths in .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt.

Big files are split so that one 50 GB file still spreads over every worker: plain JSON
lines by line-aligned byte ranges (a range owns the lines that *start* in it), parquet by
groups of row groups. Compressed JSON lines cannot be cut without reading them from the
start, so each such file is one partition (ship many of them, or parquet, for parallelism).
A .txt file is one document; a large one is streamed to the encoder in pieces.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import glob
import gzip
import io
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, ClassVar

import orjson
import xxhash

from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.base import Cursor, Partition, Record, Source, check_globs, check_path_name
from pipeline.storage.locations import checked_location, is_url
from pipeline.storage.object_store import errors as store_errors

#: file name endings (in any case) and the reader each gets; a .json file is read as JSON Lines,
#: as `datasets` reads it and as corpora ship it (C4's ``c4-train.00000-of-01024.json.gz``)
SUFFIXES = {
    ".jsonl": ".jsonl",
    ".jsonl.gz": ".jsonl.gz",
    ".jsonl.zst": ".jsonl.zst",
    ".json": ".jsonl",
    ".json.gz": ".jsonl.gz",
    ".json.zst": ".jsonl.zst",
    ".parquet": ".parquet",
    ".txt": ".txt",
}
#: partition_bytes = "auto": about AUTO_PARTITIONS tasks per split of AUTO_MIN_BYTES to
#: AUTO_MAX_BYTES each, yet at least AUTO_FEW tasks (of AUTO_SMALLEST or more) so a small split
#: still spreads over a few workers. It depends on the input alone, never on the workers, so
#: the output does not either. Smaller tasks pay their fixed costs too often: on 500 MB with
#: 2 workers, 2 MiB tasks reached 0.76 of tiktoken's ceiling, 8 and 16 MiB ones 0.85
#: (bench/RESULTS.md, Fast encoder); 8 MiB keeps the end of a run better balanced.
AUTO_PARTITIONS = 256
AUTO_MIN_BYTES = 8 << 20
AUTO_MAX_BYTES = 64 << 20
AUTO_FEW = 8
AUTO_SMALLEST = 1 << 20
#: what a parquet file starts with (plain, or encrypted footer)
PARQUET_MAGIC = (b"PAR1", b"PARE")
#: bytes hashed at each end of an input file, and of a .jsonl range, to notice edits in place
FILE_SAMPLE = 1 << 20
RANGE_SAMPLE = 64 << 10
#: .txt files larger than this reach the encoder as a stream, never as one string
STREAM_TXT_BYTES = 16 << 20
_STREAM_CHUNK = 4 << 20


def kind_of(path: str) -> str:
    name = path.lower()
    for suffix, kind in SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    raise TokshardError(
        f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)} (or rename the file)"
    )


def check_json_lines(path: str) -> None:
    """A .json file may be one JSON array instead of JSON Lines: say so by name at planning,
    not as a "malformed JSON" record at its line 1 (or, skipping bad records, no text at all)."""
    if not path.lower().endswith((".json", ".json.gz", ".json.zst")):
        return
    kind = kind_of(path)
    try:
        with open_binary(path) if kind == ".jsonl" else _decompressed(path, kind) as f:
            head = f.read(4096).lstrip()
    except Exception:  # a damaged file is named, with its fault, when it is read
        return
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:].lstrip()
    if head.startswith(b"["):
        raise DataError(
            f"{path} holds one JSON array, not JSON Lines (one object per line); convert it "
            "(e.g. with jq -c '.[]') and name the converted file"
        )


def open_binary(path: str) -> BinaryIO:
    if is_url(path):
        import fsspec

        with store_errors(path):
            return fsspec.open(path, "rb").open()
    return open(path, "rb", buffering=1 << 20)


def expand(patterns: list[str], base_dir: str) -> list[str]:
    """Shell-style globs (``*``, ``?``, ``[..]``, ``**``; relative ones against base_dir) into a
    sorted file list in which each file appears once, however many patterns name it: local
    paths are resolved to absolute ones first, so ``a.jsonl`` and ``./a.jsonl`` are one file."""
    found: set[str] = set()
    for pattern in map(checked_location, patterns):  # a recipe's paths skip argparse's check
        if is_url(pattern):
            with store_errors(pattern):
                found.update(_url_matches(pattern))
        else:
            found.update(_local_matches(pattern, base_dir))
    return sorted(found)


def _local_matches(pattern: str, base_dir: str) -> list[str]:
    expanded = os.path.expanduser(pattern)
    path = os.path.join(base_dir, expanded)
    if os.path.isdir(path):
        raise TokshardError(_directory_given(pattern))
    if os.path.isfile(path):  # a file whose name holds [ or ? is itself, not a pattern
        return [os.path.realpath(path)]
    matches = (
        glob.glob(os.path.join(glob.escape(base_dir), expanded), recursive=True)
        if glob.has_magic(expanded)
        else []
    )
    files = [os.path.realpath(m) for m in matches if os.path.isfile(m)]
    if not files:
        shown = pattern if os.path.isabs(expanded) or base_dir in ("", ".") else f"{pattern} (in {base_dir})"
        raise TokshardError(_nothing_matches(shown, any(os.path.isdir(m) for m in matches)))
    return files


def _url_matches(pattern: str) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(pattern)
    if not glob.has_magic(path):
        if fs.isdir(path):
            raise TokshardError(_directory_given(pattern))
        if not fs.exists(path):
            raise TokshardError(_nothing_matches(pattern, False))
        return [fs.unstrip_protocol(path)]
    matches = fs.glob(path, detail=True)  # one listing says which are folders
    files = [fs.unstrip_protocol(m) for m, info in matches.items() if info.get("type") != "directory"]
    if not files:
        raise TokshardError(_nothing_matches(pattern, bool(matches)))
    return files


def _directory_given(pattern: str) -> str:
    folder = pattern.rstrip("/") or "/"
    return f"{folder} is a directory; name the files in it, e.g. '{folder}/*.jsonl' (quoted)"


def _nothing_matches(pattern: str, only_directories: bool) -> str:
    if only_directories:
        return f"{pattern!r} matches only directories; name the files in them, e.g. '.../*.jsonl'"
    if glob.has_magic(pattern):
        return f"no files match {pattern!r}; check the path or glob"
    return f"no files match {pattern!r} (no such file); check the path"


def file_size(path: str) -> int:
    if is_url(path):
        import fsspec

        with store_errors(path):
            fs, p = fsspec.core.url_to_fs(path)
            return int(fs.size(p))
    return os.path.getsize(path)


def stat_key(path: str) -> dict[str, Any]:
    """What identifies a file's content cheaply: size, modification time, and a hash of its
    first and last MiB (an edit in place that keeps size and time still shows there, unless
    it touches only the middle of a big file; the .jsonl ranges have samples of their own)."""
    if is_url(path):
        import fsspec

        with store_errors(path):
            fs, p = fsspec.core.url_to_fs(path)
            info = fs.info(p)
        size, mtime = int(info["size"]), str(info.get("mtime", ""))
    else:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    return {"path": path, "size": size, "mtime": mtime, "sample": content_sample(path, 0, size, FILE_SAMPLE)}


def content_sample(path: str, start: int, end: int, edge: int) -> str:
    """xxh3 of the first and last ``edge`` bytes of ``path``'s bytes [start, end) (all of
    them if fewer than 2 * edge): a check for edits in place at a bounded read."""
    h = xxhash.xxh3_128()
    with open_binary(path) as f:
        f.seek(start)
        if end - start <= 2 * edge:
            h.update(f.read(end - start))
        else:
            h.update(f.read(edge))
            f.seek(end - edge)
            h.update(f.read(edge))
    return h.hexdigest()


def _stat_key_now(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded input's `stat_key` as of now; a file gone is the user's to restore."""
    try:
        return stat_key(entry["path"])
    except OSError as exc:
        raise TokshardError(
            f"input {entry['path']} is gone since this run started; restore it or use a new --out"
        ) from exc


def io_map(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` on a few threads: each call is a small read (a stat, a
    sample), which on object storage is a request's round trip, not work."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(fn, items))


def _range_sample(spec: dict[str, Any]) -> str:
    return content_sample(spec["path"], spec["start"], spec["end"], RANGE_SAMPLE)


def check_range_unchanged(path: str, spec: dict[str, Any]) -> None:
    """A worker's check, when it starts or resumes a .jsonl range, that the range still holds
    what was planned (a plan of an older tokshard has no sample: nothing to check)."""
    if "sample" not in spec:
        return
    try:
        sample = _range_sample(spec)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
    if sample != spec["sample"]:
        raise DataError(
            f"input {path} changed since this run started (bytes {spec['start']}-{spec['end']} differ); "
            "restore it or start over with a new --out"
        )


class TextStream:
    """A document too large to hold as one string: UTF-8 decoded chunk by chunk."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")  # a BOM is no text
        with open_binary(self.path) as f:
            while chunk := f.read(_STREAM_CHUNK):
                yield decoder.decode(chunk)
            yield decoder.decode(b"", final=True)


def json_text(line: bytes, field: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason) for one JSON line.

    orjson parses (twice as fast as `json`: parsing is most of a task's time besides
    encoding); what it refuses goes to `json`, which accepts a little more (a BOM, NaN, lone
    surrogates) and names the fault, so every line reads exactly as `json` reads it."""
    try:
        obj, strict = orjson.loads(line), True
    except orjson.JSONDecodeError:
        strict = False
        try:
            obj = json.loads(line)
        except UnicodeDecodeError:
            return None, "invalid UTF-8"
        except json.JSONDecodeError:
            return None, "malformed JSON"
        except RecursionError:
            return None, "JSON nested too deeply"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    if field not in obj or obj[field] is None:
        return None, f"missing field {field!r}"
    text = obj[field]
    if not isinstance(text, str):
        return None, f"non-string field {field!r}"
    return (text, None) if strict else checked(text)  # orjson refuses lone surrogates itself


def checked(text: str) -> tuple[str | None, str | None]:
    """Lone surrogates (from JSON escapes) cannot be UTF-8 encoded: a bad record, not a crash."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None, "invalid unicode (lone surrogate)"
    return text, None


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
            for entry, now in zip(entries, io_map(_stat_key_now, entries), strict=True):
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
            for i, (key, size, spec) in enumerate(self._units(files, step)):
                parts.append(Partition(self.name, split, i, key, size, spec))
        ranges = [p.spec for p in parts if p.spec["kind"] == ".jsonl"]
        for spec, sample in zip(ranges, io_map(_range_sample, ranges), strict=True):
            spec["sample"] = sample
        return parts

    def partition_bytes(self, files: list[str]) -> int:
        """The configured size, or for "auto" enough tasks to keep any cluster busy."""
        configured = self.config["partition_bytes"]
        if configured != "auto":
            return configured
        total = sum(file_size(f) for f in files)
        step = min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, total // AUTO_PARTITIONS))
        return min(step, max(AUTO_SMALLEST, -(-total // AUTO_FEW)))

    def _units(self, files: list[str], step: int) -> Iterator[tuple[str, int, dict[str, Any]]]:
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
            yield from self._split_file(path, kind, step)
        if txt:
            yield f"{txt[0]}+{len(txt) - 1}", txt_bytes, {"kind": ".txt", "files": txt}

    def _split_file(self, path: str, kind: str, step: int) -> Iterator[tuple[str, int, dict[str, Any]]]:
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
                spec = {"kind": kind, "path": path, "row_groups": rgs, "rows": rows}
                yield f"{path}#rg{rgs[0]}-{rgs[-1]}", nbytes, spec
        else:
            yield path, file_size(path), {"kind": kind, "path": path}

    def read(self, partition: Partition, cursor: Cursor | None) -> Iterator[Record]:
        spec = partition.spec
        kind = spec["kind"]
        field = self.config["text_field"]
        if kind == ".jsonl":
            yield from _read_jsonl_range(spec, field, cursor)
        elif kind in (".jsonl.gz", ".jsonl.zst"):
            yield from _read_jsonl_compressed(spec, field, cursor)
        elif kind == ".parquet":
            yield from _read_parquet(spec, field, cursor, partition.size)
        else:
            yield from _read_txt(spec, cursor)


def _line_number(path: str, offset: int) -> int:
    """1-based line number of the byte at ``offset`` (only computed to report an error)."""
    count = 0
    with open_binary(path) as f:
        remaining = offset
        while remaining > 0 and (chunk := f.read(min(1 << 24, remaining))):
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count + 1


def _read_jsonl_range(spec: dict[str, Any], field: str, cursor: Cursor | None) -> Iterator[Record]:
    path, start, end = spec["path"], spec["start"], spec["end"]
    check_range_unchanged(path, spec)
    with open_binary(path) as f:
        if cursor is not None:
            pos = cursor["offset"]
            f.seek(pos)
        elif start > 0:  # the line under way at ``start`` belongs to the partition before
            pos = _after_newline(f, start - 1)
            f.seek(pos)
        else:
            pos = 0
        read_line = (lambda _pos: f.readline()) if is_url(path) else functools.partial(_read_line, f)
        while pos < end:
            line = read_line(pos)
            if not line:
                break
            line_start = pos
            pos += len(line)
            if not line or line.isspace():  # (strip() would copy a long line to find out)
                continue
            text, bad = json_text(line, field)
            where = f"{path}:{_line_number(path, line_start)}" if bad else path
            yield Record(text, {"offset": pos}, where, bad, pos - start)


def _read_line(f: BinaryIO, pos: int, head: int = 1 << 20) -> bytes:
    """The line at ``pos`` (where ``f`` stands). One longer than ``head`` is measured first
    (`_after_newline`) and then read in one piece, which takes half the time of `readline`
    gathering a 9 MB line in chunks and joining them (bench/RESULTS.md)."""
    line = f.readline(head)
    if len(line) < head or line.endswith(b"\n"):
        return line
    end = _after_newline(f, pos + len(line))
    f.seek(pos)
    return f.read(end - pos)


def _after_newline(f: BinaryIO, offset: int, chunk: int = 1 << 18) -> int:
    """The offset just past the first newline at or after ``offset`` (the end if none), found
    in one reused buffer: a partition starting inside a 9 MB line skips its rest without
    building it (which cost as much as reading it, bench/RESULTS.md)."""
    f.seek(offset)
    buf = bytearray(chunk)
    with memoryview(buf) as view:
        while got := f.readinto(view):
            found = buf.find(b"\n", 0, got)
            if found >= 0:
                return offset + found + 1
            offset += got
    return offset


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame (skippable ones included).

    zstandard's own readers take a file that ends inside a frame for a short, valid one
    (a truncated download would lose its end silently), so this one decodes frame by frame
    and raises `TruncatedInput` when the file ends before its last frame does."""

    #: compressed bytes per step: a small step bounds the memory one step decompresses into
    STEP = 1 << 16

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame: Any = None  # the decompressor of the frame being read, if any
        self._leftover = b""  # compressed bytes after the frame that just ended
        self._out = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._out:
            chunk, self._leftover = self._leftover or self._raw.read(self.STEP), b""
            if not chunk:
                if self._frame is not None:
                    raise TruncatedInput("the file ends inside a zstd frame (truncated?)")
                return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            self._out = self._frame.decompress(chunk)
            if self._frame.eof:
                self._leftover, self._frame = self._frame.unused_data, None
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._raw.close()
        super().close()


class TruncatedInput(EOFError):
    """A compressed file ends before its compressed data does."""


def _decompressed(path: str, kind: str) -> BinaryIO:
    raw = open_binary(path)
    if kind == ".jsonl.gz":
        return gzip.GzipFile(fileobj=raw)
    return io.BufferedReader(ZstdFrames(raw), 1 << 20)


def _read_jsonl_compressed(spec: dict[str, Any], field: str, cursor: Cursor | None) -> Iterator[Record]:
    path = spec["path"]
    skip = cursor["line"] if cursor else 0
    try:
        with _decompressed(path, spec["kind"]) as f:
            for lineno, line in enumerate(f, 1):
                if lineno <= skip or not line or line.isspace():
                    continue
                text, bad = json_text(line, field)
                yield Record(text, {"line": lineno}, f"{path}:{lineno}", bad, _raw_pos(f))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: corrupt compressed file ({exc}); re-create it or remove it") from exc
    except Exception as exc:
        if type(exc).__name__ == "ZstdError":
            raise DataError(f"{path}: corrupt zstd file ({exc}); re-create it or remove it") from exc
        raise


def _raw_pos(f: Any) -> int:
    """Compressed bytes consumed so far (progress only; 0 if the stream does not say)."""
    try:
        return f.fileobj.tell() if isinstance(f, gzip.GzipFile) else f.raw.tell()
    except (AttributeError, OSError, ValueError):
        return 0


@contextlib.contextmanager
def corrupt_parquet_is_one_line(path: str) -> Iterator[None]:
    """pyarrow's errors for a damaged file (bad magic, a cut footer, a flipped page) become
    one line that names the file."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError as exc:
        raise DataError(f"{path}: input file is gone; restore it and rerun") from exc
    except (pa.ArrowException, OSError, EOFError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: corrupt parquet file ({why}); re-create it or remove it") from exc


def _read_parquet(spec: dict[str, Any], field: str, cursor: Cursor | None, size: int) -> Iterator[Record]:
    path = spec["path"]
    with corrupt_parquet_is_one_line(path), open_binary(path) as f:
        yield from _parquet_records(f, spec, field, cursor, size)


def _parquet_records(
    f: BinaryIO, spec: dict[str, Any], field: str, cursor: Cursor | None, size: int
) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = spec["path"]
    skip = cursor["row"] if cursor else 0
    total_rows = max(spec["rows"], 1)
    # pages written with checksums are checked: a flipped byte is an error, not other text
    pf = pq.ParquetFile(f, page_checksum_verification=True)
    if field not in pf.schema_arrow.names:
        raise TokshardError(
            f"{path}: no column {field!r} (columns: {', '.join(pf.schema_arrow.names)}); set text_field"
        )
    col_type = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise TokshardError(f"{path}: column {field!r} is {col_type}, not text; set text_field")
    row = 0
    for batch in pf.iter_batches(batch_size=1024, row_groups=spec["row_groups"], columns=[field]):
        if row + batch.num_rows <= skip:
            row += batch.num_rows
            continue
        values = batch.column(0).to_pylist()
        for value in values:
            row += 1
            if row <= skip:
                continue
            where = f"{path} row group {spec['row_groups'][0]}+, row {row}"
            text, bad = (None, f"missing field {field!r}") if value is None else checked(value)
            yield Record(text, {"row": row}, where, bad, size * row // total_rows)


def _read_txt(spec: dict[str, Any], cursor: Cursor | None) -> Iterator[Record]:
    files = spec["files"]
    done = 0
    for i, path in enumerate(files):
        size = file_size(path)
        done += size
        if cursor and i < cursor["file"]:
            continue
        if size > STREAM_TXT_BYTES:
            yield Record(TextStream(path, size), {"file": i + 1}, path, None, done)  # type: ignore[arg-type]
            continue
        with open_binary(path) as f:
            data = f.read()
        try:
            text, bad = data.decode("utf-8-sig"), None  # a BOM is no text (as in JSON lines)
        except UnicodeDecodeError:
            text, bad = None, "invalid UTF-8"
        yield Record(text, {"file": i + 1}, path, bad, done)


def iter_texts(files: list[str], field: str = "text") -> Iterator[str]:
    """Every good document of these files in order (for tokenizer training and tools)."""
    source = FilesSource("input", {"text_field": field})
    for path in files:
        for key, size, spec in source._units([path], step=1 << 62):
            part = Partition("input", "train", 0, key, size, spec)
            for rec in source.read(part, None):
                if isinstance(rec.text, str):
                    yield rec.text
                elif isinstance(rec.text, TextStream):
                    yield "".join(rec.text)
