"""The run lease in an object store: when the two hosts' clocks disagree, a lease from another
host is judged by whether it is renewed, timed on this host's own clock, not by the time its
holder wrote into it; and of several reruns that find one dead lease, one takes it (a real S3
API server, as in test_store_prepare.py; the lease's own conditions also against a GCS JSON API
server that keeps GCS's preconditions, tests/gcs_preconditions.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from support import gcs_emulator

from pipeline.format.errors import TokshardError
from pipeline.run.records import Holder, pid_namespace
from pipeline.run.store_state import LEASE_FILE, LEASE_WATCH, lease, lease_is_dead
from pipeline.storage.object_store import ObjectStore


def _record(run: str, clock_offset: float) -> bytes:
    """A lease record as a driver on host ``far`` writes it, its clock ``clock_offset`` s off ours."""
    return json.dumps(
        {"pid": 7, "host": "far", "since": "then", "time": time.time() + clock_offset, "run": run}
    ).encode()


@pytest.fixture(scope="module")
def gcs_server():
    pytest.importorskip("gcsfs")
    with gcs_emulator(preconditions=True) as server:
        yield server


@pytest.fixture
def store(request) -> ObjectStore:
    """A fresh run folder in S3, or (``gs`` by indirect parametrization) in GCS."""
    if getattr(request, "param", "s3") == "gs":
        return ObjectStore(f"gs://{request.getfixturevalue('gcs_server').new_bucket()}/run")
    return ObjectStore(f"s3://{request.getfixturevalue('s3_server').new_bucket()}/run")


#: the tests of what a store's conditional create decides, run on both stores (those that
#: watch a lease for its whole LEASE_WATCH run on S3 alone)
BOTH_STORES = pytest.mark.parametrize("store", ["s3", "gs"], indirect=True)


def test_a_live_lease_from_a_host_whose_clock_runs_behind_is_not_taken(store):
    """Its record says it was last renewed ten minutes ago; it is renewed meanwhile, so the
    second prepare is refused in one line that names the clocks (before: taken over at once)."""
    assert store.create(LEASE_FILE, _record("live", -600))
    stop = threading.Event()

    def renew() -> None:  # the live driver on `far`, renewing as `Lease` does
        while not stop.wait(2.0):
            store.write_bytes(LEASE_FILE, _record("live", -600))

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    said: list[str] = []
    try:
        with pytest.raises(TokshardError) as refused, lease(store, "second", said.append):
            pytest.fail("took a live lease")
    finally:
        stop.set()
        renewer.join()
    assert "another `tokshard prepare` (pid 7 on far since then) is running" in str(refused.value)
    assert "the two hosts' clocks differ" in str(refused.value)
    assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "live"
    assert [m for m in said if "watching it" in m], said


def test_a_dead_lease_from_a_host_whose_clock_runs_ahead_is_taken_over(store):
    """Its record says it was written an hour from now, so by the record it would block every
    rerun for an hour; unrenewed for the watch, it is taken over."""
    assert store.create(LEASE_FILE, _record("dead", +3600))
    said: list[str] = []
    started = time.monotonic()
    with lease(store, "rerun", said.append):
        assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "rerun"
    assert time.monotonic() - started >= LEASE_WATCH
    assert any(m.startswith("took over the lease of a dead run (pid 7 on far since then") for m in said), said


@BOTH_STORES
def test_a_lease_from_another_host_that_looks_fresh_is_refused_at_once(store):
    """Within the record's window (and a few seconds either side) there is nothing to watch."""
    assert store.create(LEASE_FILE, _record("live", +3))
    said: list[str] = []
    with (
        pytest.raises(TokshardError, match=rf"is running on {store.url}"),
        lease(store, "second", said.append),
    ):
        pytest.fail("took a fresh lease")
    assert not [m for m in said if "watching it" in m], said


@BOTH_STORES
def test_a_lease_deleted_while_watched_is_created_anew(store):
    """The run on the other host finished during the watch (it deletes its lease at its end):
    this one starts."""
    assert store.create(LEASE_FILE, _record("ending", -600))
    timer = threading.Timer(2.0, store.delete, args=(LEASE_FILE,))
    timer.start()
    said: list[str] = []
    with lease(store, "next", said.append):
        assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "next"
    timer.join()
    assert not [m for m in said if "took over" in m], said


