"""Documents in, token batches out, in bounded memory whatever the document sizes.

Ordinary documents are grouped into batches of about ``batch_chars`` characters for
``encode_batch``. A document longer than ``long_doc_chars`` (or a streamed .txt file) is
cut into pieces *only at pre-tokenizer boundaries*, where BPE merges never reach across,
so the pieces' ids joined are exactly the ids of the whole document. Its tokens are held
in memory up to ``SPOOL_BYTES`` and beyond that go to a spool file as they come, so even a
500 MB document's tokens never sit in memory whole. After each group of pieces a `LongProgress`
says how far into the document the encoding reaches: the task can commit there (the held
tokens then go to the spool first), and a resume skips that many characters and appends to
the spool (a cut at a pre-token boundary is exact, wherever the next pieces fall). Without a
usable pre-tokenizer a long document is encoded whole and redone whole after a crash.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.encoding import check_cache
from pipeline.encoding.backend import Encoder
from pipeline.encoding.byte_level import plain_added
from pipeline.encoding.routing import routed_count
from pipeline.format.errors import DataError
from pipeline.format.provenance import Input, OriginColumns
from pipeline.sources.base import Cursor, Record
from pipeline.sources.files import TextPieces, TextStream

BATCH_CHARS = 1 << 20
BATCH_DOCS = 8192
LONG_DOC_CHARS = 1 << 20
PIECE_CHARS = 1 << 18
#: a long document's tokens held in memory before they go to its spool file. Below it the
#: tokens are written once, to the shard; above it they are written to the spool, read back
#: and written again, with a commit (fsync) for each such document. A JSON-line document is in
#: memory whole anyway, as text of about the same size: 64 MiB of uint16 ids is 32M tokens, a
#: document of tens of MB of text.
SPOOL_BYTES = 64 << 20
#: a cut is only trusted this far from the end of the text the pre-tokenizer saw
MARGIN = 1 << 12
#: how much text before a cut is re-pre-tokenized to prove the cut harmless
CHECK_CHARS = 256

PreTokenize = Callable[[str], list[tuple[str, tuple[int, int]]]]


@dataclass
class Batch:
    """Whole documents ready for the shard writer (each framed by the run's BOS, if any, and
    its EOS in ``tokens``)."""

    tokens: np.ndarray
    lengths: np.ndarray
    cursor: Cursor | None
    progress: int
    dropped_empty: int = 0
    #: of its documents, how many the encoder routed to the reference (`routing.RoutedEncoder`)
    routed: int = 0
    #: where each document starts in its input
    origins: OriginColumns = field(default_factory=OriginColumns)


@dataclass
class Held:
    """One long document whose tokens (its BOS, if any, and EOS included) are still in memory,
    in the pieces they were encoded in: written to the shard one by one, never joined into one
    more copy."""

    parts: list[np.ndarray]
    tokens: int
    cursor: Cursor
    progress: int
    routed: int = 0
    origin: OriginColumns | None = None


@dataclass
class Spooled:
    """One very long document, its tokens (its BOS, if any, and EOS included) in a file."""

    path: Path
    tokens: int
    cursor: Cursor
    progress: int
    routed: int = 0
    origin: OriginColumns | None = None


@dataclass(frozen=True)
class LongProgress:
    """The spool holds the first ``tokens`` tokens of the long document being encoded, the
    ids of its first ``chars`` characters (a pre-token boundary): a commit point inside it."""

    chars: int
    tokens: int
    any_text: bool


@dataclass
class Bad:
    """A record that is not a usable document; the task decides to stop or skip."""

    where: str
    reason: str
    cursor: Cursor
    progress: int


@dataclass
class _Pending:
    texts: list[str] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    inputs: list[Input | None] = field(default_factory=list)  # the batch's origin columns
    places: list[int] = field(default_factory=list)
    chars: int = 0
    dropped: int = 0
    cursor: Cursor | None = None
    progress: int = 0

    def named(self, i: int) -> str:
        """Document ``i`` as an error names it: its record's ``where``, and its place where known
        (a good record's ``where`` is its file alone: finding its line costs a read)."""
        input_ = self.inputs[i]
        return self.wheres[i] if input_ is None else f"{self.wheres[i]} ({input_.unit} {self.places[i]})"


def safe_cut(text: str, target: int, pre_tokenize: PreTokenize, final: bool) -> int | None:
    """Largest cut near ``target`` where the text may end without changing any pre-token.

    Two things must hold at a cut ``c``: ``c`` is a pre-token boundary of the whole text
    (so boundaries near the end of a *truncated* window are not trusted), and the text
    before ``c`` pre-tokenizes the same when it stops at ``c``. The second fails where
    patterns look ahead: GPT-2's ``\\s+(?!\\S)`` keeps "\\n\\n" apart before a word but
    swallows both at the end of a string. So a cut must follow a non-space character, and
    the last pre-tokens before it are re-checked in isolation.
    """
    window_len = min(len(text), target + MARGIN)
    window = text[:window_len]
    truncated = window_len < len(text) or not final
    limit = window_len - MARGIN if truncated else window_len
    spans = [span for _, span in pre_tokenize(window) if span[1] <= limit]
    tried = 0
    for k in range(len(spans) - 1, 0, -1):
        cut = spans[k][0]
        if text[cut - 1].isspace():
            continue
        j = k
        while j > 0 and cut - spans[j][0] < CHECK_CHARS:
            j -= 1
        base = spans[j][0]
        alone = [(s + base, e + base) for _, (s, e) in pre_tokenize(text[base:cut])]
        if alone == spans[j:k]:
            return cut
        tried += 1
        if tried >= 16:
            break
    return None


_ASCII_MARKS = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


@dataclass(frozen=True)
class SpaceCuts:
    """Cut points by string search: for a tokenizer whose split pattern is one of
    `byte_level.SPACE_CUT_PATTERNS` (no pre-tokenizer needed, so `tokenizers` is never loaded for it)."""


def _certainly_not_space(ch: str) -> bool:
    """A character no regex engine's ``\\s`` matches (engines part on some, e.g. U+180E)."""
    return ch.isalnum() or ch in _ASCII_MARKS


def space_cut(text: str, start: int, target: int) -> int | None:
    """The last "word character, space" position in the second half of
    ``text[start + 1 : target + 1]``; None if there is none."""
    lo = max(start + 1, target - (target - start) // 2)
    c = text.rfind(" ", lo, target + 1)
    while c >= lo and not _certainly_not_space(text[c - 1]):
        c = text.rfind(" ", lo, c)
    return c if c >= lo else None


def pieces(chunks: Iterable[str], piece_chars: int, pre_tokenize: PreTokenize | SpaceCuts) -> Iterator[str]:
    """Re-cut a document (given as chunks) into pieces at pre-tokenizer boundaries. With
    `SpaceCuts` they are found by string search and depend only on the text, not on how it
    arrived in chunks."""
    if isinstance(pre_tokenize, SpaceCuts):
        yield from _space_pieces(chunks, piece_chars)
        return
    buf = ""
    retry_at = piece_chars + MARGIN
    for chunk in chunks:
        buf += chunk
        while len(buf) >= retry_at:
            cut = safe_cut(buf, max(piece_chars, retry_at - MARGIN), pre_tokenize, final=False)
            if cut is None:  # no boundary yet (one giant "word"): wait for twice the text
                retry_at = 2 * len(buf)
                break
            yield buf[:cut]
            buf = buf[cut:]
            retry_at = piece_chars + MARGIN
    while len(buf) > piece_chars + MARGIN:
        cut = safe_cut(buf, piece_chars, pre_tokenize, final=True)
        if cut is None:
            break
        yield buf[:cut]
        buf = buf[cut:]
    if buf:
        yield buf


def _space_pieces(chunks: Iterable[str], piece_chars: int) -> Iterator[str]:
    """`pieces` by `space_cut`; a stretch without a usable space grows the piece (to the next
    one) rather than cutting elsewhere. A chunk is never copied whole: the text left from
    the chunks before is joined only to the chunk's head, as far as the first cut inside it
    (`_across_seam`); the rest of the chunk is cut where it is."""
    buf, start, target = "", 0, piece_chars
    for chunk in chunks:
        carry, target = buf[start:], target - start
        buf, start = chunk, 0
        if carry:
            start, target, joined = yield from _across_seam(carry, chunk, target, piece_chars)
            if joined is not None:  # no cut inside the chunk: the whole of it is left over
                buf = joined
                continue
        start, target = yield from _cut_spaces(buf, start, target, piece_chars)
    if start < len(buf):
        yield buf[start:]


def _across_seam(
    carry: str, chunk: str, target: int, piece_chars: int
) -> Generator[str, None, tuple[int, int, str | None]]:
    """The pieces of ``carry + chunk`` up to the first cut inside ``chunk``, found on a join of
    the chunk's head only (longer heads while no cut is found), as on the whole join: the
    cuts depend on the text before ``target`` alone. Returns where the next piece starts and
    its target, in ``chunk``'s positions, or the whole join if no cut falls in ``chunk``."""
    start, width = 0, piece_chars
    while width < len(chunk):
        joined = carry + chunk[:width]
        start, target = yield from _cut_spaces(joined, start, target, piece_chars, stop=len(carry))
        if start >= len(carry):
            return start - len(carry), target - len(carry), None
        width *= 2
    joined = carry + chunk
    start, target = yield from _cut_spaces(joined, start, target, piece_chars)
    return start, target, joined


def _cut_spaces(
    buf: str, start: int, target: int, piece_chars: int, stop: int | None = None
) -> Generator[str, None, tuple[int, int]]:
    """Pieces of ``buf`` from ``start`` while the target lies inside it (and, with ``stop``,
    until a piece ends at or past it); returns the next piece's start and target."""
    while target < len(buf) and (stop is None or start < stop):
        cut = space_cut(buf, start, target)
        if cut is None:
            target += piece_chars // 2
            continue
        yield buf[start:cut]
        start, target = cut, cut + piece_chars
    return start, target


class DocumentEncoder:
    """Turns a partition's records into `Batch`, `Held`, `Spooled`, `Bad` and `LongProgress` items.

    The spool file is left in place when a long document ends: the caller deletes it once
    no checkpoint points into it any more.
    """

    def __init__(
        self,
        encoder: Encoder,
        eos_id: int,
        dtype: np.dtype,
        spool_path: Path,
        pre_tokenizer: Callable[[], PreTokenize | None],
        batch_chars: int = BATCH_CHARS,
        long_doc_chars: int = LONG_DOC_CHARS,
        piece_chars: int = PIECE_CHARS,
        spool_tokens: int | None = None,
        bos_id: int | None = None,
    ) -> None:
        self.encoder = encoder
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.dtype = dtype
        self.spool_path = spool_path
        self._load_pre_tokenizer = pre_tokenizer
        self.batch_chars = batch_chars
        self.long_doc_chars = long_doc_chars
        self.piece_chars = piece_chars
        self.spool_tokens = SPOOL_BYTES // np.dtype(dtype).itemsize if spool_tokens is None else spool_tokens
        self._spool = None  # the open spool file of the long document under way, if any
        self._held: list[np.ndarray] = []  # its tokens not in the spool (yet)
        self._held_tokens = 0
        self._commit_points = False

    @functools.cached_property
    def pre_tokenize(self) -> PreTokenize | None:
        """Loaded at the first long document: a fifth of a second per worker, which the
        many partitions without one never pay."""
        return self._load_pre_tokenizer()

    def sync_spool(self) -> None:
        """Make the spool durable up to the last `LongProgress` (before a commit records it):
        tokens still held in memory go to the spool first, since the commit points into it."""
        if self._held:
            self._spill()
        if self._spool is not None:
            self._spool.flush()
            os.fsync(self._spool.fileno())

    def _keep(self, arr: np.ndarray) -> None:
        """A long document's next tokens: into the spool once it is open, else held in memory
        up to ``spool_tokens``."""
        if self._spool is not None:
            self._spool.write(arr.data)
            return
        self._held.append(arr)
        self._held_tokens += len(arr)
        if self._held_tokens > self.spool_tokens:
            self._spill()

    def _spill(self) -> None:
        """Move the held tokens to a new spool file, which takes the document's tokens from now on."""
        if self._spool is None:
            self._open_spool(0)
        for arr in self._held:
            self._spool.write(arr.data)
        self._held, self._held_tokens = [], 0

    def run(
        self, records: Iterable[Record], resume: LongProgress | None = None, commit_points: bool = False
    ) -> Iterator[Batch | Held | Spooled | Bad | LongProgress]:
        """Encode records in order. With ``commit_points``, long documents also yield
        `LongProgress`; ``resume`` continues the long document the first record is."""
        self._commit_points = commit_points
        pending = _Pending()
        for rec in records:
            if resume is not None and (rec.bad is not None or _is_short(rec.text, self.long_doc_chars)):
                resume = None  # the checkpoint pointed into a long document: not this one
            if rec.bad is not None:
                if pending.texts or pending.dropped:
                    yield self._flush(pending)
                    pending = _Pending()
                yield Bad(rec.where, rec.bad, rec.cursor, rec.progress)
                continue
            text = rec.text
            if isinstance(text, str) and len(text) <= self.long_doc_chars:
                if text.isspace() or not text:
                    pending.dropped += 1
                else:
                    pending.texts.append(text)
                    pending.wheres.append(rec.where)
                    pending.inputs.append(rec.input)
                    pending.places.append(rec.place)
                    pending.chars += len(text)
                pending.cursor, pending.progress = rec.cursor, rec.progress
                if pending.chars >= self.batch_chars or len(pending.texts) >= BATCH_DOCS:
                    yield self._flush(pending)
                    pending = _Pending()
                continue
            if pending.texts or pending.dropped:
                yield self._flush(pending)
                pending = _Pending()
            yield from self._long(text, rec, resume)
            resume = None
        if pending.texts or pending.dropped:
            yield self._flush(pending)

    def _flush(self, p: _Pending) -> Batch:
        """Each document's ids, framed by its BOS (if the run has one) and EOS, in one array
        from the encoder's flat ids in one masked copy (no Python int per token, no loop per
        document)."""
        routed_before = routed_count(self.encoder)
        if p.texts:
            ids, offsets = self.encoder.encode_flat(p.texts)
            self._refuse_eos_from_text(
                ids, lambda at: p.named(int(np.searchsorted(offsets, at, "right")) - 1)
            )
        else:
            ids, offsets = np.zeros(0, np.uint32), np.zeros(1, np.int64)
        count = len(offsets) - 1
        frame = 1 if self.bos_id is None else 2  # the ids each document has besides its text's
        lengths = (np.diff(offsets) + frame).astype(np.int32)
        tokens = np.empty(len(ids) + frame * count, dtype=self.dtype)
        is_text = np.ones(len(tokens), bool)
        starts = offsets[:-1] + frame * np.arange(count)  # where each document's ids begin
        if self.bos_id is not None:
            tokens[starts] = self.bos_id
            is_text[starts] = False
        eos_at = starts + lengths - 1
        tokens[eos_at] = self.eos_id
        is_text[eos_at] = False
        tokens[is_text] = ids
        return Batch(
            tokens=tokens,
            lengths=lengths,
            cursor=p.cursor,
            progress=p.progress,
            dropped_empty=p.dropped,
            routed=routed_count(self.encoder) - routed_before,
            origins=OriginColumns(p.inputs, p.places),
        )

    def _refuse_eos_from_text(self, ids: np.ndarray, where: Callable[[int], str]) -> None:
        """The EOS id comes only from the pipeline's separators: a document whose text encoded
        to it (a tokenizer whose EOS text reaches it in a way `tokenizer.find_eos` could not
        rule out) stops the run before that id is written, naming the document."""
        hits = np.flatnonzero(ids == self.eos_id)
        if len(hits):
            raise DataError(
                f"{where(int(hits[0]))}: the document's text encodes to the EOS id {self.eos_id}, which "
                "only the pipeline's separators may write; name another with --eos-token, or leave this "
                "document out"
            )

    def _long(
        self, text: str | TextStream | TextPieces, rec: Record, resume: LongProgress | None
    ) -> Iterator[Batch | Held | Spooled | Bad | LongProgress]:
        """Encode one long document piece by piece, reporting commit points. Its tokens stay in
        memory up to ``spool_tokens`` and go to the spool file beyond that, or once a commit
        points into the document (`sync_spool`): a document of a few MB is written once, to
        its shard, not to the spool and then copied."""
        if isinstance(text, str) and isinstance(self.pre_tokenize, SpaceCuts):
            chunks: Iterable[str] = [text]  # space cuts slice it once per piece, no copy of it
        elif isinstance(text, str):
            step = 1 << 22
            chunks = (text[i : i + step] for i in range(0, len(text), step))
        else:
            chunks = iter(text)
        exact_cuts = self.pre_tokenize is not None
        if not exact_cuts or not self._spool_holds(resume):
            resume = None
        chars, total, any_text = (resume.chars, resume.tokens, resume.any_text) if resume else (0, 0, False)
        self._held, self._held_tokens = [], 0
        if resume is not None:  # its committed tokens are in the spool: the rest follows them
            self._open_spool(total)
        elif self.bos_id is not None:
            self._keep(np.array([self.bos_id], dtype=self.dtype))
            total = 1
        if exact_cuts:
            parts: Iterable[str] = pieces(_skip_chars(chunks, chars), self.piece_chars, self.pre_tokenize)
        else:  # no exact cut points: encode whole (memory grows with it)
            parts = ["".join(chunks)]
        routed_before = routed_count(self.encoder)
        try:
            for group in _grouped(parts, self.batch_chars):
                any_text = any_text or any(not s.isspace() for s in group)
                ids = self.encoder.encode_flat(group)[0]
                self._refuse_eos_from_text(ids, lambda _: rec.where)
                arr = ids.astype(self.dtype)
                total += len(arr)
                self._keep(arr)
                if exact_cuts and self._commit_points:
                    chars += sum(len(s) for s in group)
                    yield LongProgress(chars, total, any_text)
        except UnicodeDecodeError:
            any_text = None
        spool, held = self._spool, self._held
        self._spool, self._held, self._held_tokens = None, [], 0
        eos = np.array([self.eos_id], dtype=self.dtype)
        if spool is not None:
            if any_text:
                spool.write(eos.tobytes())
            # No fsync here: a durable checkpoint points into the spool only up to what the
            # commit that wrote it synced (`sync_spool`), and the caller copies the spool into
            # its shard and commits that (fsync) before deleting it; syncing the whole spool
            # too would write a long document to disk twice over.
            spool.close()
        routed = int(routed_count(self.encoder) > routed_before)  # the document, once
        origin = OriginColumns.one(rec.input, rec.place)
        if any_text is None:
            where = text.where if isinstance(text, TextStream) else rec.where  # the byte, where known
            yield Bad(where, "invalid UTF-8", rec.cursor, rec.progress)
        elif not any_text:
            empty = np.zeros(0, self.dtype)
            yield Batch(empty, np.zeros(0, np.int32), rec.cursor, rec.progress, dropped_empty=1)
        elif spool is None:
            yield Held([*held, eos], total + 1, rec.cursor, rec.progress, routed, origin)
        else:
            yield Spooled(self.spool_path, total + 1, rec.cursor, rec.progress, routed, origin)

    def _spool_holds(self, resume: LongProgress | None) -> bool:
        """A resume point is usable only if the spool still has its tokens."""
        if resume is None:
            return False
        try:
            return self.spool_path.stat().st_size >= resume.tokens * self.dtype.itemsize
        except FileNotFoundError:
            return False

    def _open_spool(self, tokens: int):
        """The spool, cut back to ``tokens`` committed tokens (0: a new, empty one)."""
        if tokens:
            f = open(self.spool_path, "r+b")
            f.truncate(tokens * self.dtype.itemsize)
            f.seek(0, os.SEEK_END)
        else:
            f = open(self.spool_path, "wb")
        self._spool = f
        return f


def _is_short(text: str | TextStream | TextPieces | None, long_doc_chars: int) -> bool:
    return isinstance(text, str) and len(text) <= long_doc_chars


def _skip_chars(chunks: Iterable[str], n: int) -> Iterator[str]:
    """The chunks without their first ``n`` characters."""
    for chunk in chunks:
        if n >= len(chunk):
            n -= len(chunk)
            continue
        yield chunk[n:] if n else chunk
        n = 0


def _grouped(parts: Iterable[str], max_chars: int) -> Iterator[list[str]]:
    group: list[str] = []
    chars = 0
    for part in parts:
        group.append(part)
        chars += len(part)
        if chars >= max_chars:
            yield group
            group, chars = [], 0
    if group:
        yield group


def byte_level_pre_tokenizer(
    tokenizer_path: str, space_cuts: bool | None = None
) -> PreTokenize | SpaceCuts | None:
    """How to cut this tokenizer's long documents exactly: `SpaceCuts` where its pattern
    allows, else its own pre-tokenizer if it is a byte-level BPE, else None (no exact cut
    points). ``space_cuts``: whether space cuts apply, where the caller knows (a run's
    `EncoderSpec` says, from the driver); else it is looked up (`check_cache.space_cuts`)."""
    from pipeline.encoding.tokenizer import is_byte_level_bpe, load, read_spec

    if space_cuts is None:
        space_cuts = check_cache.space_cuts(tokenizer_path)
    if space_cuts:
        return SpaceCuts()
    if plain_added(read_spec(tokenizer_path)):
        return None
    tok = load(tokenizer_path)
    if not is_byte_level_bpe(tok):
        return None
    return tok.pre_tokenizer.pre_tokenize_str
