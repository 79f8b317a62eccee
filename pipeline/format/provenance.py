"""Provenance sidecars: where each document of a shard came from (numpy and stdlib only).

Beside ``NAME.bin``/``NAME.idx`` a shard has ``NAME.origin``, one entry per document of the
``.idx``, in the same order: the input (a local path, a URL, or a hub file's URL at its
revision), the unit its place is counted in (``line``, 1-based; ``row``, 0-based; ``offset``,
bytes) and the place. Layout::

    magic    b"TKORIGIN"
    header   <II   version, length of the JSON that follows
    JSON     {"documents": n, "inputs": [[input, unit], ...]}  (sorted keys, compact)
    body     zlib of int64[2n]: the n input numbers, then the n places, each delta-encoded,
             stored byte plane by byte plane (all lowest bytes first, ..., highest last)

Consecutive documents mostly come from one input at growing places, so the deltas are small:
their high byte planes are zeros and the body compresses to a byte or two per document. The sidecar is written under a temporary
name, fsynced and renamed like the shard, and hashed into the manifest (``origin_hash``).

While a shard is open its entries go to ``NAME.orig.tmp``, an append-only text log (a line
``+["input","unit"]`` introduces an input, a line ``N PLACE`` is one document) that the
shard's commits fsync; reopening it keeps exactly the committed number of documents, so a
kill and a rerun give the same bytes.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

MAGIC = b"TKORIGIN"
VERSION = 1
HEADER = struct.Struct("<8sII")
SUFFIX = ".origin"
LOG_SUFFIX = ".orig.tmp"
UNITS = ("line", "row", "offset")
#: the input of a document whose source named no place (a source without locations)
UNKNOWN = ("", "offset")


class Origin(NamedTuple):
    """One document's place in its input (``unit``: one of `UNITS`)."""

    input: str
    unit: str
    place: int


UNKNOWN_ORIGIN = Origin(*UNKNOWN, 0)


class ProvenanceError(ValueError):
    """A sidecar does not follow the format; the message names the file."""


@dataclass(frozen=True)
class Origins:
    """A parsed sidecar: per document, the number of its input and its place."""

    inputs: list[tuple[str, str]]
    input_of: np.ndarray
    place: np.ndarray

    def __len__(self) -> int:
        return len(self.place)

    def __getitem__(self, doc: int) -> Origin:
        name, unit = self.inputs[int(self.input_of[doc])]
        return Origin(name, unit, int(self.place[doc]))


def sidecar_path(bin_path: Path) -> Path:
    return bin_path.with_suffix(SUFFIX)


def encode(origins: Origins) -> bytes:
    """The sidecar's bytes for ``origins`` (a pure function of them)."""
    header = json.dumps(
        {"documents": len(origins), "inputs": [list(k) for k in origins.inputs]},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    input_of = np.asarray(origins.input_of, np.int64)
    place = np.asarray(origins.place, np.int64)
    deltas = np.concatenate([_delta(input_of), _delta(place)]).astype("<i8")
    body = np.ascontiguousarray(deltas.view(np.uint8).reshape(-1, 8).T).tobytes()
    return HEADER.pack(MAGIC, VERSION, len(header)) + header + zlib.compress(body, 6)


def _delta(a: np.ndarray) -> np.ndarray:
    return np.diff(a, prepend=np.int64(0)) if len(a) else a


def decode(raw: bytes, where: str | os.PathLike = "sidecar") -> Origins:
    """Parse a sidecar's bytes, refusing anything that is not exactly the layout."""
    if len(raw) < HEADER.size:
        raise ProvenanceError(f"{where}: provenance sidecar is truncated ({len(raw)} bytes)")
    magic, version, size = HEADER.unpack_from(raw)
    if magic != MAGIC or version != VERSION:
        raise ProvenanceError(f"{where}: not a version {VERSION} provenance sidecar")
    try:
        head = json.loads(raw[HEADER.size : HEADER.size + size])
        n = head["documents"]
        inputs = [(str(name), str(unit)) for name, unit in head["inputs"]]
        planes = np.frombuffer(zlib.decompress(raw[HEADER.size + size :]), np.uint8)
    except (ValueError, KeyError, TypeError, zlib.error) as exc:
        raise ProvenanceError(f"{where}: provenance sidecar is damaged ({exc})") from None
    if len(planes) != 16 * n:
        raise ProvenanceError(f"{where}: provenance sidecar holds {len(planes) // 16} entries, says {n}")
    body = np.ascontiguousarray(planes.reshape(8, -1).T).view("<i8").reshape(-1)
    input_of, place = np.cumsum(body[:n]), np.cumsum(body[n:])
    if n and (input_of.min() < 0 or input_of.max() >= len(inputs)):
        raise ProvenanceError(f"{where}: provenance sidecar names an input it does not list")
    return Origins(inputs, input_of, place)


def read(path: str | os.PathLike) -> Origins:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProvenanceError(f"{path}: provenance sidecar is missing") from None
    return decode(raw, path)


class OriginLog:
    """The open shard's entries, appended as documents are; `commit` makes them durable."""

    def __init__(self, path: Path, committed_documents: int) -> None:
        self.path = path
        self.inputs: list[tuple[str, str]] = []
        self._numbers: dict[tuple[str, str], int] = {}
        self.input_of = array("q")
        self.place = array("q")
        self._pending: list[str] = []
        keep = self._reload(committed_documents) if committed_documents else 0
        self._file = open(path, "r+b" if keep else "w+b")
        self._file.truncate(keep)
        self._file.seek(keep)

    def _reload(self, documents: int) -> int:
        """Read back the committed entries (returns the bytes to keep); entries a crash left
        past them are cut. A log that is missing or short (a run begun by a tokshard without
        provenance) is rewritten with unknown places, so its shard still has one entry per
        document."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        at = 0
        while len(self.place) < documents:
            end = raw.find(b"\n", at)
            if end < 0:
                break
            line = raw[at:end].decode()
            at = end + 1
            if line.startswith("+"):
                name, unit = json.loads(line[1:])
                self._numbers[(name, unit)] = len(self.inputs)
                self.inputs.append((name, unit))
            else:
                number, place = line.split(" ")
                self.input_of.append(int(number))
                self.place.append(int(place))
        if len(self.place) == documents:
            return at
        known = [self.origin(d) for d in range(len(self.place))]
        self.inputs, self._numbers, self.input_of, self.place = [], {}, array("q"), array("q")
        self.add(known + [UNKNOWN_ORIGIN] * (documents - len(known)))
        return 0

    def origin(self, doc: int) -> Origin:
        return Origin(*self.inputs[self.input_of[doc]], self.place[doc])

    def add(self, origins: list[Origin]) -> None:
        for name, unit, place in origins:
            key = (name, unit)
            number = self._numbers.get(key)
            if number is None:
                number = self._numbers[key] = len(self.inputs)
                self.inputs.append(key)
                self._pending.append("+" + json.dumps(list(key), ensure_ascii=False) + "\n")
            self.input_of.append(number)
            self.place.append(place)
            self._pending.append(f"{number} {place}\n")

    def origins(self) -> Origins:
        return Origins(
            list(self.inputs), np.frombuffer(self.input_of, np.int64), np.frombuffer(self.place, np.int64)
        )

    def commit(self) -> None:
        """Write the entries added since the last commit and fsync them."""
        if self._pending:
            self._file.write("".join(self._pending).encode())
            self._pending = []
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
