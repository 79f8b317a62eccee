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

While a shard is open its entries go to append-only logs (`OriginLog`) that the shard's
commits fsync; reopening them keeps exactly the committed number of documents, so a kill and
a rerun give the same bytes.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

MAGIC = b"TKORIGIN"
VERSION = 1
HEADER = struct.Struct("<8sII")
SUFFIX = ".origin"
LOG_SUFFIX = ".orig.tmp"
INPUTS_SUFFIX = ".inputs.tmp"
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
    return HEADER.pack(MAGIC, VERSION, len(header)) + header + zlib.compress(body, 1)


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


class Located(Protocol):
    """A document's place as a source states it (``pipeline.sources.base.Location`` is one):
    the first of ``line``, ``row``, ``offset`` that is set is the unit recorded."""

    file: str
    line: int | None
    row: int | None
    offset: int | None


def _origin(place: Located | None) -> Origin:
    """A place as the sidecar records it: the first of line, row, offset that is set."""
    if place is None:
        return UNKNOWN_ORIGIN
    for unit in UNITS:
        at = getattr(place, unit)
        if at is not None:
            return Origin(place.file, unit, at)
    return Origin(place.file, "offset", 0)


def _one_unit(columns: list[tuple[str, list[int | None]]], n: int) -> tuple[str, list[int]] | None:
    """The unit every place of a batch is in, with its column (None if they differ)."""
    for unit, values in columns:
        missing = values.count(None)
        if missing == 0:
            return unit, values  # type: ignore[return-value]
        if missing != n:
            return None
    return None


class OriginLog:
    """The open shard's entries, appended as documents are; `commit` makes them durable.

    Two files beside the shard's ``.bin.tmp``: ``NAME.orig.tmp``, 16 bytes per document (its
    input's number and its place, int64), and ``NAME.inputs.tmp``, one JSON line per input in
    the order first used. Reopened with the committed number of documents, the first holds
    exactly those and the second the inputs they use (first use orders both alike, so a rerun
    numbers the inputs as an uninterrupted run does).
    """

    def __init__(self, bin_path: Path, committed_documents: int) -> None:
        self.entries_path = bin_path.with_suffix(LOG_SUFFIX)
        self.inputs_path = bin_path.with_suffix(INPUTS_SUFFIX)
        self.inputs: list[tuple[str, str]] = []
        self._numbers: dict[tuple[str, str], int] = {}
        self.input_of = array("q")
        self.place = array("q")
        self._entries_written = self._inputs_written = 0
        if committed_documents:
            self._reload(committed_documents)
        self._entries = open(self.entries_path, "r+b" if self._entries_written else "w+b")
        self._inputs = open(self.inputs_path, "r+b" if self._inputs_written else "w+b")
        for f, size in ((self._entries, 16 * self._entries_written), (self._inputs, self._inputs_bytes)):
            f.truncate(size)
            f.seek(size)

    _inputs_bytes = 0

    def _reload(self, documents: int) -> None:
        """Read back the committed entries; what a crash left past them is cut. A log that is
        missing or short (a run begun by a tokshard without provenance) is rewritten with unknown
        places, so its shard still has one entry per document."""
        try:
            pairs = np.frombuffer(self.entries_path.read_bytes()[: 16 * documents], "<i8").reshape(-1, 2)
            lines = self.inputs_path.read_bytes().split(b"\n")
        except (FileNotFoundError, ValueError):
            pairs, lines = np.zeros((0, 2), np.int64), []
        used = int(pairs[:, 0].max()) + 1 if len(pairs) else 0
        complete = len(pairs) == documents and len(lines) > used
        if complete:
            for line in lines[:used]:
                name, unit = json.loads(line)
                self._numbers[(name, unit)] = len(self.inputs)
                self.inputs.append((name, unit))
            self.input_of.frombytes(np.ascontiguousarray(pairs[:, 0]).tobytes())
            self.place.frombytes(np.ascontiguousarray(pairs[:, 1]).tobytes())
            self._entries_written, self._inputs_written = documents, used
            self._inputs_bytes = sum(len(line) + 1 for line in lines[:used])
            return
        known = [self.origin(d) for d in range(len(self.place))]  # nothing kept: all rewritten
        self.inputs, self._numbers, self.input_of, self.place = [], {}, array("q"), array("q")
        self.add_origins(known + [UNKNOWN_ORIGIN] * (documents - len(known)))

    def origin(self, doc: int) -> Origin:
        return Origin(*self.inputs[self.input_of[doc]], self.place[doc])

    def add(self, places: Sequence[Located | None]) -> None:
        """One entry per document, as its source located it (None: not located). A batch read
        from one input at a time, in one unit, is taken in whole columns, not document by
        document."""
        try:
            files = [p.file for p in places]
            columns = [("line", [p.line for p in places]), ("row", [p.row for p in places])]
            columns.append(("offset", [p.offset for p in places]))
        except AttributeError:  # a document without a place among them
            self.add_origins([_origin(p) for p in places])
            return
        found = _one_unit(columns, len(files))
        if found is None:  # units mixed within the batch
            self.add_origins([_origin(p) for p in places])
            return
        unit, values = found
        for name, group in itertools.groupby(files):
            count = sum(1 for _ in group)
            key = (name, unit)
            number = self._numbers.get(key)
            if number is None:
                number = self._numbers[key] = len(self.inputs)
                self.inputs.append(key)
            self.input_of.extend(array("q", [number]) * count)
        self.place.extend(values)

    def add_origins(self, origins: Sequence[Origin]) -> None:
        for name, unit, at in origins:
            key = (name, unit)
            number = self._numbers.get(key)
            if number is None:
                number = self._numbers[key] = len(self.inputs)
                self.inputs.append(key)
            self.input_of.append(number)
            self.place.append(at)

    def origins(self) -> Origins:
        return Origins(
            list(self.inputs), np.frombuffer(self.input_of, np.int64), np.frombuffer(self.place, np.int64)
        )

    def commit(self) -> None:
        """Write the entries and inputs added since the last commit and fsync them."""
        new = slice(self._entries_written, len(self.place))
        pairs = np.empty((new.stop - new.start, 2), "<i8")
        pairs[:, 0] = np.frombuffer(self.input_of, np.int64)[new]
        pairs[:, 1] = np.frombuffer(self.place, np.int64)[new]
        text = encode_basestring  # each line as json.dumps([name, unit], ensure_ascii=False) writes it
        lines = "".join(
            f"[{text(name)}, {text(unit)}]\n" for name, unit in self.inputs[self._inputs_written :]
        )
        self._inputs.write(lines.encode())
        self._entries.write(pairs.tobytes())
        self._entries_written, self._inputs_written = len(self.place), len(self.inputs)
        for f in (self._inputs, self._entries):
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        self._entries.close()
        self._inputs.close()
