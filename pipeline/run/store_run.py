"""`prepare` into an object store (``--out s3://bucket/run``), and its status and verify.

The store holds the same layout as a local folder: ``manifest.json``, ``tokenizer.json``,
``SRC/SPLIT/NNNNN-SSSS.{bin,idx}`` and the run state under ``.tokshard/`` (``run.json``, the
plan; ``parts/SRC/SPLIT/NNNNN.json``, one per *finished* partition; ``lease.json``, the run
lock). Everything goes through `pipeline.format.store`.

A worker encodes its partition into a private local scratch folder with the ordinary
filesystem code (commit points, long documents and all), uploads each finished shard (the
``.idx``, then the ``.bin``; an object appears whole or not at all), and only then records
the partition's checkpoint in the store. The driver writes the manifest last, after checking
that every recorded shard is there. So the store's commit point is the partition: a kill -9
loses at most the partition each worker was encoding, and a rerun writes the same bytes
(a shard uploaded before a kill is simply uploaded again, identical).

One `prepare` per URL: the driver holds a *lease* object, created with S3's conditional
write (``If-None-Match: *``), renewed every `LEASE_RENEW` seconds with ``If-Match`` on its
ETag, and deleted at the end. A second `prepare` is refused while the lease is fresh; a
lease whose holder is dead (same host: its pid is gone; another host: not renewed for
`LEASE_SECONDS`) is taken over with ``If-Match``, so two reruns cannot both take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.encoding import check_cache, tokenizer
from pipeline.encoding.backend import library_versions
from pipeline.format import manifest as manifest_mod
from pipeline.format.atomic import DiskFullError, json_bytes
from pipeline.format.errors import TokshardError, VerifyError
from pipeline.format.store import READ_ONLY_PROTOCOLS, Store, join, parent, protocol
from pipeline.format.verify import check_shard, check_shards
from pipeline.recipe import Recipe
from pipeline.run import driver as runner
from pipeline.run.state import STATE_DIR, Checkpoint, Plan
from pipeline.run.worker_task import Superseded, run_partition
from pipeline.run.worker_task import warm_up as build
from pipeline.sources.base import Partition

LEASE_FILE = f"{STATE_DIR}/lease.json"
PLAN_FILE = f"{STATE_DIR}/run.json"
#: a lease not renewed for this long belongs to a dead run (on another host)
LEASE_SECONDS = 90.0
LEASE_RENEW = 15.0

Log = Callable[[str], None]


class StoreRun:
    """The run state of one prepare URL, read and written through the store."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.store = Store(self.url)

    def load_plan(self) -> Plan | None:
        data = self.store.read_bytes(PLAN_FILE)
        if data is None:
            return None
        try:
            return Plan.from_json(json.loads(data))
        except (ValueError, TypeError, KeyError) as exc:
            raise TokshardError(
                f"{self.store.where(PLAN_FILE)}: unreadable run plan ({exc}); use a new --out"
            ) from exc

    def save_plan(self, plan: Plan) -> None:
        self.store.write_bytes(PLAN_FILE, json_bytes(plan.to_json()))

    @staticmethod
    def checkpoint_rel(part: Partition) -> str:
        return f"{STATE_DIR}/parts/{part.stem}.json"

    def load_checkpoint(self, part: Partition) -> Checkpoint | None:
        data = self.store.read_bytes(self.checkpoint_rel(part))
        if data is None:
            return None
        try:
            ck = Checkpoint.from_json(json.loads(data))
        except (ValueError, TypeError) as exc:
            raise TokshardError(
                f"{self.store.where(self.checkpoint_rel(part))}: unreadable checkpoint ({exc}); "
                "delete it to redo that partition"
            ) from exc
        if ck.key != part.key:
            raise TokshardError(
                f"{self.store.where(self.checkpoint_rel(part))}: checkpoint is for {ck.key!r}, "
                f"not {part.key!r}; use a new --out"
            )
        return ck

    def load_all(self, plan: Plan) -> dict[str, Checkpoint | None]:
        """Every partition's checkpoint, with one listing instead of a read per missing one."""
        present = set(self.store.list(f"{STATE_DIR}/parts"))
        return {
            p.key: self.load_checkpoint(p) if self.checkpoint_rel(p) in present else None
            for p in plan.partitions
        }

    def manifest_doc(self) -> dict[str, Any] | None:
        data = self.store.read_bytes(manifest_mod.MANIFEST_NAME)
        try:
            return json.loads(data) if data is not None else None
        except ValueError:
            return None

    def holder(self) -> str | None:
        """Who holds a fresh lease on this URL (None if nobody does)."""
        found = self.store.read_bytes(LEASE_FILE)
        if found is None:
            return None
        info = _lease_info(found)
        return None if _lease_is_dead(info) else _holder_text(info)


