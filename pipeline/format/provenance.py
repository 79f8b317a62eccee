"""Provenance sidecars: where each document of a shard came from (numpy and stdlib only).

Beside ``NAME.bin``/``NAME.idx`` a shard has ``NAME.origin``, one entry per document of the
``.idx``, in the same order: the input (a local path, a URL, or a hub file's URL at its
revision), the unit its place is counted in (``line``, 1-based; ``row``, 0-based; ``offset``,
bytes) and the place. Layout::

    magic    b"TKORIGIN"
    header   <II   version, length of the table that follows
    table    zlib of the JSON {"documents": n, "inputs": [[input, unit], ...]} (sorted keys,
             compact; version 1, still read, kept it uncompressed)
    body     zlib of int64[2n]: the n input numbers, then the n places, each delta-encoded,
             stored byte plane by byte plane (all lowest bytes first, ..., highest last)

The inputs' names share most of their text (one folder, one bucket), so the table compresses
well: with thousands of small input files, a name per document or two, it is most of the file.
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
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipeline.format.file_kind import require_file

MAGIC = b"TKORIGIN"
VERSION = 2
#: versions `decode` reads (1: the inputs table uncompressed)
READABLE = (1, 2)
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
    table = json.dumps(
        {"documents": len(origins), "inputs": [list(k) for k in origins.inputs]},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    header = zlib.compress(table, 6)
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
    if magic != MAGIC or version not in READABLE:
        raise ProvenanceError(
            f"{where}: not a provenance sidecar of version {' or '.join(map(str, READABLE))}"
        )
    try:
        table = raw[HEADER.size : HEADER.size + size]
        head = json.loads(zlib.decompress(table) if version >= 2 else table)
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
        require_file(path)
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProvenanceError(f"{path}: provenance sidecar is missing") from None
    return decode(raw, path)


class Input(NamedTuple):
    """An input file or object (a local path, a URL, or a hub file's URL at its revision) and
    the unit its places are counted in (one of `UNITS`). A reader makes one per file it reads
    and gives every document of it that same object, so a batch's inputs are a few runs."""

    name: str
    unit: str


UNKNOWN_INPUT = Input(*UNKNOWN)


@dataclass
class OriginColumns:
    """Where a run of documents starts, as two columns: per document, its `Input` (None: its
    source named no place) and its place in that input's unit. This is how documents travel
    from the readers to the shard's log: a list append per document, no object per place."""

    inputs: list[Input | None] = field(default_factory=list)
    places: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.places)

    def __getitem__(self, docs: slice) -> OriginColumns:
        return OriginColumns(self.inputs[docs], self.places[docs])

    @classmethod
    def one(cls, input: Input | None, place: int) -> OriginColumns:
        return cls([input], [place])

    @classmethod
    def unknown(cls, documents: int) -> OriginColumns:
        return cls([None] * documents, [0] * documents)


def log_holds(bin_path: Path, documents: int) -> bool:
    """Whether an open shard's logs hold an entry, and its input, for each of its ``documents``
    committed documents: False for a shard begun by a tokshard that wrote no provenance, whose
    documents cannot be resumed with their places."""
    found = _committed_log(bin_path.with_suffix(LOG_SUFFIX), bin_path.with_suffix(INPUTS_SUFFIX), documents)
    return found is not None


def _committed_log(entries: Path, inputs: Path, documents: int) -> tuple[np.ndarray, list[bytes]] | None:
    """The first ``documents`` entries of an open shard's log, as (input number, place) pairs,
    and the lines of the inputs they use (None: the logs are missing or hold fewer)."""
    if not documents:
        return np.zeros((0, 2), np.int64), []
    try:
        pairs = np.frombuffer(entries.read_bytes()[: 16 * documents], "<i8").reshape(-1, 2)
        lines = inputs.read_bytes().split(b"\n")
    except (FileNotFoundError, ValueError):
        return None
    used = int(pairs[:, 0].max()) + 1 if len(pairs) else 0
    if len(pairs) != documents or len(lines) <= used:
        return None
    return pairs, lines[:used]


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
        self.inputs: list[Input] = []
        self._numbers: dict[Input, int] = {}
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
        missing or short (a shard begun by a tokshard that wrote no provenance, or a log deleted
        since) is refused: its documents' places are lost, and unknown ones would be a lie."""
        found = _committed_log(self.entries_path, self.inputs_path, documents)
        if found is None:
            raise ProvenanceError(
                f"{self.entries_path}: the provenance log of the open shard holds fewer than its "
                f"{documents} committed documents (begun by a tokshard that recorded no provenance?)"
            )
        pairs, lines = found
        for line in lines:
            self._number(Input(*json.loads(line)))
        self.input_of.frombytes(np.ascontiguousarray(pairs[:, 0]).tobytes())
        self.place.frombytes(np.ascontiguousarray(pairs[:, 1]).tobytes())
        self._entries_written, self._inputs_written = documents, len(lines)
        self._inputs_bytes = sum(len(line) + 1 for line in lines)

    def add(self, columns: OriginColumns) -> None:
        """One entry per document of ``columns``, taken run by run of one input (a reader's
        documents share its `Input`), the places in one extend."""
        for key, run in itertools.groupby(columns.inputs):
            self.input_of.extend(array("q", [self._number(key or UNKNOWN_INPUT)]) * len(list(run)))
        self.place.extend(columns.places)

    def _number(self, key: Input) -> int:
        """The input's number in this shard (the next one at its first use)."""
        number = self._numbers.get(key)
        if number is None:
            number = self._numbers[key] = len(self.inputs)
            self.inputs.append(key)
        return number

    def origins(self) -> Origins:
        return Origins(
            list(self.inputs), np.frombuffer(self.input_of, np.int64), np.frombuffer(self.place, np.int64)
        )

    def commit(self) -> None:
        """Write the entries and inputs added since the last commit and fsync them (the inputs'
        file only when it grew: mostly one input fills a shard, and its file is written once)."""
        new = slice(self._entries_written, len(self.place))
        pairs = np.empty((new.stop - new.start, 2), "<i8")
        pairs[:, 0] = np.frombuffer(self.input_of, np.int64)[new]
        pairs[:, 1] = np.frombuffer(self.place, np.int64)[new]
        changed = [self._entries]
        if self._inputs_written < len(self.inputs):
            text = encode_basestring  # each line as json.dumps([name, unit], ensure_ascii=False) writes it
            lines = "".join(
                f"[{text(name)}, {text(unit)}]\n" for name, unit in self.inputs[self._inputs_written :]
            )
            self._inputs.write(lines.encode())
            changed.append(self._inputs)
        self._entries.write(pairs.tobytes())
        self._entries_written, self._inputs_written = len(self.place), len(self.inputs)
        for f in changed:
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        self._entries.close()
        self._inputs.close()
