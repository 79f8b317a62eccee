"""The run's typed records, turned into JSON here and only here: `Plan`, `Checkpoint`, `Holder`.

They cross process and machine boundaries (a Dask worker returns a checkpoint, a rerun reads
the plan, `status` reads who holds a run), and read the same from a local folder's run state
and from a store's. Parsing failures become one-line `TokshardError`s naming the file and what
to do.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pipeline.encoding.documents import LongProgress
from pipeline.format import field_types
from pipeline.format.atomic import json_bytes
from pipeline.format.errors import TokshardError
from pipeline.format.shard_writer import OpenShard, ShardRecord
from pipeline.sources import SOURCE_TYPES
from pipeline.sources.base import Partition, Source

#: 2: a files partition's pieces name their files by index into the origin's entries;
#: a plan of version 1 (pieces written whole) still reads
PLAN_VERSION = 2
READ_PLAN_VERSIONS = (1, 2)


@dataclass
class Plan:
    """Fixed at a folder's first run; every rerun follows it (pinned revisions, partitions)."""

    identity: dict[str, Any]
    identity_hash: str
    recipe: dict[str, Any]
    tokenizer: dict[str, Any]
    origins: dict[str, dict[str, Any]]
    splits: dict[str, list[str]]
    partitions: list[Partition]
    version: int = PLAN_VERSION

    def to_json(self) -> dict[str, Any]:
        """The plan as run.json holds it: its fields as they are (plain data already; a deep
        copy of 100,000 files' entries would cost more than writing them), each partition's
        spec as its source writes it beside its origin (`Source.specs_json`)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        specs: list[dict[str, Any] | None] = [None] * len(self.partitions)
        for name, indexes in self._by_source().items():
            written = self._source_type(name).specs_json(
                [self.partitions[i] for i in indexes], self.origins[name]
            )
            for i, spec in zip(indexes, written, strict=True):
                specs[i] = spec
        d["partitions"] = [
            {**p.to_json(), "spec": spec} for p, spec in zip(self.partitions, specs, strict=True)
        ]
        d["version"] = PLAN_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        written = [Partition.from_json(p) for p in d["partitions"]]
        plan = cls(**{**d, "partitions": written})
        for name, indexes in plan._by_source().items():
            specs = plan._source_type(name).specs_of_json(
                [(written[i].split, written[i].spec) for i in indexes], plan.origins[name]
            )
            for i, spec in zip(indexes, specs, strict=True):
                written[i] = replace(written[i], spec=spec)
        return plan

    def _by_source(self) -> dict[str, list[int]]:
        """Each source's partitions, by their places in the plan."""
        found: dict[str, list[int]] = {}
        for i, p in enumerate(self.partitions):
            found.setdefault(p.source, []).append(i)
        return found

    def _source_type(self, name: str) -> type[Source]:
        return SOURCE_TYPES[self.recipe["sources"][name]["type"]]

    @classmethod
    def parse(cls, data: bytes, where: str, out: str) -> Plan:
        """The plan file's bytes as a `Plan` (``where``: the file, ``out``: its run's folder)."""
        try:
            d = json.loads(data)
            if d.get("version") not in READ_PLAN_VERSIONS:
                raise TokshardError(f"{where}: made by another tokshard version; use a new --out")
            return cls.from_json(d)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            raise TokshardError(
                f"{where}: unreadable run plan ({exc}); use a new --out or delete {out}"
            ) from exc