# --- the lease -------------------------------------------------------------------------------


def _lease_info(data: bytes) -> dict[str, Any]:
    try:
        info = json.loads(data)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _holder_text(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"


def _lease_is_dead(info: dict[str, Any]) -> bool:
    """A lease whose holder cannot be running: its pid is gone (same host) or it went stale."""
    if not info:
        return True
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info.get("pid", -1)), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, OverflowError):
            pass
    return time.time() - float(info.get("time", 0)) > LEASE_SECONDS


def _lease_body(run_id: str, since: str) -> bytes:
    return json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "time": time.time(), "run": run_id}
    ).encode()


@contextlib.contextmanager
def lease(store: Store, run_id: str, log: Log) -> Iterator[None]:
    """Hold the URL's run lease for the duration (see the module docstring)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    if not store.create(LEASE_FILE, _lease_body(run_id, since)):
        found = store.etag(LEASE_FILE)
        info = _lease_info(found[0]) if found else {}
        if found is not None and not _lease_is_dead(info):
            raise TokshardError(
                f"another `tokshard prepare` ({_holder_text(info)}) is running on {store.url}; wait for "
                f"it to finish or stop it, then rerun (a lease not renewed for {LEASE_SECONDS:.0f} s "
                f"expires: its object is {store.where(LEASE_FILE)})"
            )
        took = (
            store.replace_if(LEASE_FILE, _lease_body(run_id, since), found[1])
            if found
            else store.create(LEASE_FILE, _lease_body(run_id, since))
        )
        if not took:
            raise TokshardError(
                f"another `tokshard prepare` took over {store.url} just now; wait for it, then rerun"
            )
        if found:
            log(f"took over the lease of a dead run ({_holder_text(info)})")
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(store, run_id, since, stop, log), daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=LEASE_RENEW)
        with contextlib.suppress(TokshardError):
            current = store.read_bytes(LEASE_FILE)
            if current is not None and _lease_info(current).get("run") == run_id:
                store.delete(LEASE_FILE)


def _renew(store: Store, run_id: str, since: str, stop: threading.Event, log: Log) -> None:
    while not stop.wait(LEASE_RENEW):
        try:
            found = store.etag(LEASE_FILE)
            if found is None or _lease_info(found[0]).get("run") != run_id:
                log(f"lost the lease on {store.url} to another prepare; stop this one")
                return
            store.replace_if(LEASE_FILE, _lease_body(run_id, since), found[1])
        except TokshardError as exc:  # a blip: the next renewal tries again
            log(f"could not renew the lease on {store.url}: {exc}")


# --- the driver ------------------------------------------------------------------------------


def prepare_in_store(recipe: Recipe, url: str, options: Any, log: Log) -> str:
    """`pipeline.run.driver.prepare` for a store URL; returns the manifest's URL."""
    if protocol(url) in READ_ONLY_PROTOCOLS:
        raise TokshardError(
            f"--out {url}: {protocol(url)}:// cannot be written to; "
            "give a folder or a store URL such as s3://BUCKET/PATH"
        )
    run = StoreRun(url)
    run.store.check_reachable()
    run_id = uuid.uuid4().hex[:12]
    with lease(run.store, run_id, log), tempfile.TemporaryDirectory(prefix="tokshard-driver-") as staging:
        local = Path(staging)
        settings = recipe.settings
        src, tok = check_cache.resolve_tokenizer(settings.tokenizer, settings.eos_token, settings.dtype)
        recipe.pin_tokenizer(tok)
        plan = run.load_plan()
        if plan is None:
            plan = runner.make_plan(recipe, tok, log)
            run.save_plan(plan)
        else:
            runner.check_same_recipe(plan, recipe, run.url)
        local_tok = tokenizer.install(src, tok, local)
        _upload_tokenizer(run.store, local_tok, tok.sha256)
        doc = run.manifest_doc()
        manifest_url = join(run.url, manifest_mod.MANIFEST_NAME)
        if doc is not None and doc.get("recipe_hash") == plan.identity_hash:
            log(f"{run.url} is already complete ({manifest_url}); nothing to do")
            return manifest_url
        checkpoints = run.load_all(plan)
        todo = [p for p in plan.partitions if not (checkpoints[p.key] and checkpoints[p.key].complete)]
        # where this machine's workers keep the tokenizer: the warm-up and the tasks share it
        worker_tok = _local_tokenizer(run.store, tok.sha256)
        early = runner._early_workers(options, settings.threads) if todo else None
        try:
            encoder, reason = runner.choose_while_warming(
                early,
                settings.encoder,
                lambda name: _worker_encoder_args(worker_tok, plan, name, settings.threads),
                str(local_tok),
                lambda: runner._samples(plan, recipe),
                warm_up,
            )
            log(f"encoder: {encoder} ({reason})")
            if todo:
                done = len(plan.partitions) - len(todo)
                log(f"{len(plan.partitions)} partitions: {done} done, {len(todo)} to do")
                args = _worker_encoder_args(worker_tok, plan, encoder, settings.threads)
                tok_url = join(run.url, tokenizer.TOKENIZER_FILE)
                tasks = [
                    dataclasses.replace(
                        runner._task(recipe, local, plan, p, run_id, args),
                        out=run.url,
                        tokenizer_path=tok_url,
                    )
                    for p in todo
                ]
                runner._run(
                    tasks,
                    todo,
                    checkpoints,
                    plan,
                    local,
                    options,
                    log,
                    early,
                    lambda p: None,
                    run_partition_in_store,
                )
        finally:
            if early is not None:
                early.discard()
        finished = _finished_checkpoints(run, plan)
        doc = runner.manifest_doc(recipe, plan, finished, encoder, reason, settings.threads, str(local_tok))
        run.store.write_bytes(manifest_mod.MANIFEST_NAME, json_bytes(manifest_mod.sealed(doc)))
        log(f"wrote {manifest_url}")
        return manifest_url


