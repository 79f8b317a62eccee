"""The one writer of tokshard shards (format defined in ``pipeline.format.shard_reader``).

A partition's output is a sequence of shards ``STEM-0000``, ``STEM-0001``, ... Tokens are
appended to ``NAME.bin.tmp`` and per-document lengths to ``NAME.lens.tmp``; a *commit*
fsyncs both so that the first ``tokens``/``documents`` of them survive a crash. Reopening
with the committed counts truncates whatever was written after the last commit and
carries on, so an interrupted partition resumes without rereading what it already wrote.

Each document's origin (``pipeline.format.provenance``) goes to ``NAME.orig.tmp`` with the
same commits, and a sealed shard has its ``NAME.origin`` sidecar beside the ``.idx``.

A full shard is first *sealed* (its ``.idx.tmp`` and ``.origin.tmp`` written and everything fsynced, still
under temporary names) and only *finalized* (renamed to ``NAME.idx`` then ``NAME.bin``)
after the partition's checkpoint lists it. So the checkpoint always describes the files
on disk: a crash between sealing and the checkpoint leaves the shard open at its last
commit, and a crash after the checkpoint leaves renames that `finalize` completes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from pipeline.format.atomic import TMP_SUFFIX, disk_error, fsync_dir, write_durable
from pipeline.format.content_hash import READ_CHUNK, bytes_hash, file_hash, new_hasher, recorded
from pipeline.format.errors import TokshardError
from pipeline.format.provenance import (
    INPUTS_SUFFIX,
    LOG_SUFFIX,
    OriginColumns,
    OriginLog,
    ProvenanceError,
    log_holds,
)
from pipeline.format.provenance import SUFFIX as ORIGIN_SUFFIX
from pipeline.format.provenance import encode as encode_origins
from pipeline.format.shard_reader import index_bytes, index_size, token_dtype

T = TypeVar("T")


def _lost_commit(path: Path, size: int) -> TokshardError:
    return TokshardError(
        f"{path} is missing or shorter than its last commit ({size} bytes; was it deleted?); delete "
        "the partition's checkpoint under OUT/.tokshard/parts to redo that partition"
    )


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest says about one finished shard (paths relative to the output folder)."""

    path: str
    tokens: int
    documents: int
    bytes: int
    hash: str
    idx_hash: str
    #: the provenance sidecar's content hash and size (None: written without provenance)
    origin_hash: str | None = None
    origin_bytes: int | None = None

    @property
    def idx_bytes(self) -> int:
        """The size of its .idx, which its documents fix."""
        return index_size(self.documents)

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class OpenShard:
    """The durable part of a shard still being written."""

    seq: int
    tokens: int = 0
    documents: int = 0