def _dead_here(**record) -> bytes:
    """The lease a killed `prepare` on this host (and in this PID namespace) left: its pid is
    gone, its time is now; ``record``: what differs (None: left out)."""
    fields = {
        "pid": 2**22 + 12335,
        "pid_ns": pid_namespace(),
        "host": socket.gethostname(),
        "since": "then",
        "time": time.time(),
        "run": "dead",
        **record,
    }
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


@pytest.mark.skipif(pid_namespace() is None, reason="no /proc/self/ns/pid to tell PID namespaces apart")
@pytest.mark.parametrize("namespace", ["another", "unsaid"])
def test_a_fresh_lease_of_this_host_name_whose_pid_is_in_another_namespace_is_not_taken(store, namespace):
    """A second prepare in another container of the same host name (docker --network host,
    a Kubernetes pod with hostNetwork) found no such pid and took a lease renewed just now
    over: a pid is looked up only in the namespace it was recorded in; a record that does
    not say its namespace (an older version's) is judged by its age, as another host's."""
    record = _dead_here(pid_ns=pid_namespace() + 1 if namespace == "another" else None)
    assert store.create(LEASE_FILE, record)
    assert not lease_is_dead(Holder.parse(record))  # status: running
    refused = pytest.raises(TokshardError, match=r"another `tokshard prepare` \(pid 4206639 on ")
    with refused, lease(store, "second", lambda m: None):
        pass
    assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "dead"
    assert lease_is_dead(Holder.parse(_dead_here()))  # in this namespace the pid says it is gone


@BOTH_STORES
def test_of_reruns_that_find_one_dead_lease_at_once_exactly_one_takes_it(store):
    """The takeover creates a claim named after the dead lease's version, which only one
    contender can create; the others are refused in one line and the winner keeps the lease."""
    assert store.create(LEASE_FILE, _dead_here())
    start, outcomes = threading.Barrier(4), []
    release = threading.Event()

    def rerun(i: int) -> None:
        start.wait()
        try:
            with lease(store, f"rerun-{i}", lambda m: None):
                outcomes.append(f"rerun-{i}")
                release.wait(10)
        except TokshardError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=rerun, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(outcomes) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    holders = [o for o in outcomes if o.startswith("rerun-")]
    held = json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"]
    release.set()
    for t in threads:
        t.join()
    assert len(holders) == 1, outcomes
    assert held == holders[0]
    assert all("took over" in o or "is running" in o for o in outcomes if o not in holders), outcomes


def test_the_lease_asks_the_store_for_no_condition_but_create_only(store):
    """S3's If-Match has no counterpart in every store's client (gcsfs takes none): the
    takeover and the renewals use only a create that fails where an object is, which S3
    (If-None-Match) and GCS (ifGenerationMatch=0) both have."""
    sent: list[dict] = []
    record = lambda event_name, params, **_: (  # noqa: E731
        sent.append(dict(params.get("headers", {}))) if event_name.endswith(".PutObject") else None
    )
    assert store.create(LEASE_FILE, _dead_here())
    events = store.fs.s3.meta.events  # the store's own client (opened past fsspec's caches)
    events.register("before-call", record)
    try:
        with lease(store, "rerun", lambda m: None) as held:
            held.report(1000.0, None)  # the first rate is written at once: a renewal
            deadline = time.monotonic() + 10
            while b"tokens_per_s" not in (store.read_bytes(LEASE_FILE) or b""):
                assert time.monotonic() < deadline, "the renewal was never written"
                time.sleep(0.1)
    finally:
        events.unregister("before-call", record)
    assert len(sent) >= 4  # the claim, the lease, the probe, a renewal
    assert not [h for h in sent if "If-Match" in h], sent


@pytest.mark.skipif(pid_namespace() is None, reason="no /proc/self/ns/pid to tell PID namespaces apart")
def test_a_scratch_folder_of_another_pid_namespace_is_not_cleaned_as_a_dead_process(tmp_path, monkeypatch):
    """Scratch folders are named PID.NAMESPACE-: one of a container sharing this /tmp holds a
    pid that is none of ours, and is left alone; a dead pid of this namespace's (or an older
    version's folder, which says none) is cleaned."""
    from pipeline.run import store_state

    monkeypatch.setattr(store_state, "_scratch_root", lambda: tmp_path)
    dead, ns = 2**22 + 12335, pid_namespace()
    for name in (f"{dead}.{ns + 1}-other", f"{dead}.{ns}-mine", f"{dead}-older"):
        (tmp_path / name).mkdir()
    made = store_state._new_scratch()
    assert made.name.startswith(f"{os.getpid()}.{ns}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{dead}.{ns + 1}-other", made.name])