def _worker_encoder_args(worker_tok: Path, plan: Plan, encoder: str, threads: int) -> tuple[Any, ...]:
    """`runner._encoder_args` with the tokenizer where a worker keeps its copy of it."""
    versions = library_versions() if encoder != "tokenizers" else ()
    return (encoder, str(worker_tok), plan.tokenizer["sha256"], threads, versions)


def warm_up(*encoder_args: Any) -> None:
    """`pipeline.run.worker_task.warm_up` on a worker that already has the tokenizer (this machine's)."""
    if Path(encoder_args[1]).is_file():
        build(*encoder_args)


def _upload_tokenizer(store: Store, local: Path, sha256: str) -> None:
    existing = store.read_bytes(tokenizer.TOKENIZER_FILE)
    if existing is None or hashlib.sha256(existing).hexdigest() != sha256:
        store.upload(local, tokenizer.TOKENIZER_FILE)


def _finished_checkpoints(run: StoreRun, plan: Plan) -> list[Checkpoint]:
    """Every partition's final checkpoint, after checking each shard it lists is stored whole."""
    sizes: dict[str, int] = {}
    for folder in {str(Path(p.stem).parent) for p in plan.partitions}:
        sizes.update(run.store.list(folder))
    finished = []
    for part in plan.partitions:
        ck = run.load_checkpoint(part)
        if ck is None or not ck.complete:
            raise TokshardError(f"partition {part.key} did not finish; rerun to resume")
        for rec in ck.closed:
            idx = rec.path[: -len(".bin")] + ".idx"
            if sizes.get(rec.path) != rec.bytes or idx not in sizes:
                raise TokshardError(
                    f"{run.store.where(rec.path)}: a finished shard is missing or of the wrong size; "
                    f"delete {run.store.where(run.checkpoint_rel(part))} and rerun to redo its partition"
                )
        finished.append(ck)
    return finished


# --- the worker ------------------------------------------------------------------------------

_SCRATCH = "tokshard-scratch"


