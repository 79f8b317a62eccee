"""The one reader of tokshard shards (numpy and the standard library only).

A shard is a pair of files:

* ``NAME.bin``: token ids, little-endian, documents back to back, each ending in EOS.
  No header, so ``numpy.memmap(path, dtype=numpy.uint16)`` reads it as nanoGPT does.
* ``NAME.idx``: Megatron-LM's ``MMapIndexedDataset`` index, so Megatron-LM,
  Megatron-DeepSpeed and GPT-NeoX read our shards unchanged::

      magic    b"MMIDIDX\\x00\\x00"
      version  <Q  = 1
      dtype    <B  (8 = uint16; 4 = int32, used for uint32 ids, which Megatron has no code for)
      count    <Q  number of sequences (documents) n
      doc_cnt  <Q  n + 1
      lengths  int32[n]   tokens per document, EOS included
      pointers int64[n]   byte offset of each document in the .bin
      doc_idx  int64[n+1] 0, 1, ..., n (every sequence is a document)

The shard writer (``pipeline.format.shard_writer``) imports its constants from here, so the
format has exactly one definition.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.format.errors import TokshardError
from pipeline.format.file_kind import require_file
from pipeline.format.token_dtypes import TOKEN_DTYPES

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")

#: token dtype name -> (numpy dtype, Megatron dtype code written in the .idx)
DTYPES: dict[str, tuple[np.dtype, int]] = {
    name: (np.dtype(numpy_name), code) for name, (numpy_name, code) in TOKEN_DTYPES.items()
}


class ShardFormatError(ValueError):
    """A shard's files do not follow the format; the message names the file."""


def token_dtype(name: str) -> np.dtype:
    if name not in DTYPES:
        raise ShardFormatError(f"unknown token dtype {name!r}: use one of {sorted(DTYPES)}")
    return DTYPES[name][0]


@dataclass(frozen=True)
class ShardIndex:
    """The parsed .idx: per-document lengths (EOS included) and byte offsets."""

    dtype_code: int
    lengths: np.ndarray
    pointers: np.ndarray
    doc_indices: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.lengths)


def read_index(path: str | os.PathLike) -> ShardIndex:
    """Parse a Megatron .idx file, refusing anything that is not exactly the layout."""
    path = Path(path)
    require_file(path)
    raw = path.read_bytes()
    if len(raw) < HEADER.size:
        raise ShardFormatError(f"{path}: index is truncated ({len(raw)} bytes)")
    magic, version, code, count, doc_count = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise ShardFormatError(f"{path}: not a Megatron MMapIndexedDataset index (bad magic)")
    if version != VERSION:
        raise ShardFormatError(f"{path}: index version {version}, expected {VERSION}")
    expected = HEADER.size + 4 * count + 8 * count + 8 * doc_count
    if len(raw) != expected:
        raise ShardFormatError(f"{path}: index is {len(raw)} bytes, its header implies {expected}")
    offset = HEADER.size
    lengths = np.frombuffer(raw, dtype="<i4", count=count, offset=offset)
    offset += 4 * count
    pointers = np.frombuffer(raw, dtype="<i8", count=count, offset=offset)
    offset += 8 * count
    doc_indices = np.frombuffer(raw, dtype="<i8", count=doc_count, offset=offset)
    return ShardIndex(code, lengths, pointers, doc_indices)


def read_dtype_code(path: str | os.PathLike) -> int:
    """The dtype code in an .idx header, reading the header alone (a start-up check)."""
    require_file(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise ShardFormatError(f"{path}: index is truncated ({len(head)} bytes)")
    return HEADER.unpack(head)[2]


def dtype_named_by(code: int) -> str | None:
    """The token dtype name an .idx dtype code stands for (None: not one of ours)."""
    return next((name for name, (_, c) in DTYPES.items() if c == code), None)


def index_size(documents: int) -> int:
    """The bytes of an index of ``documents`` documents (each one sequence): its header, a
    length and a pointer per sequence, and the document boundaries, one more than documents."""
    return HEADER.size + (4 + 8) * documents + 8 * (documents + 1)


def index_bytes(lengths: np.ndarray, dtype: str) -> bytes:
    """Serialize an index for documents of these lengths (used by the writer)."""
    np_dtype, code = DTYPES[dtype]
    lengths = np.asarray(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], dtype="<i8", out=pointers[1:])
    pointers *= np_dtype.itemsize
    doc_indices = np.arange(len(lengths) + 1, dtype="<i8")
    header = HEADER.pack(MAGIC, VERSION, code, len(lengths), len(doc_indices))
    return header + lengths.tobytes() + pointers.tobytes() + doc_indices.tobytes()


