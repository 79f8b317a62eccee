"""A node-local, hash-checked cache of the shards of a manifest URL (``train --manifest s3://...``).

Layout under the cache folder (``--data-cache``, default ``$XDG_CACHE_HOME/tokshard/data``, i.e.
``~/.cache/tokshard/data``)::

    views/KEY/manifest.json            the manifest of one URL (KEY: a hash of the URL)
    views/KEY/tokenizer.json           checked against the manifest's sha256
    views/KEY/SRC/SPLIT/NAME.{bin,idx} shards at their paths in the manifest, so the view is an
                                       ordinary prepared folder that the trainer memory-maps
    views/KEY/SRC/SPLIT/NAME.bin.ok    the stat (size, mtime, inode) the file had when its hash
                                       matched the manifest; its mtime is the shard's last use
    views/KEY/SRC/SPLIT/NAME.bin.pin   shared-locked (flock) by every process that maps the shard
    views/KEY/SRC/SPLIT/NAME.origin    the shard's provenance sidecar, fetched (and checked against
                                       the manifest's ``origin_hash``, with its own ``.ok``) only
                                       when a document's origin is asked for

A shard is downloaded to a temporary name, hashed while it arrives, checked against the
manifest, and renamed into place, under an exclusive per-shard download lock: several ranks
or jobs of a node fill one cache without a shard being fetched twice or read half-written.
A cached file whose stat no longer matches its ``.ok`` record is hashed again before use; a
wrong hash means it is fetched again. ``limit`` (``--data-cache-limit``) evicts the least
recently used shards whose ``.pin`` no process holds; sidecars, a small share of their shards'
bytes, are neither counted nor evicted (so one being read is never deleted under its reader).

numpy-free: stdlib and xxhash, plus fsspec through `pipeline.storage.object_store` on first download.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import DISK_FULL_ERRNOS, FileTooLargeError, free_bytes
from pipeline.format.errors import DataError, TokshardError, counted
from pipeline.storage.locations import is_url, parent, shown_location
from pipeline.storage.object_store import ObjectStore
from pipeline.storage.ownership import claim_folder
from pipeline.storage.places import open_manifest_place

HASH_NAME = "xxh3_128"
#: the cache's one top-level folder: a cache folder holding it is the data cache's own
VIEWS = "views"
#: a view folder's record of the manifest URL it holds
SOURCE_URL = "source.url"
_CHUNK = 1 << 23
#: how long the end of a run waits for the prefetch thread to abandon its download
STOP_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class Wanted:
    """One file of a shard to make local: where it goes, its key in the store, the hash (and
    for a .bin the size) the manifest gives it, and its kind as an error names it."""

    path: Path
    rel: str
    hash: str
    size: int | None = None
    what: str = "shard"

    @classmethod
    def bin_of(cls, entry: manifest_mod.ShardEntry) -> Wanted:
        return cls(entry.bin_path, entry.rel_path, entry.hash, entry.bytes)

    @classmethod
    def index_of(cls, entry: manifest_mod.ShardEntry) -> Wanted:
        return cls(entry.idx_path, _idx_rel(entry.rel_path), entry.idx_hash)

    @classmethod
    def sidecar_of(cls, entry: manifest_mod.ShardEntry) -> Wanted:
        return cls(entry.origin_path, entry.origin_rel, entry.origin_hash, what="sidecar")


class DownloadStopped(Exception):
    """A download abandoned because its fetcher was stopped (the run ended first)."""


def cache_root() -> Path:
    """tokshard's folder of per-user caches: ``$XDG_CACHE_HOME/tokshard`` (``~/.cache/tokshard``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokshard"


def default_cache_dir() -> Path:
    return cache_root() / "data"


def parse_size(text: str, flag: str = "--data-cache-limit") -> int:
    """``50GB``, ``200GiB``, ``1T``, ``123456``: bytes (decimal units, or binary with an i)."""
    units = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    t = text.strip().upper().removesuffix("B")
    binary = t.endswith("I")
    t = t.removesuffix("I")
    unit = t[-1:] if t[-1:] in units and t[-1:] else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise TokshardError(f"{flag} {text!r}: expected a size above 0, such as 200GB or 50GiB")
    scale = 1024 ** " KMGT".index(unit) if binary and unit else units[unit]
    return int(value * scale)