class ShardWriter:
    """Appends documents to one shard; ``commit`` makes them durable, ``close`` final."""

    def __init__(self, out_dir: Path, rel_path: str, dtype: str, committed: OpenShard) -> None:
        self.out_dir = out_dir
        self.rel_path = rel_path
        self.dtype_name = dtype
        self.dtype = token_dtype(dtype)
        self.bin_path = out_dir / rel_path
        self.seq = committed.seq
        self.tokens = committed.tokens
        self.documents = committed.documents
        self._lengths: list[np.ndarray] = []
        self._hash = new_hasher()
        self.bin_path.parent.mkdir(parents=True, exist_ok=True)
        self._bin = self._open_at(self._tmp(".bin"), committed.tokens * self.dtype.itemsize)
        self._lens = self._open_at(self._tmp(".lens"), committed.documents * 4)
        self._lens_written = committed.documents
        try:
            self._origins = OriginLog(self.bin_path, committed.documents)
        except ProvenanceError as exc:
            self._bin.close()
            self._lens.close()
            raise TokshardError(
                f"{exc}; delete the partition's checkpoint under OUT/.tokshard/parts to redo that partition"
            ) from None
        if committed.tokens:
            self._rehash_prefix(committed.tokens * self.dtype.itemsize)
        if committed.documents:
            self._lens.seek(0)
            self._lengths.append(np.frombuffer(self._lens.read(), dtype="<i4").copy())
            self._lens.seek(committed.documents * 4)

    def _tmp(self, suffix: str) -> Path:
        return self.bin_path.with_suffix(suffix + TMP_SUFFIX)

    def _open_at(self, path: Path, size: int):
        """Open for append, cut back to the committed size (a crash may have left more)."""
        try:
            if size == 0:
                return open(path, "w+b")
            f = open(path, "r+b")
        except FileNotFoundError:
            raise _lost_commit(path, size) from None
        except OSError as exc:
            raise disk_error(exc, path) from exc
        if os.fstat(f.fileno()).st_size < size:
            f.close()
            raise _lost_commit(path, size)
        try:
            f.truncate(size)
            f.seek(size)
        except OSError as exc:
            f.close()
            raise disk_error(exc, path) from exc
        return f

    def _rehash_prefix(self, nbytes: int) -> None:
        self._bin.seek(0)
        remaining = nbytes
        while remaining:
            chunk = self._bin.read(min(READ_CHUNK, remaining))
            self._hash.update(chunk)
            remaining -= len(chunk)
        self._bin.seek(nbytes)

    def append(self, tokens: np.ndarray, lengths: np.ndarray, origins: OriginColumns | None = None) -> None:
        """Append whole documents: ``tokens`` already holds each one's trailing EOS;
        ``origins``, where each one starts in its input (None: not known)."""
        self._write(np.ascontiguousarray(tokens, dtype=self.dtype).data)  # no copy of the tokens
        self._lengths.append(np.asarray(lengths, dtype="<i4"))
        self._origins.add(origins if origins is not None else OriginColumns.unknown(len(lengths)))
        self.tokens += len(tokens)
        self.documents += len(lengths)

    def append_parts(self, parts: list[np.ndarray], origin: OriginColumns | None = None) -> None:
        """Append one document given in pieces (its trailing EOS in the last)."""
        for part in parts:
            self._write(np.ascontiguousarray(part, dtype=self.dtype).data)
        self._one_document(sum(len(part) for part in parts), origin)

    def append_file(self, path: Path, n_tokens: int, origin: OriginColumns | None = None) -> None:
        """Append one document spooled to disk (too large to hold in memory)."""
        with open(path, "rb") as src:
            while chunk := src.read(READ_CHUNK):
                self._write(chunk)
        self._one_document(n_tokens, origin)

    def _write(self, data: bytes | memoryview) -> None:
        try:
            self._bin.write(data)
        except OSError as exc:
            raise disk_error(exc, self.bin_path, memoryview(data).nbytes) from exc
        self._hash.update(data)

    def _one_document(self, n_tokens: int, origin: OriginColumns | None) -> None:
        self._lengths.append(np.array([n_tokens], dtype="<i4"))
        self._origins.add(origin if origin is not None else OriginColumns.unknown(1))
        self.tokens += n_tokens
        self.documents += 1

    def commit(self) -> OpenShard:
        """Make everything appended so far durable and return its description."""
        try:
            new = self.lengths()[self._lens_written :]
            self._lens.write(new.tobytes())
            self._lens_written += len(new)
            for f in (self._bin, self._lens):
                f.flush()
                os.fsync(f.fileno())
            self._origins.commit()
        except OSError as exc:
            raise disk_error(exc, self.bin_path) from exc
        return OpenShard(self.seq, self.tokens, self.documents)

    def lengths(self) -> np.ndarray:
        if len(self._lengths) != 1:
            self._lengths = [np.concatenate(self._lengths) if self._lengths else np.zeros(0, "<i4")]
        return self._lengths[0]

    def seal(self) -> ShardRecord:
        """Complete the shard under its temporary names (.bin.tmp, .idx.tmp), all durable."""
        self.commit()
        self._close_files()
        idx = index_bytes(self.lengths(), self.dtype_name)
        write_durable(self._tmp(".idx"), idx)
        origins = encode_origins(self._origins.origins())
        write_durable(self._tmp(ORIGIN_SUFFIX), origins)
        return ShardRecord(
            path=self.rel_path,
            tokens=self.tokens,
            documents=self.documents,
            bytes=self.tokens * self.dtype.itemsize,
            hash=recorded(self._hash),
            idx_hash=bytes_hash(idx),
            origin_hash=bytes_hash(origins),
            origin_bytes=len(origins),
        )

    def close(self) -> ShardRecord:
        """Seal and finalize at once (for a shard written outside a checkpointed partition)."""
        record = self.seal()
        finalize(self.out_dir, [record])
        return record

    def abandon(self) -> None:
        """Close file handles without finishing (the committed prefix stays for a resume).

        Never raises: it runs while another error (a full disk, a kill) is on its way out.
        """
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._bin, self._lens, self._origins):
            with contextlib.suppress(OSError):
                f.close()


