"""`StoreState`: the `RunState` of a prepare into an object store (``--out s3://bucket/run``).

The store holds the layout of a local folder (`pipeline.run.run_state`); besides it,
``.tokshard/lease.json`` (the run's lock) and ``.tokshard/progress/SRC/SPLIT/NNNNN.json`` (a
running partition's latest commit, for the progress line and `status` only).

A worker encodes its partition into a private local scratch folder with the ordinary folder
code (commit points, long documents and all), uploads each finished shard (the ``.idx``, then
the ``.bin``; an object appears whole or not at all), and only then records the partition's
checkpoint in the store. So the store's commit point is the partition: a kill -9 loses at most
the partition each worker was encoding, and a rerun writes the same bytes (a shard uploaded
before a kill is simply uploaded again, identical).

One `prepare` per URL: the driver holds a *lease* object, created only where none is (S3's
``If-None-Match: *``, GCS's ``ifGenerationMatch=0``: the one conditional write every store with
conditions has), rewritten every `LEASE_RENEW` seconds while it is still this run's, and deleted
at the end. A second `prepare` is refused while the lease is fresh. A lease whose holder is dead
is taken over by first creating a *claim* named after that lease's version (only one contender
can create it, so two reruns cannot both take it), then rewriting the lease; a claim whose
taker died before that rewrite is claimed in its turn, its taker judged as a lease's holder.
A create whose answer was lost finds its own record (`_create_own`). On the same host,
in the same PID namespace, the holder's pid says whether it runs. From another host (or another
container of the same host name, with its own pids) its record's time cannot be trusted alone
(the two clocks may differ by minutes), so a lease that looks stale, or written in the future,
is watched on this host's own monotonic clock for `LEASE_WATCH` seconds: a renewal meanwhile
means it runs; no change, that it is dead.

State written by another process (a worker, an earlier run) is read past every cache: the
store is opened without fsspec's listing cache (`pipeline.storage.object_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.encoding import tokenizer
from pipeline.encoding.spec import EncoderSpec
from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import DiskFullError
from pipeline.format.content_hash import stream_hash
from pipeline.format.errors import TokshardError
from pipeline.format.provenance import SUFFIX as ORIGIN_SUFFIX
from pipeline.format.shard_writer import ShardRecord, shard_files
from pipeline.run.records import Checkpoint, Holder, Plan, pid_namespace
from pipeline.run.run_state import OWN_MARKER, STATE_DIR, HeldRun, Log, RunState, checkpoint_rel
from pipeline.run.worker_task import PartitionTask, Superseded, run_partition, warm_up
from pipeline.sources.base import Partition
from pipeline.storage.locations import READ_ONLY_PROTOCOLS, join, protocol
from pipeline.storage.object_store import ObjectStore
from pipeline.storage.ownership import claim_folder

LEASE_FILE = f"{STATE_DIR}/lease.json"
#: one claim per lease taken over from a dead run, named after that lease's version
CLAIMS_DIR = f"{STATE_DIR}/claims"
PROGRESS_DIR = f"{STATE_DIR}/progress"
#: a lease record this old (by its holder's clock) may belong to a dead run
LEASE_SECONDS = 90.0
LEASE_RENEW = 10.0
#: seconds a lease from another host must go unrenewed, timed here, before it is taken over
LEASE_WATCH = 3 * LEASE_RENEW + 5.0
#: a record written this far in this host's future is still taken as fresh (clocks differ a little)
CLOCK_SLACK = 5.0
#: least seconds between two progress records of one running partition (and between two
#: writes of the driver's rate into its lease)
PROGRESS_SECONDS = 5.0
#: how often the driver reads the running partitions' progress records
POLL_SECONDS = 2.0
_SCRATCH = "tokshard-scratch"
#: shards streamed at once while a rerun that writes the manifest again hashes them
HASH_DOWNLOADS = 4


def progress_rel(part: Partition) -> str:
    return f"{PROGRESS_DIR}/{part.stem}.json"


# --- the worker ------------------------------------------------------------------------------


def run_partition_in_store(task: PartitionTask) -> Checkpoint:
    """Encode one partition locally, upload its shards, then record it (see the docstring)."""
    store = ObjectStore(task.out)
    part = task.partition
    scratch = _new_scratch()
    published = [time.monotonic()]

    def publish(ck: Checkpoint) -> None:
        """The latest commit as the partition's progress record (advisory: never fails the task)."""
        if time.monotonic() - published[0] < PROGRESS_SECONDS:
            return
        published[0] = time.monotonic()
        with contextlib.suppress(TokshardError):
            store.write_bytes(progress_rel(part), ck.to_bytes())

    try:
        local_task = dataclasses.replace(
            task,
            out=str(scratch),
            encoder=task.encoder.reading(str(local_tokenizer(store, task.encoder.sha256))),
            run_id=None,
        )
        try:
            ck = run_partition(local_task, publish)
        except DiskFullError as exc:
            raise TokshardError(
                f"worker scratch space is full ({exc.path}); give the workers more local disk "
                "(TMPDIR), then rerun: finished partitions are kept"
            ) from None
        _stop_if_superseded(store, task)
        for rec in ck.closed:
            for rel in shard_files(rec):
                store.upload(scratch / rel, rel)
        _stop_if_superseded(store, task)  # the uploads take a while: a newer run may have come
        store.write_bytes(checkpoint_rel(part), ck.to_bytes())
        with contextlib.suppress(TokshardError):
            store.delete(progress_rel(part))
        return ck
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _stop_if_superseded(store: ObjectStore, task: PartitionTask) -> None:
    """Nothing of a run a newer prepare took over is recorded (its task may have run on, on a
    shared scheduler's worker, after its driver was refused)."""
    holder = Holder.parse(store.read_bytes(LEASE_FILE) or b"")
    if task.run_id and holder is not None and holder.run != task.run_id:
        raise Superseded(
            f"partition {task.partition.key}: a newer prepare took over {store.url}; not recording it"
        )