@dataclass
class Checkpoint:
    """A partition's progress at its last commit point."""

    key: str
    complete: bool = False
    cursor: dict[str, Any] | None = None
    documents: int = 0
    tokens: int = 0
    dropped_empty: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    #: documents the encoder sent to the reference (fastokens' routed class)
    routed: int = 0
    progress: int = 0
    closed: list[ShardRecord] = field(default_factory=list)
    open: OpenShard | None = None
    updated: float = 0.0
    busy_seconds: float = 0.0
    #: of which spent making work durable (fsyncs, checkpoints, renames): the price of commits
    commit_time: float = 0.0
    #: progress inside the long document that starts at ``cursor``
    long: LongProgress | None = None
    #: where each later attempt picked up: {"progress", "tokens", "long_chars", "time"}
    resumed_from: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holds_work(self) -> bool:
        """Whether anything was read or written by its last commit (a partition stopped at its
        first record commits a checkpoint that holds none)."""
        done = (self.documents, self.tokens, self.progress, self.dropped_empty, self.skipped, self.closed)
        return self.complete or any(done)

    def to_json(self) -> dict[str, Any]:
        """The checkpoint file's content (the one place its records become plain data)."""
        return asdict(self)

    def to_bytes(self) -> bytes:
        return json_bytes(self.to_json())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        """The inverse of `to_json` (the one place plain data become its records again)."""
        data = field_types.check(cls, data)
        return cls(
            **{
                **data,
                "closed": [ShardRecord(**field_types.check(ShardRecord, r)) for r in data.get("closed", [])],
                "open": OpenShard(**field_types.check(OpenShard, data["open"])) if data.get("open") else None,
                "long": LongProgress(**field_types.check(LongProgress, data["long"]))
                if data.get("long")
                else None,
            }
        )

    @classmethod
    def parse(cls, data: bytes, part: Partition, where: str) -> Checkpoint:
        """A checkpoint file's bytes as the checkpoint of ``part`` (``where``: the file)."""
        try:
            d = json.loads(data)
        except ValueError as exc:
            raise TokshardError(
                f"{where}: unreadable checkpoint ({exc}); delete it to redo that partition"
            ) from exc
        key = d.get("key") if isinstance(d, dict) else None
        if key != part.key:
            raise TokshardError(f"{where}: checkpoint is for {key!r}, not {part.key!r}; use a new --out")
        try:
            return cls.from_json(d)
        except (TypeError, ValueError) as exc:
            raise TokshardError(
                f"{where}: unreadable checkpoint ({exc}); delete it to redo that partition"
            ) from exc


@dataclass(frozen=True)
class Holder:
    """Who holds a run (its lock in a folder, its lease in a store) and how it is going.

    Written by the holder when it takes the run and again as it goes on (``time``: the last
    write; ``tokens_per_s`` and ``eta_s``: the driver's own measure), read by `tokshard status`
    and by a second `prepare` that is refused or takes over a dead run's lease.
    """

    pid: int | None = None
    host: str | None = None
    since: str | None = None
    started: float | None = None
    time: float | None = None
    run: str | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    #: the holder's PID namespace (`pid_namespace`): its ``pid`` means that process only to a
    #: process in the same one (two containers on one host name each have their own pids);
    #: None in a record of an older version, or from a host without /proc
    pid_ns: int | None = None

    @classmethod
    def of_this_process(cls, run_id: str | None) -> Holder:
        now = time.time()
        return cls(
            pid=os.getpid(),
            pid_ns=pid_namespace(),
            host=socket.gethostname(),
            since=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
            started=now,
            time=now,
            run=run_id,
        )

    def updated(self, **changes: Any) -> Holder:
        """This record written again now, with ``changes``."""
        return replace(self, time=time.time(), **changes)

    def to_bytes(self) -> bytes:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}).encode()

    @classmethod
    def parse(cls, data: bytes | str) -> Holder | None:
        """The record in a lock or lease file (None: empty or unreadable, as while it is rewritten)."""
        try:
            d = json.loads(data or "{}")
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(d, dict) or not d:
            return None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in known})
        except TypeError:
            return None

    def text(self) -> str:
        """How messages name the holder: ``pid 123 on host since 2024-05-01 10:00:00``."""
        parts = []
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        if self.host:
            parts.append(f"on {self.host}")
        if self.since:
            parts.append(f"since {self.since}")
        return " ".join(parts) or "another process"

    def age(self, signed: bool = False) -> float | None:
        """Seconds since the holder last wrote its record, by this host's clock (None if it never
        said when; below zero only if ``signed``: a holder whose clock runs ahead of this one's)."""
        if self.time is None:
            return None
        age = time.time() - float(self.time)
        return age if signed else max(0.0, age)


def pid_namespace() -> int | None:
    """This process's PID namespace, as the inode of /proc/self/ns/pid (Linux; None where there
    is none to read): what tells apart two processes of one host name with their own pids (a
    container on the host's network, a Kubernetes pod with hostNetwork)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def holder_text(holder: Holder | None) -> str:
    """`Holder.text`, also for a holder whose record could not be read."""
    return (holder or Holder()).text()
