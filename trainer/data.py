"""Fixed windows over each source's token stream, read straight from the memory-mapped shards.

For one source and split, the manifest lists shards whose concatenation (in manifest order)
is the source's token stream. ``TokenStream`` joins them *logically*: cumulative token counts
from the manifest say which shard holds a position, so opening a stream costs one ``stat``
per shard (the size check) and nothing per token or per document. Window ``i`` is
``stream[i * seq_len : i * seq_len + seq_len + 1]`` (inputs plus the next-token targets, as
nanoGPT reads them); a window may run across a shard boundary.

Every kind of sample (these windows, or the packed ones of ``trainer.packed``) answers the same
questions: how many per source (``windows``), the rows of a batch (``batch``, split by
``inputs_targets``), which documents fill a sample (``pieces``) and which shards it reads.

``check_manifest`` is the trainer's guard: the manifest's own checksum (a hand edit after
``prepare`` is refused), dtype, vocabulary against the model, and shard sizes (stat only), or with
``verify=True`` also the content hashes and ``.idx``/``.bin`` agreement. ``check_ids`` guards
each batch: an id the embedding has no row for is named, never an ``IndexError`` (or, on a GPU,
a device-side assert).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from pipeline.format import lfs_pointer
from pipeline.format.errors import DataError, TokshardError
from pipeline.format.file_kind import require_file
from pipeline.format.manifest import Manifest, ShardEntry, content_hash, dropped_text
from pipeline.format.shard_reader import (
    DTYPES,
    Shard,
    ShardFormatError,
    dtype_named_by,
    read_dtype_code,
    read_index,
    token_dtype,
)
from pipeline.format.verify import REMAKE, first_fault


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, end)`` of document ``document`` (0-based within its source and split) in a
    sample: with its source and split, what names the document's origin."""

    source: str
    split: str
    document: int
    start: int
    end: int

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "split": self.split,
            "id": self.document,
            "from": self.start,
            "to": self.end,
        }