def _tmp_of(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def finalize(out_dir: Path, records: Iterable[ShardRecord]) -> None:
    """Give sealed shards their final names; idempotent, so a resume can finish a crashed one.

    The sidecar and the .idx are renamed before the .bin: a reader that finds a .bin finds
    its index and its origins. The open shard's logs (lengths, origins, inputs: sealed into
    those two) are deleted before it too, so a .bin in place means its shard is wholly
    finished: a rerun that finds every .bin of a finished partition looks no further.
    """
    folders: set[Path] = set()
    for rec in records:
        bin_path = out_dir / rec.path
        *companions, _ = _final_files(rec, out_dir)
        for final in companions:
            _publish(final, out_dir, folders)
        bin_path.with_suffix(".lens" + TMP_SUFFIX).unlink(missing_ok=True)
        for log in (LOG_SUFFIX, INPUTS_SUFFIX):
            bin_path.with_suffix(log).unlink(missing_ok=True)
        _publish(bin_path, out_dir, folders)
    for folder in folders:
        fsync_dir(folder)


def _publish(final: Path, out_dir: Path, renamed_in: set[Path]) -> None:
    """Rename a sealed file to its final name (nothing to do if a crashed finalize did)."""
    try:
        os.replace(_tmp_of(final), final)
        renamed_in.add(final.parent)
    except FileNotFoundError:
        if not final.exists():
            raise TokshardError(
                f"{final}: a finished shard is missing (deleted or moved?); delete its "
                f"partition's checkpoint under {out_dir / '.tokshard' / 'parts'} to redo it"
            ) from None


def shard_files(rec: ShardRecord) -> list[str]:
    """A finished shard's files (relative paths), in the order they are published: the
    provenance sidecar (where it has one) and the .idx before the .bin."""
    stem = rec.path[: -len(".bin")]
    sidecar = [stem + ORIGIN_SUFFIX] if rec.origin_hash is not None else []
    return [*sidecar, stem + ".idx", rec.path]


def _final_files(rec: ShardRecord, out_dir: Path) -> list[Path]:
    return [out_dir / rel for rel in shard_files(rec)]


def shard_problem(out_dir: Path, rec: ShardRecord, hashes: bool = True) -> str | None:
    """What is wrong with a finished shard on disk against the record its checkpoint holds
    (None if nothing): both files there (under their final or, renames pending, temporary
    names), the .bin of the recorded size, and with ``hashes`` both files' content hashes.
    Reads only; a rerun redoes a partition whose shard has a problem."""
    found: dict[str, tuple[Path, os.stat_result]] = {}
    for final in _final_files(rec, out_dir):
        st = _settled(final, os.stat)
        if st is None:
            return f"{final.relative_to(out_dir)} is missing"
        found[final.suffix] = (final, st)
    size = found[".bin"][1].st_size
    if size != rec.bytes:
        return f"{rec.path} is {size} bytes, its checkpoint says {rec.bytes}"
    if found[".idx"][1].st_size != rec.idx_bytes:
        return f"{rec.path}: its .idx is {found['.idx'][1].st_size} bytes, its {rec.documents} documents make {rec.idx_bytes}"
    if ORIGIN_SUFFIX in found and found[ORIGIN_SUFFIX][1].st_size != rec.origin_bytes:
        return f"{rec.path}: its provenance sidecar is not the size its checkpoint says"
    if hashes:
        wanted = {".bin": rec.hash, ".idx": rec.idx_hash, ORIGIN_SUFFIX: rec.origin_hash}
        for suffix, (final, _) in found.items():
            if _settled(final, file_hash) != wanted[suffix]:
                return f"{final.relative_to(out_dir)} differs from its checkpoint (content hash)"
    return None


def _settled(final: Path, read: Callable[[Path], T]) -> T | None:
    """``read`` of a finished shard's file under its final name or, renames pending, its
    temporary one (None: neither is there). The final name is looked at again last: a live
    run's rename between the first two looks (`status` reads a folder while it is written)
    moves the file from the second to the third."""
    for path in (final, _tmp_of(final), final):
        with contextlib.suppress(FileNotFoundError):
            return read(path)
    return None


def kept_problem(out_dir: Path, closed: list[ShardRecord], hashes: bool = True) -> str | None:
    """The first shard of a checkpoint's ``closed`` list that does not match its record, as
    text (None if all do): a manifest must never list a shard that is not what was written."""
    for rec in closed:
        if (problem := shard_problem(out_dir, rec, hashes)) is not None:
            return problem
    return None


def shard_rel(stem: str, seq: int) -> str:
    """The path of a partition's ``seq``-th shard (``stem``: the partition's)."""
    return f"{stem}-{seq:04d}.bin"


def untraced_work(
    out_dir: Path, stem: str, closed: list[ShardRecord], open_shard: OpenShard | None
) -> str | None:
    """What of a partition's committed work carries no provenance (None: all of it does), as
    text: an older tokshard, which recorded no places, began it, or its open shard's logs were
    deleted. Resumed, its documents would
    be listed with no place although their source names one, so the partition is redone."""
    untraced = sum(rec.origin_hash is None for rec in closed)
    documents = 0
    if open_shard is not None and not log_holds(
        out_dir / shard_rel(stem, open_shard.seq), open_shard.documents
    ):
        documents = open_shard.documents
    if not untraced and not documents:
        return None
    said = []
    if untraced:  # this tokshard hashes every finished shard's sidecar: none, an older one wrote it
        shards = f"{untraced} finished shard{'s' * (untraced != 1)}"
        said.append(f"{shards} written by an older tokshard that recorded no provenance")
    if documents:  # the logs of the open shard are missing or short: never written, or deleted since
        some = f"{documents} committed document{'s' * (documents != 1)}"
        said.append(
            f"its open shard's provenance logs lack its {some} (an older tokshard wrote none, or they were deleted)"
        )
    return "its committed work has no provenance: " + "; ".join(said)


class ShardSequence:
    """A partition's shards, rotated at ``shard_tokens``; a document never spans two shards.

    Full shards are sealed as they fill up; the owner saves its checkpoint (which lists
    them in ``closed``) and then calls `finalize`. Opening a sequence from a checkpoint
    finishes the renames a crash interrupted and deletes every file the checkpoint does
    not account for (later shards, or data past the open shard's last commit).
    """

    def __init__(
        self,
        out_dir: Path,
        stem: str,
        dtype: str,
        shard_tokens: int,
        closed: list[ShardRecord] | None = None,
        open_shard: OpenShard | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.stem = stem
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.closed: list[ShardRecord] = list(closed or [])
        self._sealed: list[ShardRecord] = []
        finalize(out_dir, self.closed)
        committed = open_shard or OpenShard(seq=len(self.closed))
        self._remove_beyond(committed.seq)
        self.current = ShardWriter(out_dir, self.shard_path(committed.seq), dtype, committed)

    def shard_path(self, seq: int) -> str:
        return shard_rel(self.stem, seq)

    def _remove_beyond(self, seq: int) -> None:
        """Delete files the checkpoint does not know: later shards, and all of the open one
        but its committed .bin.tmp/.lens.tmp (a crash mid-rotation leaves such files)."""
        folder = (self.out_dir / self.stem).parent
        prefix = Path(self.stem).name + "-"
        if not folder.is_dir():
            return
        stem = Path(self.shard_path(seq)).stem
        keep = {
            Path(self.shard_path(seq)).name + TMP_SUFFIX,
            stem + ".lens.tmp",
            stem + LOG_SUFFIX,
            stem + INPUTS_SUFFIX,
        }
        for path in folder.iterdir():
            name = path.name
            if not name.startswith(prefix):
                continue
            try:
                n = int(name[len(prefix) :].split(".", 1)[0])
            except ValueError:
                continue
            if n > seq or (n == seq and name not in keep):
                path.unlink()

    def add(self, tokens: np.ndarray, lengths: np.ndarray, origins: OriginColumns | None = None) -> None:
        """Append documents (EOS included in ``tokens``; ``origins``, where each starts in its
        input), starting new shards where needed."""
        start = 0
        doc = 0
        n = len(lengths)
        while doc < n:
            room = self.shard_tokens - self.current.tokens
            if self.current.tokens and lengths[doc] > room:
                self._rotate()
                room = self.shard_tokens
            # take as many whole documents as fit (at least one: a huge one gets its own shard)
            ends = np.cumsum(lengths[doc:], dtype=np.int64)
            take = max(1, int(np.searchsorted(ends, room, side="right")))
            stop = start + int(ends[take - 1])
            part_origins = origins[doc : doc + take] if origins is not None else None
            self.current.append(tokens[start:stop], lengths[doc : doc + take], part_origins)
            start = stop
            doc += take

    def add_spooled(self, path: Path, n_tokens: int, origin: OriginColumns | None = None) -> None:
        self._make_room(n_tokens)
        self.current.append_file(path, n_tokens, origin)

    def add_parts(self, parts: list[np.ndarray], origin: OriginColumns | None = None) -> None:
        """Append one document given in pieces (EOS in the last), as `add` would whole."""
        self._make_room(sum(len(part) for part in parts))
        self.current.append_parts(parts, origin)

    def _make_room(self, n_tokens: int) -> None:
        """A new shard unless the document fits (or the shard is empty: it then gets its own)."""
        if self.current.tokens and n_tokens > self.shard_tokens - self.current.tokens:
            self._rotate()

    def _rotate(self) -> None:
        self._seal_current()
        seq = self.current.seq + 1
        self.current = ShardWriter(self.out_dir, self.shard_path(seq), self.dtype, OpenShard(seq))

    def _seal_current(self) -> None:
        record = self.current.seal()
        self.closed.append(record)
        self._sealed.append(record)

    def commit(self) -> OpenShard:
        """Make the open shard durable; the caller then saves a checkpoint and calls finalize."""
        return self.current.commit()

    def finalize(self) -> None:
        """Rename shards sealed since the last call (their checkpoint must be saved first)."""
        finalize(self.out_dir, self._sealed)
        self._sealed = []

    def finish(self, finalize: bool = True) -> list[ShardRecord]:
        """Seal the last shard and return every shard of the partition.

        A checkpointed writer passes ``finalize=False``, saves the checkpoint that lists
        the shards, then calls `finalize`; otherwise the final names are given at once.
        """
        if self.current.tokens:
            self._seal_current()
        else:
            self.current.abandon()
            for suffix in (".bin", ".lens", ".orig", ".inputs"):
                self.current._tmp(suffix).unlink(missing_ok=True)
        if finalize:
            self.finalize()
        return self.closed