def unmappable(path: Path, exc: OSError) -> Exception:
    """Why a whole shard cannot be memory-mapped, as one line where the machine, not the data,
    is the cause: a filesystem without mmap (some FUSE mounts answer ENODEV) or a process at
    the kernel's limit of memory maps (ENOMEM: ``vm.max_map_count``, one map per shard)."""
    if exc.errno in (errno.ENODEV, errno.ENOTSUP, errno.EOPNOTSUPP):
        return TokshardError(
            f"{path}: this filesystem cannot memory-map files ({exc.strerror}), and shards are read "
            "by memory map; copy the folder to a local disk or a filesystem that can (NFS, Lustre "
            "and GPFS can), then point at the copy"
        )
    if exc.errno == errno.ENOMEM:
        try:
            limit = f" ({int(Path('/proc/sys/vm/max_map_count').read_text())})"
        except (OSError, ValueError):
            limit = ""
        return TokshardError(
            f"{path}: cannot memory-map another shard: this process holds as many memory maps as "
            f"the kernel allows (vm.max_map_count{limit}, one per shard); raise it (sysctl -w "
            "vm.max_map_count=1048576) or prepare fewer, larger shards (--shard-tokens)"
        )
    return exc


class Shard:
    """One shard pair, memory-mapped on first use; opening costs two stat calls, not a read."""

    def __init__(self, bin_path: str | os.PathLike, dtype: str = "uint16") -> None:
        self.bin_path = Path(bin_path)
        self.idx_path = self.bin_path.with_suffix(".idx")
        self.dtype_name = dtype
        self.dtype = token_dtype(dtype)

    @cached_property
    def tokens(self) -> np.ndarray:
        """All tokens of the shard as a read-only memory map (no copy, no read-ahead)."""
        if require_file(self.bin_path).st_size == 0:
            return np.empty(0, dtype=self.dtype)
        try:
            return np.memmap(self.bin_path, dtype=self.dtype, mode="r")
        except OSError as exc:
            raise unmappable(self.bin_path, exc) from exc

    @cached_property
    def index(self) -> ShardIndex:
        return read_index(self.idx_path)

    def __len__(self) -> int:
        return self.index.documents

    def document(self, i: int) -> np.ndarray:
        """Tokens of document i, its BOS (if the run writes one) and trailing EOS included."""
        start = int(self.index.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.index.lengths[i])]

    def problems(self, eos_id: int | None = None, bos_id: int | None = None) -> list[str]:
        """Every way the .idx disagrees with the .bin or the format (empty list: consistent)."""
        found: list[str] = []
        try:
            index = self.index
        except (OSError, ShardFormatError) as exc:
            return [str(exc)]
        code = DTYPES[self.dtype_name][1]
        if index.dtype_code != code:
            found.append(
                f"{self.idx_path}: dtype code {index.dtype_code}, expected {code} ({self.dtype_name})"
            )
        lengths = index.lengths.astype(np.int64)
        if (lengths <= 0).any():
            found.append(f"{self.idx_path}: a document has length <= 0")
        expected_pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * self.dtype.itemsize
        if len(lengths) and not np.array_equal(index.pointers, expected_pointers):
            found.append(f"{self.idx_path}: byte offsets do not follow the document lengths")
        if not np.array_equal(index.doc_indices, np.arange(len(lengths) + 1)):
            found.append(f"{self.idx_path}: document indices are not 0..{len(lengths)}")
        try:
            size = self.bin_path.stat().st_size
        except OSError as exc:
            return [*found, f"{self.bin_path}: {exc.strerror}"]
        want = int(lengths.sum()) * self.dtype.itemsize
        if size != want:
            found.append(f"{self.bin_path}: {size} bytes, the index describes {want}")
        elif len(lengths):
            ends = np.cumsum(lengths) - 1
            if eos_id is not None and not (self.tokens[ends] == eos_id).all():
                found.append(f"{self.bin_path}: a document does not end with EOS id {eos_id}")
            if bos_id is not None and not (self.tokens[ends - lengths + 1] == bos_id).all():
                found.append(f"{self.bin_path}: a document does not start with BOS id {bos_id}")
        return found