def run_partition_in_store(task: Any) -> Checkpoint:
    """Encode one partition locally, upload its shards, then record it (see the docstring)."""
    run = StoreRun(task.out)
    part = task.partition
    scratch = _new_scratch()
    try:
        local_task = dataclasses.replace(
            task,
            out=str(scratch),
            tokenizer_path=str(_local_tokenizer(run.store, task.tokenizer_sha256)),
            run_id=None,
        )
        try:
            ck = run_partition(local_task)
        except DiskFullError as exc:
            raise TokshardError(
                f"worker scratch space is full ({exc.path}); give the workers more local disk "
                "(TMPDIR), then rerun: finished partitions are kept"
            ) from None
        lease_now = run.store.read_bytes(LEASE_FILE)
        if task.run_id and lease_now is not None and _lease_info(lease_now).get("run") != task.run_id:
            raise Superseded(f"partition {part.key}: a newer prepare took over {run.url}; not recording it")
        for rec in ck.closed:
            rel = rec.path
            run.store.upload(scratch / (rel[: -len(".bin")] + ".idx"), rel[: -len(".bin")] + ".idx")
            run.store.upload(scratch / rel, rel)
        run.store.write_bytes(run.checkpoint_rel(part), json_bytes(ck.to_json()))
        return ck
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _scratch_root() -> Path:
    return Path(tempfile.gettempdir()) / _SCRATCH


def _new_scratch() -> Path:
    """A private local folder for one attempt; folders of dead processes are removed first."""
    root = _scratch_root()
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*-*"):
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _local_tokenizer(store: Store, sha256: str) -> Path:
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


# --- verify ----------------------------------------------------------------------------------


def manifest_url(url: str) -> str:
    """A manifest URL, or the URL of the folder holding one."""
    return url if url.endswith(".json") else join(url, manifest_mod.MANIFEST_NAME)


def verify_in_store(url: str, on_shard: Callable[[int, int], None] | None = None) -> tuple[list[str], dict]:
    """`pipeline.format.verify.verify` for a manifest URL: each shard is downloaded to a temporary
    folder, checked like a local one, and deleted (so the disk needs room for one shard)."""

    murl = manifest_url(url)
    store = Store(parent(murl))
    store.check_reachable()
    name = murl.rsplit("/", 1)[1]
    data = store.read_bytes(name)
    if data is None:
        raise TokshardError(
            f"no manifest at {murl} (is `tokshard prepare` still running? `tokshard status URL` tells)"
        )
    with tempfile.TemporaryDirectory(prefix="tokshard-verify-") as tmp:
        local = Path(tmp)
        (local / manifest_mod.MANIFEST_NAME).write_bytes(data)
        try:
            m = manifest_mod.load(local / manifest_mod.MANIFEST_NAME)
        except TokshardError as exc:
            raise VerifyError(str(exc).replace(str(local / manifest_mod.MANIFEST_NAME), murl)) from exc
        faults: list[str] = []
        if not m.checksum_ok():
            faults.append(f"{murl}: manifest was edited after prepare wrote it (checksum mismatch)")
        tok = store.read_bytes(m.data["tokenizer"]["path"])
        if tok is None or hashlib.sha256(tok).hexdigest() != m.data["tokenizer"]["sha256"]:
            faults.append(f"{store.where(m.data['tokenizer']['path'])}: tokenizer missing or changed")
        shard_faults, totals = check_shards(
            m, murl, lambda entry: _check_stored_shard(store, entry, m), on_shard
        )
    return faults + shard_faults, totals


def _check_stored_shard(store: Store, entry: manifest_mod.ShardEntry, m: manifest_mod.Manifest) -> list[str]:
    idx_rel = entry.rel_path[: -len(".bin")] + ".idx"
    for rel, local in ((entry.rel_path, entry.bin_path), (idx_rel, entry.idx_path)):
        if not store.exists(rel):
            return [f"{entry.rel_path}: {Path(rel).name} is missing"]
        local.parent.mkdir(parents=True, exist_ok=True)
        store.download(rel, local)
    try:
        return check_shard(entry, m.dtype, m.eos_id)
    finally:
        entry.bin_path.unlink(missing_ok=True)
        entry.idx_path.unlink(missing_ok=True)