def warm_up_if_present(spec: EncoderSpec) -> None:
    """`pipeline.run.worker_task.warm_up` on a worker that already has the tokenizer (this machine's)."""
    if Path(spec.tokenizer).is_file():
        warm_up(spec)


def _scratch_root() -> Path:
    return Path(tempfile.gettempdir()) / _SCRATCH


def _new_scratch() -> Path:
    """A private local folder for one attempt; folders of dead processes are removed first."""
    root = _scratch_root()
    root.mkdir(parents=True, exist_ok=True)
    ns = pid_namespace()
    for old in root.glob("*-*"):
        pid, _, its_ns = old.name.split("-", 1)[0].partition(".")
        # a folder of another PID namespace (a container sharing this /tmp) is not this one's to
        # judge: its pid is none of ours (an older version's folder says no namespace)
        if pid.isdigit() and its_ns in ("", str(ns)) and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    owner = f"{os.getpid()}" if ns is None else f"{os.getpid()}.{ns}"  # PID.NAMESPACE-
    return Path(tempfile.mkdtemp(prefix=f"{owner}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_tokenizer(store: ObjectStore, sha256: str) -> Path:
    """The run's tokenizer.json as a local file (fetched once per machine, checked by sha256)."""
    path = _scratch_root() / f"tokenizer-{sha256}.json"
    if path.is_file():
        return path
    data = store.read_bytes(tokenizer.TOKENIZER_FILE)
    if data is None or hashlib.sha256(data).hexdigest() != sha256:
        raise TokshardError(f"{store.where(tokenizer.TOKENIZER_FILE)} is missing or changed; rerun prepare")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


# --- the lease -------------------------------------------------------------------------------


def lease_is_dead(holder: Holder | None) -> bool:
    """A lease whose holder cannot be running, by its record alone: its pid is gone (same
    host) or it went stale (`status`, which must not wait, asks this)."""
    if holder is None:
        return True
    if _on_this_host(holder) and not _alive(int(holder.pid or 0)):
        return True
    age = holder.age()
    return age is None or age > LEASE_SECONDS


def _on_this_host(holder: Holder) -> bool:
    """A holder whose pid this process can look up (a record may hold anything): on this host,
    and in this PID namespace (another container of the same host name has its own pids: a
    live holder there is no pid here). A record that does not say its namespace (an older
    version's) is judged as another host's, by its age."""
    pid = holder.pid
    return (
        holder.host == socket.gethostname()
        and type(pid) is int
        and 0 < pid < 2**31
        and holder.pid_ns == pid_namespace()
    )


def _fresh_by_its_clock(holder: Holder) -> bool:
    age = holder.age(signed=True)
    return age is not None and -CLOCK_SLACK <= age <= LEASE_SECONDS


def _watched(store: ObjectStore, found: tuple[bytes, str], log: Log, why: str) -> tuple[bytes, str] | None:
    """Watch the lease for `LEASE_WATCH` seconds of this host's clock, saying ``why`` first: the
    lease as it changed (a live holder renewed it, another run took it, or it is gone: None),
    or ``found`` itself if it never changed. The record is compared with its version tag, as a
    store may give no tag."""
    log(f"{why}; watching it {LEASE_WATCH:.0f} s for a renewal before taking it over")
    deadline = time.monotonic() + LEASE_WATCH
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        now = store.etag(LEASE_FILE)
        if now != found:
            return now
    return found


def _create_own(store: ObjectStore, rel: str, record: Holder) -> bool:
    """Create ``rel`` holding ``record`` only where no object is; True if it is this run's. A
    create whose answer was lost (the write reached the store, the client tried it again and
    was told an object is there) finds its own record: every record names its run (a random
    id), so no other run's is the same bytes."""
    data = record.to_bytes()
    return store.create(rel, data) or store.read_bytes(rel) == data


class Lease:
    """A held lease: renewed on a thread, carrying the driver's progress for `status`."""

    def __init__(self, store: ObjectStore, holder: Holder, log: Log) -> None:
        self.store, self.holder, self.log = store, holder, log
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._written = time.monotonic()
        self._thread = threading.Thread(target=self._renew_until_stopped, daemon=True)

    def report(self, tokens_per_s: float, eta_s: float | None) -> None:
        """Written with the next renewal, brought forward: the first rate at once, later ones
        at most every `PROGRESS_SECONDS`."""
        first = not self.holder.tokens_per_s and tokens_per_s > 0
        self.holder = dataclasses.replace(self.holder, tokens_per_s=tokens_per_s, eta_s=eta_s)
        if first or time.monotonic() - self._written >= PROGRESS_SECONDS:
            self._wake.set()

    def _renew_until_stopped(self) -> None:
        while True:
            self._wake.wait(LEASE_RENEW)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                current = Holder.parse(self.store.read_bytes(LEASE_FILE) or b"")
                if current is None or current.run != self.holder.run:
                    self.log(f"lost the lease on {self.store.url} to another prepare; stop this one")
                    return
                self.holder = self.holder.updated()
                self.store.write_bytes(LEASE_FILE, self.holder.to_bytes())
                self._written = time.monotonic()
            except TokshardError as exc:  # a blip: the next renewal tries again
                self.log(f"could not renew the lease on {self.store.url}: {exc}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=LEASE_RENEW)
        with contextlib.suppress(TokshardError):
            current = Holder.parse(self.store.read_bytes(LEASE_FILE) or b"")
            if current is not None and current.run == self.holder.run:
                self.store.delete(LEASE_FILE)


@contextlib.contextmanager
def lease(store: ObjectStore, run_id: str, log: Log) -> Iterator[Lease]:
    """Hold the URL's run lease for the duration (see the module docstring)."""
    mine = Holder.of_this_process(run_id)
    if not _create_own(store, LEASE_FILE, mine):
        _take_over(store, mine, log)
    if store.create(LEASE_FILE, mine.to_bytes()):  # the lease is there: a store that keeps it says no
        log(
            f"{store.url}: this store ignores conditional writes (S3's If-None-Match, GCS's ifGenerationMatch), so a second "
            "`tokshard prepare` on it would not be refused while this one runs; start one at a time"
        )
    held = Lease(store, mine, log)
    held.start()
    try:
        yield held
    finally:
        held.stop()


def _take_over(store: ObjectStore, mine: Holder, log: Log) -> None:
    """Take the lease another run left, or refuse in one line while that run is alive."""
    found = store.etag(LEASE_FILE)
    other = Holder.parse(found[0]) if found else None
    if found is not None and other is not None:
        here = _on_this_host(other)
        if (not lease_is_dead(other)) if here else _fresh_by_its_clock(other):
            raise _running_elsewhere(store, other, "")
        if not here:
            why = (
                f"the lease on {store.url} ({stale_text(other)}) is from another host, whose clock may "
                "differ from this one's"
            )
            now = _watched(store, found, log, why)
            if now is not None and now != found:
                raise _renewed_elsewhere(store, other, Holder.parse(now[0]))
            found = now  # None: its run ended while watched and deleted the lease
    if found is None:
        if not _create_own(store, LEASE_FILE, mine):
            raise _taken_just_now(store)
        return
    _claim(store, found, mine, log)
    store.write_bytes(LEASE_FILE, mine.to_bytes())
    log(f"took over the lease of a dead run ({stale_text(other)})")


def _claim(store: ObjectStore, lease_found: tuple[bytes, str], mine: Holder, log: Log) -> None:
    """Create the claim on this version of the lease, or refuse while another rerun may be
    taking it over. A claim whose taker died before it rewrote the lease (a kill -9 between the
    two writes) would block every rerun for good: it is claimed in its turn, by a claim named
    after its own version, once its taker is judged dead as a lease's holder is."""
    claimed = lease_found
    while not _create_own(store, name := claim_of(claimed), mine):
        found = store.etag(name)
        taker = Holder.parse(found[0]) if found is not None else None
        if found is None or not _abandoned(store, lease_found, taker, log):
            raise _taken_just_now(store, taker, name)
        claimed = found


def _abandoned(store: ObjectStore, lease_found: tuple[bytes, str], taker: Holder | None, log: Log) -> bool:
    """Whether a claim's taker died before it rewrote the lease (a live one rewrites it at once):
    the lease is still the version it claimed, and the taker is dead by the rules of a lease's
    holder (its pid on this host; from another host, a record that looks fresh is alive, and
    one that does not is watched: the lease it would rewrite is left unchanged)."""
    if store.etag(LEASE_FILE) != lease_found:
        return False
    taker = taker or Holder()
    if _on_this_host(taker):
        return lease_is_dead(taker)
    if _fresh_by_its_clock(taker):
        return False
    why = (
        f"the dead lease on {store.url} was claimed by {stale_text(taker)}, from another host, which "
        "has not rewritten it since"
    )
    return _watched(store, lease_found, log, why) == lease_found


def claim_of(lease_found: tuple[bytes, str]) -> str:
    """The claim that takes over this version of the lease (or of a claim): every contender
    that found the same dead one names the same claim, and only one can create it."""
    data, version = lease_found
    digest = hashlib.sha256(version.encode() + b"\0" + data).hexdigest()
    return f"{CLAIMS_DIR}/{digest[:32]}.json"


def _renewed_elsewhere(store: ObjectStore, watched: Holder, now: Holder | None) -> TokshardError:
    if now is None or now.run != watched.run:
        return _taken_just_now(store)
    return _running_elsewhere(
        store,
        now,
        "; its lease was renewed while this one watched, though its time looked stale: the two hosts' "
        "clocks differ (check their NTP)",
    )


def _taken_just_now(
    store: ObjectStore, taker: Holder | None = None, claim: str | None = None
) -> TokshardError:
    """Refused for a takeover by another rerun; ``taker`` and its ``claim`` named where known (a
    claim is taken over once its taker is dead, as a lease is)."""
    who = f" ({taker.text()}, by its claim {store.where(claim)})" if taker is not None and claim else ""
    return TokshardError(
        f"another `tokshard prepare`{who} took over {store.url} just now; wait for it, then rerun"
    )


def _running_elsewhere(store: ObjectStore, other: Holder, why: str) -> TokshardError:
    return TokshardError(
        f"another `tokshard prepare` ({other.text()}) is running on {store.url}{why}; wait for it to "
        f"finish or stop it, then rerun (a lease not renewed for {LEASE_SECONDS:.0f} s expires: its "
        f"object is {store.where(LEASE_FILE)})"
    )


def stale_text(holder: Holder | None) -> str:
    """How a dead lease's holder is named: who it was and when it was last heard of."""
    if holder is None or holder.text() == Holder().text():
        return "its lease record was unreadable"
    age = holder.age()
    heard = f", last renewed {age:.0f} s ago" if age is not None else ""
    return f"{holder.text()}{heard}"


# --- the run state ----------------------------------------------------------------------------


class StoreState(RunState):
    """The run state of one prepare URL, read and written through the store."""

    resumes_partials = False
    hashes_locally = False
    poll_seconds = POLL_SECONDS
    work = staticmethod(run_partition_in_store)
    warm = staticmethod(warm_up_if_present)

    def __init__(self, place: ObjectStore) -> None:
        self.place = place

    @property
    def manifest_location(self) -> str:
        return join(self.place.url, manifest_mod.MANIFEST_NAME)

    def open_for_writing(self) -> None:
        url = self.place.url
        if protocol(url) in READ_ONLY_PROTOCOLS:
            raise TokshardError(
                f"--out {url}: {protocol(url)}:// cannot be written to; "
                "give a folder or a store URL such as s3://BUCKET/PATH"
            )
        self.place.check_reachable()
        if claim_folder(self.place, "--out", "prepare", OWN_MARKER) == "new" and self.place.is_a_file():
            raise TokshardError(
                f"--out {url} is an object; it names a folder (a key prefix) to write the run under: "
                "choose another --out"
            )

    def check_readable(self) -> None:
        self.place.check_reachable()

    def hold(self, run_id: str, log: Log) -> contextlib.AbstractContextManager[HeldRun]:
        return lease(self.place, run_id, log)

    def holder(self) -> Holder | None:
        found = self.place.read_bytes(LEASE_FILE)
        if found is None:
            return None
        holder = Holder.parse(found)
        return None if lease_is_dead(holder) else holder

    def remove_leftovers(self) -> int:
        """Progress records of interrupted runs: a store redoes their partitions whole."""
        stale = self.place.list(PROGRESS_DIR)
        for rel in stale:
            self.place.delete(rel)
        return len(stale)

    def load_checkpoints(self, plan: Plan) -> dict[str, Checkpoint | None]:
        """One listing instead of a read per missing checkpoint."""
        present = set(self.place.list(f"{STATE_DIR}/parts"))
        return {
            p.key: self.load_checkpoint(p) if checkpoint_rel(p) in present else None for p in plan.partitions
        }

    def read_progress(self, part: Partition) -> Checkpoint | None:
        data = self.place.read_bytes(progress_rel(part))
        return None if data is None else Checkpoint.parse(data, part, self.place.where(progress_rel(part)))

    def _every_checkpoint(self, plan: Plan) -> dict[str, Checkpoint | None]:
        """For a run whose partitions all finished: those the listing leaves out read by name
        (some stores, eventually consistent ones and caching gateways, list an object only a
        while after it was written)."""
        found = self.load_checkpoints(plan)
        for part in plan.partitions:
            if found[part.key] is None:
                found[part.key] = self.load_checkpoint(part)
        return found

    def load_progress(self, plan: Plan, finished: bool = False) -> dict[str, Checkpoint | None]:
        found = self._every_checkpoint(plan) if finished else self.load_checkpoints(plan)
        running = set(self.place.list(PROGRESS_DIR))
        for part in plan.partitions:
            if found[part.key] is None and progress_rel(part) in running:
                found[part.key] = self.read_progress(part)
        return found

    def kept_problems(
        self, plan: Plan, checkpoints: dict[str, Checkpoint | None], hashes: bool = True
    ) -> dict[str, str]:
        """Each shard a finished partition recorded is stored, with its ``.idx``, at the
        recorded size; with ``hashes``, of the recorded content too: every file is downloaded
        once (streamed), so only a rerun that writes the manifest again asks (`hashes_locally`)."""
        finished = {key: ck for key, ck in checkpoints.items() if ck is not None and ck.complete}
        if not finished:
            return {}
        listed = self._shard_sizes(plan)

        def size(rel: str) -> int | None:  # asked by name where the listing may lag the writes
            return listed[rel] if rel in listed else self.place.size(rel)

        problems = {}
        for key, ck in finished.items():
            problem = _stored_size_problem(ck, size)
            if problem is not None:
                problems[key] = problem
        if hashes:
            whole = [(key, ck) for key, ck in finished.items() if key not in problems]
            with ThreadPoolExecutor(max_workers=HASH_DOWNLOADS) as pool:
                found = pool.map(lambda item: self._content_problem(item[1]), whole)
                problems |= {key: p for (key, _), p in zip(whole, found, strict=True) if p is not None}
        return problems

    def _content_problem(self, ck: Checkpoint) -> str | None:
        """The first of a checkpoint's stored shard files whose content hash is not the one
        recorded (None: every one is), each streamed from the store once."""
        for rec in ck.closed:
            for rel, wanted in _recorded_hashes(rec).items():
                with self.place.open_read(rel) as f:
                    if stream_hash(f) != wanted:
                        return f"{rel} differs from its checkpoint (content hash)"
        return None

    def _shard_sizes(self, plan: Plan) -> dict[str, int]:
        """One listing per output folder (it may lag the writes: see `_every_checkpoint`)."""
        sizes: dict[str, int] = {}
        for folder in sorted({str(Path(p.stem).parent) for p in plan.partitions}):
            sizes.update(self.place.list(folder))
        return sizes

    def forget_partition(self, part: Partition) -> None:
        self.place.delete(checkpoint_rel(part))
        self.place.delete(progress_rel(part))
        prefix = f"{Path(part.stem).name}-"
        for rel in self.place.list(str(Path(part.stem).parent)):
            if Path(rel).name.startswith(prefix):
                self.place.delete(rel)

    def finished_checkpoints(self, plan: Plan) -> list[Checkpoint]:
        """Every partition's final checkpoint, after checking each shard it lists is stored whole."""
        finished = self._every_checkpoint(plan)
        for part in plan.partitions:
            ck = finished[part.key]
            if ck is None or not ck.complete:
                raise TokshardError(f"partition {part.key} did not finish; rerun to resume")
        problems = self.kept_problems(plan, finished, hashes=False)
        if problems:
            key, problem = next(iter(problems.items()))
            raise TokshardError(
                f"{self.place.url}: partition {key}: {problem} (a finished shard went missing during "
                "the run); rerun: prepare redoes that partition"
            )
        return [finished[p.key] for p in plan.partitions]  # type: ignore[misc]

    @property
    def task_out(self) -> str:
        return self.place.url

    def install_tokenizer(self, src: Path, tok: tokenizer.TokenizerInfo) -> Path:
        existing = self.place.read_bytes(tokenizer.TOKENIZER_FILE)
        if existing is None or hashlib.sha256(existing).hexdigest() != tok.sha256:
            with tempfile.TemporaryDirectory(prefix="tokshard-driver-") as staging:
                self.place.upload(tokenizer.install(src, tok, Path(staging)), tokenizer.TOKENIZER_FILE)
        return local_tokenizer(self.place, tok.sha256)

    def worker_tokenizer(self, sha256: str) -> str:
        return str(local_tokenizer(self.place, sha256))

    def after_manifest(self) -> None:
        self.remove_leftovers()
        for rel in self.place.list(CLAIMS_DIR):  # the run is complete: no lease is left to take over
            self.place.delete(rel)


def _stored_size_problem(ck: Checkpoint, size: Callable[[str], int | None]) -> str | None:
    """The first of a checkpoint's shards missing from the store or of another size than
    recorded (``size``: a stored object's, None if it is not there), as text; None if none."""
    for rec in ck.closed:
        stored = {rel: size(rel) for rel in shard_files(rec)}  # the .bin among them
        missing = [rel for rel, n in stored.items() if n is None]
        if missing:
            return f"{missing[0]} is missing"
        problem = _size_problem(rec, stored)  # type: ignore[arg-type]
        if problem is not None:
            return problem
    return None


def _recorded_hashes(rec: ShardRecord) -> dict[str, str]:
    """A finished shard's files (relative paths) -> the content hash its record gives each."""
    stem = rec.path[: -len(".bin")]
    recorded = {rec.path: rec.hash, stem + ".idx": rec.idx_hash, stem + ORIGIN_SUFFIX: rec.origin_hash}
    return {rel: recorded[rel] for rel in shard_files(rec)}  # type: ignore[misc]


def _size_problem(rec: ShardRecord, stored: dict[str, int]) -> str | None:
    """A finished shard's stored files of other sizes than its record says (None: each as it says)."""
    stem = rec.path[: -len(".bin")]
    if stored[rec.path] != rec.bytes:
        return f"{rec.path} is {stored[rec.path]} bytes, its checkpoint says {rec.bytes}"
    if stored[stem + ".idx"] != rec.idx_bytes:
        return f"{rec.path}: its .idx is {stored[stem + '.idx']} bytes, its {rec.documents} documents make {rec.idx_bytes}"
    origin = stored.get(stem + ORIGIN_SUFFIX)
    if origin is not None and origin != rec.origin_bytes:
        return f"{rec.path}: its provenance sidecar is not the size its checkpoint says"
    return None