class TokenStream:
    """The shards of one (source, split) read as one long array of tokens."""

    def __init__(
        self,
        source: str,
        split: str,
        shards: list[ShardEntry],
        dtype: str,
        ready: Callable[[Path], None] | None = None,
    ) -> None:
        if not shards:
            raise TokshardError(f"source {source!r} has no {split!r} shards")
        self.source = source
        self.split = split
        self.dtype = dtype
        self.paths = [s.bin_path for s in shards]
        self.counts = [s.tokens for s in shards]
        self.documents = [s.documents for s in shards]
        ends = np.cumsum(self.counts, dtype=np.int64)
        self.starts = [0, *ends[:-1].tolist()]
        self.tokens = int(ends[-1])
        #: what a resume compares: the shards' content hashes and token counts, not their paths
        self.content = content_hash([[s.hash, s.tokens] for s in shards])
        self._arrays: dict[int, np.ndarray] = {}
        self._ready = ready  # fetches a shard of a manifest URL into the cache before it is mapped
        self._document_ends: np.ndarray | None = None

    def _array(self, i: int) -> np.ndarray:
        """Shard ``i`` as a plain ndarray view of its memory map (opened on first use)."""
        arr = self._arrays.get(i)
        if arr is None:
            if self._ready is not None:
                self._ready(self.paths[i])
            arr = self._arrays[i] = opened_shard(self.paths[i], self.dtype, self.counts[i])
        return arr

    def read_into(self, out: np.ndarray, start: int) -> None:
        """Copy ``len(out)`` tokens from position ``start`` into ``out`` (any integer dtype)."""
        n = len(out)
        i = bisect.bisect_right(self.starts, start) - 1
        done = 0
        while done < n:
            arr = self._array(i)
            lo = start + done - self.starts[i]
            take = min(n - done, len(arr) - lo)
            out[done : done + take] = arr[lo : lo + take]
            done += take
            i += 1

    def read_pieces(self, out: np.ndarray, pieces: list[list[int]]) -> int:
        """Copy ``[start, length]`` pieces of the stream one after another into ``out``; each
        lies in one shard (a document or a piece of one: documents never span shards).
        Returns the tokens copied."""
        col = 0
        starts, arrays, find = self.starts, self._arrays, bisect.bisect_right
        for start, n in pieces:
            i = find(starts, start) - 1
            arr = arrays.get(i)
            if arr is None:
                arr = self._array(i)
            lo = start - starts[i]
            out[col : col + n] = arr[lo : lo + n]
            col += n
        return col

    def shard_at(self, position: int) -> Path:
        """The .bin holding the token at ``position`` of the stream."""
        return self.paths[bisect.bisect_right(self.starts, position) - 1]

    def document_ends(self) -> np.ndarray:
        """Where each document of the stream ends (EOS included), from the shards' ``.idx``:
        read on first use (one file per shard), then kept."""
        if self._document_ends is None:
            lengths = [self._document_lengths(i) for i in range(len(self.paths))]
            self._document_ends = np.cumsum(np.concatenate(lengths), dtype=np.int64)
        return self._document_ends

    def _document_lengths(self, i: int) -> np.ndarray:
        """Shard ``i``'s document lengths, checked against its counts in the manifest."""
        path = self.paths[i]
        if self._ready is not None:
            self._ready(path)
        idx = str(path)[: -len(".bin")] + ".idx"
        try:
            lengths = read_index(idx).lengths
        except OSError as exc:
            raise DataError(f"{idx}: {exc.strerror}; is the prepared folder complete?") from exc
        except ShardFormatError as exc:
            raise DataError(f"{exc}; re-run `tokshard prepare`") from exc
        if (
            len(lengths) != self.documents[i]
            or int(lengths.sum(dtype=np.int64)) != self.counts[i]
            or (lengths <= 0).any()
        ):
            raise DataError(
                f"{idx}: its {len(lengths)} document lengths do not add up to the {self.documents[i]} documents "
                f"and {self.counts[i]} tokens the manifest says the shard holds; the shards and manifest come "
                "from different runs, re-run `tokshard prepare`"
            )
        return lengths

    def pieces(self, lo: int, hi: int) -> list[Piece]:
        """The documents that tokens ``[lo, hi)`` of the stream cover, and which part of each."""
        ends = self.document_ends()
        first = int(np.searchsorted(ends, lo, side="right"))
        last = min(int(np.searchsorted(ends, hi - 1, side="right")), len(ends) - 1)
        out = []
        for d in range(first, last + 1):
            start = int(ends[d - 1]) if d else 0
            out.append(
                Piece(self.source, self.split, d, max(lo, start) - start, min(hi, int(ends[d])) - start)
            )
        return out

    def read(self, start: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        self.read_into(out, start)
        return out


Rows = TypeVar("Rows")  # a batch's rows: a numpy array, or the torch tensor made from it


class Samples(Protocol):
    """What the loop, the API and ``tokshard samples`` ask of a kind of sample."""

    split: str
    seq_len: int
    sources: list[str]
    streams: list[TokenStream]
    #: each source's manifest (its shards' provenance sidecars name where documents came from)
    owners: list[Manifest]
    #: samples per source (windows, or packed windows)
    windows: list[int]
    #: columns of a row of ``batch``
    width: int

    def batch(self, sources: np.ndarray, windows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``(source, window)`` as an int64 array ``[len(windows), width]``."""
        ...

    def inputs_targets(self, rows: Rows) -> tuple[Rows, Rows]:
        """A batch's inputs and next-token targets ``[rows, seq_len]`` (ignored targets: -100)."""
        ...

    def pieces(self, source: int, window: int) -> list[Piece]:
        """The documents that fill a sample, in its order."""
        ...

    def describe(self, source: int, window: int) -> dict[str, Any]:
        """What ``tokshard samples --json`` says of a sample besides its documents."""
        ...

    def tokens_of(self, source: int, window: int) -> np.ndarray:
        """A sample's tokens without padding (what ``--decode`` shows)."""
        ...

    def shard_at(self, source: int, window: int, column: int) -> Path:
        """The .bin a row's token at ``column`` came from."""
        ...

    def shards_of(self, source: int, window: int) -> list[Path]:
        """The .bin files a sample reads."""
        ...


def shorter_than_a_window(source: str, split: str, tokens: int, seq_len: int) -> str:
    """A source's split too short for one window of plain windows, as a refusal names it (a
    run's guards leave such a source out where nothing trains on it: `trainer.guards`)."""
    return f"source {source!r} split {split!r} has {tokens} tokens, fewer than one window of --seq-len {seq_len} + 1"


def open_streams(
    manifest: Manifest | Sequence[Manifest], split: str, sources: Iterable[str] | None
) -> tuple[list[str], list[TokenStream], list[Manifest]]:
    """The named sources' streams of ``split`` (default: every source with it), and each one's
    manifest; the sources may come from several manifests (names unique across them)."""
    manifests = [manifest] if isinstance(manifest, Manifest) else list(manifest)
    owner = source_owners(manifests)
    names = list(sources) if sources is not None else sources_with_split(manifests, split)
    streams = [
        TokenStream(n, split, owner[n].select(n, split), owner[n].dtype, owner[n].ready) for n in names
    ]
    return names, streams, [owner[n] for n in names]


class WindowDataset:
    """Windows of ``seq_len + 1`` tokens over several sources' streams of one split; the
    sources may come from several manifests (names unique across them)."""

    def __init__(
        self,
        manifest: Manifest | Sequence[Manifest],
        split: str,
        seq_len: int,
        sources: Iterable[str] | None = None,
    ):
        self.split = split
        self.seq_len = seq_len
        self.width = seq_len + 1
        self.sources, self.streams, self.owners = open_streams(manifest, split, sources)
        self.windows = [(s.tokens - 1) // seq_len for s in self.streams]
        for stream, count in zip(self.streams, self.windows, strict=True):
            if count < 1:
                raise TokshardError(
                    f"{shorter_than_a_window(stream.source, split, stream.tokens, seq_len)}; use a shorter --seq-len"
                )

    def read_into(self, out: np.ndarray, source: int, window: int) -> None:
        self.streams[source].read_into(out, window * self.seq_len)

    def batch(self, sources: np.ndarray, windows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``(source, window)`` as an int64 array ``[len(windows), seq_len + 1]``."""
        if out is None:
            out = np.empty((len(windows), self.seq_len + 1), dtype=np.int64)
        for row, (s, w) in enumerate(zip(sources.tolist(), windows.tolist(), strict=True)):
            self.streams[s].read_into(out[row], w * self.seq_len)
        return out

    def inputs_targets(self, rows: Rows) -> tuple[Rows, Rows]:
        """Inputs are a window's first ``seq_len`` tokens, targets its last ``seq_len``."""
        return rows[:, :-1], rows[:, 1:]

    def span(self, window: int) -> tuple[int, int]:
        """Window ``window``'s ``[start, end)`` in its source's token stream."""
        return window * self.seq_len, window * self.seq_len + self.seq_len + 1

    def pieces(self, source: int, window: int) -> list[Piece]:
        return self.streams[source].pieces(*self.span(window))

    def describe(self, source: int, window: int) -> dict[str, Any]:
        return {"tokens": list(self.span(window))}

    def tokens_of(self, source: int, window: int) -> np.ndarray:
        lo, hi = self.span(window)
        return self.streams[source].read(lo, hi - lo)

    def shard_at(self, source: int, window: int, column: int) -> Path:
        return self.streams[source].shard_at(window * self.seq_len + column)

    def shards_of(self, source: int, window: int) -> list[Path]:
        lo, hi = self.span(window)
        stream = self.streams[source]
        return list(dict.fromkeys([stream.shard_at(lo), stream.shard_at(hi - 1)]))


def sources_with_split(manifest: Manifest | Sequence[Manifest], split: str) -> list[str]:
    manifests = [manifest] if isinstance(manifest, Manifest) else manifest
    return [name for m in manifests for name in m.sources() if m.select(name, split)]


def why_not_held(manifests: Sequence[Manifest], source: str, split: str) -> str:
    """Why ``source`` has no shards of ``split`` in ``manifests``, as the source a message names:
    no such source, a split prepare dropped every document of (and how many, as the manifest
    records), or no such split."""
    owner = next((m for m in manifests if source in m.sources()), None)
    if owner is None:
        names = [n for m in manifests for n in m.sources()]
        return f"{source}, which is not a source of the manifest (its sources: {', '.join(names)})"
    counts = owner.split_counts(source, split)
    if counts is not None and not counts["documents"]:
        dropped = counts["dropped_empty"] + sum((counts.get("skipped") or {}).values())
        return (
            f"{source}, which has no documents in its {split!r} split: prepare dropped all {dropped:,} of them "
            f"({dropped_text(counts)}, as {owner.path} records)"
        )
    return f"{source}, which has no {split!r} split (its splits: {', '.join(owner.splits(source)) or 'none'})"


def not_held_fix(manifests: Sequence[Manifest], sources: list[str], split: str, flag: str) -> str:
    """What to do about ``flag`` naming ``sources`` that have no ``split`` shards: leave them out,
    or, for one whose documents prepare dropped, mend its input and prepare again."""
    emptied = any(
        (c := m.split_counts(s, split)) is not None and not c["documents"]
        for s in sources
        for m in manifests
        if s in m.sources()
    )
    one = len(sources) == 1
    mend = f", or fix {'its input' if one else 'the input of those prepare emptied'} and prepare again"
    return f"leave {'it' if one else 'them'} out of {flag}{mend if emptied else ''}"


def source_owners(manifests: Sequence[Manifest]) -> dict[str, Manifest]:
    """Source name -> the manifest holding it; one tokenizer and unique names across manifests,
    since a window is read by name and its ids mean nothing under another tokenizer."""
    owner: dict[str, Manifest] = {}
    first = manifests[0]
    seen: set[Path] = set()
    for m in manifests:
        where = Path(m.path).resolve()  # `a`, `./a` and `a/manifest.json` are one manifest
        if where in seen:
            raise TokshardError(f"{m.path} is given twice; give each prepared folder once")
        seen.add(where)
        tok, tok0 = m.data["tokenizer"], first.data["tokenizer"]
        if (tok.get("sha256"), tok["vocab_size"], tok["eos_id"]) != (
            tok0.get("sha256"),
            tok0["vocab_size"],
            tok0["eos_id"],
        ):
            raise TokshardError(
                f"{m.path}: its tokenizer differs from {first.path}'s; every --manifest of a run must be "
                "prepared with the same tokenizer"
            )
        for name in m.sources():
            if name in owner:
                raise TokshardError(
                    f"source {name!r} is in both {owner[name].path} and {m.path}; source names must be "
                    "unique across --manifest folders (rename one in its recipe)"
                )
            owner[name] = m
    return owner


@dataclass(frozen=True)
class ModelLimits:
    """What the model can take: embedding rows and positions."""

    name: str
    vocab_size: int
    max_seq_len: int


def check_manifest(manifest: Manifest, limits: ModelLimits, seq_len: int, verify: bool = False) -> None:
    """Refuse data the model cannot train on, before any process group or model exists."""
    where = manifest.path
    manifest.check_sealed()
    check_unique_shards(manifest)
    check_vocabulary(where, manifest.vocab_size, limits)
    if seq_len > limits.max_seq_len:
        raise TokshardError(
            f"--seq-len {seq_len} exceeds model {limits.name}'s {limits.max_seq_len} positions; "
            f"use --seq-len {limits.max_seq_len} or less"
        )
    if not manifest.shards:
        raise DataError(f"{where}: the manifest lists no shards")
    if manifest.ready is not None:  # a URL's shards: hash-checked by the data cache as they arrive
        if verify:
            verify_cached(manifest)
        return
    check_shards_whole(manifest)
    if verify:
        verify_shards(manifest)


#: how the CLI grows an embedding; ``{need}``: the rows it takes, padded to a multiple of 64
VOCAB_FIX = "pass --vocab-size {need} or choose a model with a larger vocabulary"


def check_vocabulary(where: str, vocab_size: int, limits: ModelLimits, fix: str = VOCAB_FIX) -> None:
    """Refuse a model whose embedding has fewer rows than the tokenizer has ids: the first id
    past it would be an IndexError deep inside ``torch.embedding`` (``fix`` says what to do)."""
    if vocab_size > limits.vocab_size:
        need = -(-vocab_size // 64) * 64
        raise TokshardError(
            f"{where}: the tokenizer has {vocab_size} ids but model {limits.name} embeds only "
            f"{limits.vocab_size}; {fix.format(need=need)}"
        )


def check_shards_whole(manifest: Manifest) -> None:
    """Every local shard is there at the size its manifest says (one ``stat`` each), and each
    stream's first index holds its dtype: a shard cut or gone is named, not a traceback (or a
    bus error) in the middle of reading it."""
    if manifest.ready is not None:  # a URL's: checked by the data cache as they arrive
        return
    itemsize = token_dtype(manifest.dtype).itemsize
    first_of_stream: set[tuple[str, str]] = set()
    for entry in manifest.shards:
        check_shard_size(entry, manifest.dtype, itemsize)
        if (entry.source, entry.split) not in first_of_stream:
            first_of_stream.add((entry.source, entry.split))
            check_index_dtype(entry, manifest.dtype)


def check_unique_shards(manifest: Manifest) -> None:
    """Each shard is listed once: twice would train on its tokens twice per epoch."""
    seen: set[str] = set()
    for entry in manifest.shards:
        key = os.path.normpath(entry.rel_path)
        if key in seen:
            raise DataError(
                f"{manifest.path}: shard {entry.rel_path} is listed twice; the manifest is damaged, "
                "re-run `tokshard prepare`"
            )
        seen.add(key)


def check_ids(tokens: np.ndarray, vocab_size: int, dataset: Samples, sources, windows) -> None:
    """Every id in a gathered batch has an embedding row; else name the shard it came from."""
    if not tokens.size or int(tokens.max()) < vocab_size:
        return
    row = int(np.argmax(tokens.max(axis=1) >= vocab_size))
    col = int(np.argmax(tokens[row] >= vocab_size))
    shard = dataset.shard_at(int(sources[row]), int(windows[row]), col)
    raise DataError(
        f"{shard}: token id {int(tokens[row, col])} is beyond the model's {vocab_size} embedding rows; the "
        "shard does not come from this manifest's tokenizer or was changed after prepare "
        "(`tokshard verify` tells), re-run `tokshard prepare`"
    )


def check_shard_size(entry: ShardEntry, dtype: str, itemsize: int) -> None:
    if entry.bytes != entry.tokens * itemsize:
        raise DataError(
            f"{entry.bin_path}: manifest says {entry.tokens} tokens in {entry.bytes} bytes, which is not "
            f"{dtype}; the manifest is damaged, re-run `tokshard prepare`"
        )
    try:
        size = require_file(entry.bin_path).st_size
    except OSError as exc:
        raise DataError(f"{entry.bin_path}: {exc.strerror}; is the prepared folder complete?") from exc
    if size == entry.bytes:
        return
    if size < lfs_pointer.MAX_BYTES and lfs_pointer.is_pointer_file(entry.bin_path):
        raise DataError(f"{entry.bin_path} is a Git LFS pointer, not the shard; {lfs_pointer.FETCH}")
    for other, (np_dtype, _) in DTYPES.items():
        if other != dtype and size == entry.tokens * np_dtype.itemsize:
            raise DataError(
                f"{entry.bin_path}: holds {other} tokens but the manifest says {dtype}; "
                "the shards and manifest come from different runs, re-run `tokshard prepare`"
            )
    raise DataError(
        f"{entry.bin_path}: {size} bytes on disk, the manifest says {entry.bytes}; the shard was changed "
        "or truncated after prepare, re-run `tokshard prepare` (or `tokshard verify` to see all faults)"
    )


def check_index_dtype(entry: ShardEntry, dtype: str) -> None:
    """Read only the .idx header: its dtype code must be the manifest's dtype."""
    try:
        code = read_dtype_code(entry.idx_path)
    except OSError as exc:
        raise DataError(f"{entry.idx_path}: {exc.strerror}; is the prepared folder complete?") from exc
    except ShardFormatError as exc:
        if lfs_pointer.is_pointer_file(entry.idx_path):
            raise DataError(
                f"{entry.idx_path} is a Git LFS pointer, not the index; {lfs_pointer.FETCH}"
            ) from exc
        raise DataError(f"{entry.idx_path}: truncated index; re-run `tokshard prepare`") from exc
    if code != DTYPES[dtype][1]:
        found = dtype_named_by(code) or f"code {code}"
        raise DataError(
            f"{entry.idx_path}: index says {found} tokens but the manifest says {dtype}; "
            "the shards and manifest come from different runs, re-run `tokshard prepare`"
        )


def verify_cached(manifest: Manifest) -> None:
    """``--verify`` of a manifest URL: every shard fetched into the data cache (a copy whose
    stat changed since its check is hashed and fetched again there), then all hashed as a
    local folder's are: a copy that rotted on this disk, its stat kept, is named."""
    for entry in manifest.shards:
        manifest.ready(entry.bin_path)
        if entry.origin_hash is not None:
            manifest.ready(entry.origin_path)
    fault = first_fault(manifest)
    if fault:
        raise DataError(
            f"{fault}, in the data cache's copy ({manifest.folder}); delete that copy and run again to "
            "fetch it anew"
        )


def verify_shards(manifest: Manifest) -> None:
    """``--verify``: re-hash every shard and check each .idx against its .bin (the checks of
    `tokshard verify`, stopping at the first fault)."""
    fault = first_fault(manifest)
    if fault:
        raise DataError(f"{fault}; {REMAKE}")


def opened_shard(path: Path, dtype: str, tokens: int) -> np.ndarray:
    """Shard ``path`` memory-mapped as a plain ndarray. Shards open on first use, long after the
    start's checks: one deleted or cut since then is one line, not a traceback (or a short read)."""
    try:
        arr = np.asarray(Shard(path, dtype).tokens)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: {changed_since_start('is gone')}") from exc
    if len(arr) != tokens:
        raise DataError(
            f"{path}: {changed_since_start(f'changed size ({len(arr)} tokens, the manifest says {tokens})')}"
        )
    return arr


def changed_since_start(what: str) -> str:
    """A shard that changed while training, and what to do about it."""
    return (
        f"the shard {what} since the run started (deleted, moved or rewritten); restore it, or run "
        "`tokshard prepare` again, then run again (with --resume where --save holds a checkpoint; "
        "--allow-data-change if the data now differs)"
    )