@dataclass
class CacheStats:
    """What a run's data cache did; counted from the trainer's loader threads at once."""

    downloaded: int = 0
    downloaded_bytes: int = 0
    cached: int = 0
    #: cached files of an earlier version of the data (the manifest at the URL changed since)
    refetched_changed: int = 0
    #: cached files changed on this disk since their hash was checked
    refetched_corrupt: int = 0
    evicted: int = 0
    wait_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        """Add to counters under a lock: ``x += 1`` from two threads can lose one."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def summary(self, root: Path, not_fetched: int = 0) -> str:
        """The line a run ends with: what came from the store, what the cache held, and how many
        shards the run ended before fetching."""
        left = f"; {counted(not_fetched, 'shard')} not fetched (the run ended first)" if not_fetched else ""
        return (
            f"data cache {root}: {counted(self.downloaded, 'file')} downloaded ({self.downloaded_bytes / 2**20:.1f} MiB), "
            f"{counted(self.cached, 'shard')} found cached, {self.refetched_changed} of an earlier version of the data "
            f"and {self.refetched_corrupt} damaged on this disk fetched again, {self.evicted} evicted{left}"
        )


class DataCache:
    """One process's handle on a node's shard cache (thread-safe)."""

    def __init__(self, root: str | os.PathLike | None = None, limit: int | None = None, log=None) -> None:
        if root is not None and is_url(str(root)):
            raise TokshardError(f"--data-cache {root} is a URL; it takes a local folder")
        self.root = Path(root) if root is not None else default_cache_dir()
        self.limit = limit
        self.stats = CacheStats()
        self.log = log or (lambda msg: print(f"tokshard: {shown_location(msg)}", file=sys.stderr, flush=True))
        self._pins: dict[Path, int] = {}
        #: shards whose .idx alone this process made local (a reader of document lengths), by
        #: .bin path: pinned as `_pins` are, so no eviction deletes one under its reader
        self._index_pins: dict[Path, int] = {}
        self._locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()
        self._stores: dict[str, ObjectStore] = {}
        claim_folder(self.root, "--data-cache", "the data cache", VIEWS + "/")

    def _make_views(self) -> None:
        """Made once a manifest is there to keep: a run refused before (no manifest at the URL,
        a store out of reach) leaves no folder behind."""
        try:
            (self.root / VIEWS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TokshardError(f"cannot create the data cache {self.root}: {exc.strerror}") from exc

    # --- manifest ------------------------------------------------------------------------

    def open_manifest(self, url: str) -> manifest_mod.Manifest:
        """The manifest of ``url`` (a manifest or its folder), in its local view folder."""
        murl = url if url.endswith(".json") else url.rstrip("/") + "/" + manifest_mod.MANIFEST_NAME
        store = ObjectStore(parent(murl))
        store.check_reachable()
        data = store.read_bytes(murl.rsplit("/", 1)[1])
        if data is None:
            raise TokshardError(f"no manifest at {murl} (is `tokshard prepare` still running?)")
        self._make_views()
        view = self.root / VIEWS / hashlib.sha256(murl.encode()).hexdigest()[:16]
        self._write(view / manifest_mod.MANIFEST_NAME, data)
        self._write(view / SOURCE_URL, (murl + "\n").encode())
        m = manifest_mod.load(view / manifest_mod.MANIFEST_NAME)
        self._stores[str(view)] = store
        tok = m.data["tokenizer"]
        tok_path = m.tokenizer_path
        if not (tok_path.is_file() and _sha256(tok_path) == tok["sha256"]):
            raw = store.read_bytes(tok["path"])
            if raw is None or hashlib.sha256(raw).hexdigest() != tok["sha256"]:
                raise TokshardError(f"{store.where(tok['path'])} is missing or differs from the manifest")
            self._write(tok_path, raw)
        m.source_url = murl  # type: ignore[attr-defined]
        return m

    # --- shards --------------------------------------------------------------------------

    def ensure(
        self, m: manifest_mod.Manifest, entry: manifest_mod.ShardEntry, stop: threading.Event | None = None
    ) -> None:
        """Make ``entry``'s .bin and .idx local and hash-checked, and pin them for this process
        (``stop``, once set, abandons a download in flight: `DownloadStopped`, nothing kept)."""
        with self._guard:
            lock = self._locks.setdefault(entry.bin_path, threading.Lock())
        with lock:
            if entry.bin_path in self._pins:
                return
            began = time.perf_counter()
            self._pin(entry.bin_path)
            store = self._stores[str(m.folder)]
            try:
                got = self._ensure_file(store, Wanted.index_of(entry), stop)
                got |= self._ensure_file(store, Wanted.bin_of(entry), stop)
            except BaseException:
                self._unpin(entry.bin_path)  # not there: whoever asks next meets the failure too
                raise
            self.stats.add(wait_s=time.perf_counter() - began)
            if not got:
                self.stats.add(cached=1)
            elif self.limit is not None:
                self.evict()

    def ensure_index(self, m: manifest_mod.Manifest, entry: manifest_mod.ShardEntry) -> None:
        """Make ``entry``'s .idx local and hash-checked, without its .bin: what a reader of
        document lengths alone (`tokshard inspect`) needs, at a fraction of the bytes."""
        with self._guard:
            lock = self._locks.setdefault(entry.bin_path, threading.Lock())
        with lock:
            if entry.bin_path in self._pins or entry.bin_path in self._index_pins:
                return
            began = time.perf_counter()
            self._index_pins[entry.bin_path] = self._pin_file(entry.bin_path)
            try:
                self._ensure_file(self._stores[str(m.folder)], Wanted.index_of(entry))
            except BaseException:
                self._unpin(entry.bin_path)
                raise
            self.stats.add(wait_s=time.perf_counter() - began)

    def holds(self, entry: manifest_mod.ShardEntry) -> bool:
        """This process made ``entry`` local (and pins it)."""
        return entry.bin_path in self._pins

    def ensure_origin(self, m: manifest_mod.Manifest, entry: manifest_mod.ShardEntry) -> None:
        """Make ``entry``'s provenance sidecar local and checked against its ``origin_hash``
        (nothing to do for a shard written without one: its reader says so)."""
        if entry.origin_hash is None:
            return
        with self._guard:
            lock = self._locks.setdefault(entry.origin_path, threading.Lock())
        with lock:
            began = time.perf_counter()
            store = self._stores[str(m.folder)]
            self._ensure_file(store, Wanted.sidecar_of(entry))
            self.stats.add(wait_s=time.perf_counter() - began)

    def _ensure_file(self, store: ObjectStore, file: Wanted, stop: threading.Event | None = None) -> bool:
        """True if it had to be downloaded."""
        if self._verified(file.path, file.hash):
            return False
        with _flock(file.path.with_name(file.path.name + ".lock"), fcntl.LOCK_EX):
            if self._verified(file.path, file.hash):  # another process fetched it while we waited
                return False
            _remove_abandoned_downloads(file.path)
            self._download(store, file, stop)
        return True

    def _verified(self, path: Path, want: str) -> bool:
        """The file is there with the manifest's hash (trusting an unchanged stat record)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        ok = path.with_name(path.name + ".ok")
        stamp = _stamp(want, st)
        recorded: dict = {}
        with contextlib.suppress(OSError, ValueError):
            recorded = json.loads(ok.read_text())
        if recorded == stamp:
            os.utime(ok)  # last use, for eviction
            return True
        if recorded.get("hash") not in (None, want):
            self.stats.add(refetched_changed=1)
            self.log(
                f"cached {path} is of an earlier version of the data (its manifest changed since the "
                "cache was filled); fetching the new one"
            )
        elif _xxh_file(path) == want:
            self._write(ok, json.dumps(stamp).encode())
            return True
        elif not recorded:  # no record of a check (a cache filled by an older tokshard, a copy)
            self.log(f"cached {path} has no record of its check and is not the manifest's; fetching it")
        else:
            self.stats.add(refetched_corrupt=1)
            self.log(f"cached {path} was changed on this disk since it was checked; fetching it again")
        path.unlink(missing_ok=True)
        return False

    def _download(self, store: ObjectStore, file: Wanted, stop: threading.Event | None) -> None:
        """Fetch ``file`` under a temporary name, hashed as it arrives; it takes its final name
        only if it is what the manifest says (nothing half-written is ever left)."""
        path, rel, want, size = file.path, file.rel, file.hash, file.size
        tmp = _download_name(path)
        h = xxhash.xxh3_128()
        n = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with store.open_read(rel) as src, open(tmp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    if stop is not None and stop.is_set():
                        raise DownloadStopped(rel)
                    h.update(chunk)
                    dst.write(chunk)
                    n += len(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            got = f"{HASH_NAME}:{h.hexdigest()}"
            if got != want or (size is not None and n != size):
                raise DataError(
                    f"{store.where(rel)} changed since its manifest was read ({n} bytes, hash {got}; the "
                    f"manifest says {want}): prepared again since (start again to read its new manifest) or "
                    "edited in the store (`tokshard verify` on the manifest names every such file: delete "
                    "them and rerun `tokshard prepare` with the same --out to make them again)"
                )
            os.replace(tmp, path)
            # then its record, of the stat the file has in place (a rename sets its ctime): a
            # process that ends between the two leaves a file without a record, hashed at its use
            self._write(path.with_name(path.name + ".ok"), json.dumps(_stamp(want, path.stat())).encode())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._disk_error(exc, path, size) from exc
        except TokshardError as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc.__cause__, FileNotFoundError):
                raise DataError(
                    f"{store.where(rel)}: a {file.what} the manifest lists is missing from the store (deleted "
                    "after prepare?); run `tokshard verify` on the manifest, or prepare the data again"
                ) from None
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.stats.add(downloaded=1, downloaded_bytes=n)

    def _write(self, path: Path, data: bytes) -> None:
        """`_write_whole`, with a full or unwritable cache disk said in one line."""
        try:
            _write_whole(path, data)
        except OSError as exc:
            raise self._disk_error(exc, path, len(data)) from exc

    def _disk_error(self, exc: OSError, path: Path, needed: int | None) -> TokshardError:
        if exc.errno == errno.EFBIG:
            return FileTooLargeError(str(path))
        if exc.errno in DISK_FULL_ERRNOS:
            free = free_bytes(self.root)
            room = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
            more = f", {needed / 2**20:.1f} MiB needed" if needed else ""
            return TokshardError(
                f"disk full writing the data cache {self.root} ({room}{more} for {path.name}); free "
                "space there, give --data-cache a folder on a larger disk, or bound it with --data-cache-limit"
            )
        return TokshardError(
            f"cannot write the data cache {self.root} ({path}: {exc.strerror or exc}); "
            "give --data-cache a writable folder"
        )

    def _pin(self, bin_path: Path) -> None:
        self._pins[bin_path] = self._pin_file(bin_path)

    @staticmethod
    def _pin_file(bin_path: Path) -> int:
        """A shared lock on the shard's .pin file, which `evict` will not delete it under."""
        pin = bin_path.with_name(bin_path.name + ".pin")
        pin.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(pin, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def _unpin(self, bin_path: Path) -> None:
        for pins in (self._pins, self._index_pins):
            fd = pins.pop(bin_path, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        """Unpin everything (the process no longer maps these shards)."""
        with self._guard:
            for fd in [*self._pins.values(), *self._index_pins.values()]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pins.clear()
            self._index_pins.clear()

    # --- eviction ------------------------------------------------------------------------

    def usage(self) -> int:
        return sum(p.stat().st_size for p in self._cached_files())

    def _cached_files(self) -> Iterable[Path]:
        for p in (self.root / VIEWS).glob("*/**/*"):
            if p.suffix in (".bin", ".idx") and p.is_file():
                yield p

    def evict(self) -> None:
        """Delete least recently used shards nobody pins until the cache fits ``limit``."""
        if self.limit is None:
            return
        bins = [p for p in self._cached_files() if p.suffix == ".bin"]
        total = self.usage()
        if total <= self.limit:
            return

        def last_use(p: Path) -> float:
            with contextlib.suppress(OSError):
                return p.with_name(p.name + ".ok").stat().st_mtime
            return 0.0

        for bin_path in sorted(bins, key=last_use):
            if total <= self.limit:
                return
            pin = bin_path.with_name(bin_path.name + ".pin")
            fd = os.open(pin, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a job maps it
                idx = bin_path.with_suffix(".idx")
                for p in (bin_path, idx):
                    with contextlib.suppress(FileNotFoundError):
                        total -= p.stat().st_size
                        p.unlink()
                    p.with_name(p.name + ".ok").unlink(missing_ok=True)
                self.stats.add(evicted=1)
            finally:
                os.close(fd)


class ShardFetcher:
    """Downloads a manifest's shards ahead of use on a background thread, in a given order;
    `ready(path)` (called by the dataset before it maps a shard) waits for that one."""

    def __init__(self, cache: DataCache, m: manifest_mod.Manifest) -> None:
        self.cache = cache
        self.manifest = m
        self.by_path = {e.bin_path: e for e in m.shards}
        self.by_origin_path = {e.origin_path: e for e in m.shards if e.origin_hash is not None}
        self.by_idx_path = {e.idx_path: e for e in m.shards}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, order: list[manifest_mod.ShardEntry]) -> None:
        first = set(order)
        rest = [e for e in self.manifest.shards if e not in first]
        self._thread = threading.Thread(
            target=self._run, args=([*order, *rest],), name="tokshard-shard-fetch", daemon=True
        )
        self._thread.start()

    def _run(self, entries: list[manifest_mod.ShardEntry]) -> None:
        try:
            for entry in entries:
                if self._stop.is_set():
                    return
                self.cache.ensure(self.manifest, entry, self._stop)
        except DownloadStopped:
            return
        except BaseException as exc:  # the training thread meets it at its next ready()
            self._error = exc

    def stop(self) -> None:
        """End the prefetch when the run ends: a download in flight is abandoned at its next
        chunk and its temporary file deleted, rather than cut off half-written when the process
        exits. A read the store holds up longer is left to the exit (and its file to the next
        process that fetches the shard)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_SECONDS)

    def not_fetched(self) -> int:
        """Shards of the manifest this process has not made local."""
        return sum(not self.cache.holds(e) for e in self.manifest.shards)

    def ready(self, path: Path) -> None:
        """Wait for a shard (its ``.bin`` path), or fetch its provenance sidecar (its ``.origin``
        path; only a reader of origins asks for one) or its index alone (its ``.idx`` path; a
        reader of document lengths)."""
        if (sidecar_of := self.by_origin_path.get(Path(path))) is not None:
            self.cache.ensure_origin(self.manifest, sidecar_of)
            return
        if (index_of := self.by_idx_path.get(Path(path))) is not None:
            self.cache.ensure_index(self.manifest, index_of)
            return
        entry = self.by_path.get(Path(path))
        if entry is None:
            return
        if self._error is not None:
            raise self._error
        self.cache.ensure(self.manifest, entry)

    def fetch_all(self) -> None:
        for entry in self.manifest.shards:
            self.cache.ensure(self.manifest, entry)


def load_manifest(
    location: str | os.PathLike, cache_dir: str | None = None, cache_limit: str | None = None
) -> manifest_mod.Manifest:
    """A manifest wherever it is (for `inspect`): a local one as it is, a URL's in the node's
    cache (``cache_dir``, kept under ``cache_limit`` as a run keeps it) whose ``ready`` fetches
    each file as its reader asks for it (an ``.idx`` alone, or a shard), so a reader of the
    document lengths downloads no tokens."""
    place, name = open_manifest_place(location)
    if place.local_root is not None:
        return manifest_mod.load(location)
    cache = DataCache(cache_dir, parse_size(cache_limit) if cache_limit else None)
    m = cache.open_manifest(place.where(name))
    m.ready = ShardFetcher(cache, m).ready
    return m


def view_source(manifest: str | os.PathLike) -> tuple[str, Path] | None:
    """For a manifest in a data cache's view folder (the path a run trained on a URL records):
    the URL it was read from and the cache folder; None for any other manifest, or a view
    deleted since."""
    cache = view_cache(manifest)
    if cache is None:
        return None
    path = Path(manifest)
    folder = path.parent if path.name.endswith(".json") else path
    try:
        url = (folder / SOURCE_URL).read_text().strip()
    except OSError:
        return None
    return url, cache


def view_cache(manifest: str | os.PathLike) -> Path | None:
    """The data cache folder a manifest path is a view in, by its shape alone (the view may be
    gone); None for a path that is no view."""
    path = Path(manifest)
    folder = path.parent if path.name.endswith(".json") else path
    if is_url(str(manifest)) or folder.parent.name != VIEWS:
        return None
    return folder.parent.parent


def _download_name(path: Path) -> Path:
    """The temporary name a download of ``path`` is written under (one per process and thread)."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def _remove_abandoned_downloads(path: Path) -> None:
    """Delete downloads of ``path`` that a killed process left; called under ``path``'s exclusive
    download lock, so no live process is writing one."""
    pattern = re.compile(re.escape(path.name) + r"\.\d+\.\d+\.tmp")
    for tmp in path.parent.glob(path.name + ".*.tmp"):
        if pattern.fullmatch(tmp.name):
            tmp.unlink(missing_ok=True)


def _idx_rel(bin_rel: str) -> str:
    return bin_rel[: -len(".bin")] + ".idx"


@contextlib.contextmanager
def _flock(path: Path, how: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def _write_whole(path: Path, data: bytes) -> None:
    """Temporary name, then rename: another process reads the old file or the new one, and a
    failed write leaves neither a partial file nor its temporary one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _stamp(want: str, st: os.stat_result) -> dict:
    """What a ``.ok`` record holds: the hash the file matched and the stat it had then. The
    ctime too: a write that puts the size and mtime back (``touch -r``) still moves it."""
    return {
        "hash": want,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _xxh_file(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"{HASH_NAME}:{h.hexdigest()}"
