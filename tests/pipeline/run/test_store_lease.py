"""The run lease in an object store: when the two hosts' clocks disagree, a lease from another
host is judged by whether it is renewed, timed on this host's own clock, not by the time its
holder wrote into it; and of several reruns that find one dead lease, one takes it (a real S3
API server, as in test_store_prepare.py; the lease's own conditions also against a GCS JSON API
server that keeps GCS's preconditions, tests/gcs_preconditions.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from faulty_store import faults_given, faulty_store
from support import gcs_emulator

from pipeline.format.errors import TokshardError
from pipeline.run.records import Holder, pid_namespace
from pipeline.run.store_state import CLAIMS_DIR, LEASE_FILE, LEASE_WATCH, claim_of, lease, lease_is_dead
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


@contextlib.contextmanager
def _losing_one_answer(s3_server, monkeypatch, request: str) -> Iterator[tuple[ObjectStore, str]]:
    """A fresh run folder reached through a proxy that passes the first request matching
    ``request`` (a pattern on ``METHOD PATH``) on to the store and loses its answer; and the
    proxy's endpoint."""
    from s3fs import S3FileSystem

    bucket = s3_server.new_bucket()
    with faulty_store(s3_server.endpoint, every=0, lose_answer_to=request) as endpoint:
        S3FileSystem.clear_instance_cache()  # the one made for the server itself
        try:
            with monkeypatch.context() as env:
                env.setenv("AWS_ENDPOINT_URL", endpoint)
                yield ObjectStore(f"s3://{bucket}/run"), endpoint
        finally:
            S3FileSystem.clear_instance_cache()


def test_a_lease_whose_create_lost_its_answer_is_held_by_its_own_run(s3_server, monkeypatch):
    """The create reached the store, its answer did not: the client tried it again and was told
    a lease is there. The run refused itself ("another `tokshard prepare` (pid <its own>) is
    running") and left its lease behind; it reads the lease back and knows its own record."""
    said: list[str] = []
    with _losing_one_answer(s3_server, monkeypatch, r"^PUT .*/\.tokshard/lease\.json$") as (store, endpoint):
        with lease(store, "first", said.append):
            assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "first"
        assert faults_given(endpoint) == 1
        assert store.read_bytes(LEASE_FILE) is None  # deleted at the end, as any run's
    assert said == [], said  # nor taken for a store that ignores conditional writes


def test_a_claim_whose_create_lost_its_answer_takes_the_dead_lease_over(s3_server, monkeypatch):
    """The rerun after a kill -9 creates the claim on the dead lease, and loses the answer: it
    was refused as "another `tokshard prepare` took over ... just now", and so was every rerun
    after it, for good (the claim stayed). It reads the claim back and knows its own record."""
    said: list[str] = []
    with _losing_one_answer(s3_server, monkeypatch, r"^PUT .*/\.tokshard/claims/") as (store, endpoint):
        assert store.create(LEASE_FILE, _dead_here())
        with lease(store, "rerun", said.append):
            assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "rerun"
        assert faults_given(endpoint) == 1
    assert any(m.startswith("took over the lease of a dead run") for m in said), said


def _claimed_by(store: ObjectStore, taker: bytes) -> bytes:
    """A dead run's lease, and a rerun's claim on it (``taker``: its record) that never got as
    far as rewriting the lease: the lease's record."""
    assert store.create(LEASE_FILE, _dead_here())
    found = store.etag(LEASE_FILE)
    assert found is not None and store.create(claim_of(found), taker)
    return found[0]


def test_a_claim_whose_taker_died_before_it_rewrote_the_lease_is_taken_over(store):
    """A kill -9 between the claim and the lease's rewrite: every later rerun was refused as
    "another `tokshard prepare` took over ... just now", for good, while `status` said nothing
    runs. The claim's taker is judged as a lease's holder (here: its pid is gone)."""
    _claimed_by(store, _dead_here(run="killed-taker"))
    said: list[str] = []
    with lease(store, "rerun", said.append):
        assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "rerun"
    assert any(m.startswith("took over the lease of a dead run") for m in said), said
    assert len(store.list(CLAIMS_DIR)) == 2  # the dead taker's, and this rerun's on it


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_claim_whose_taker_may_still_run_is_not_taken(store, where):
    """A claim just made, by a live process of this host or a record from another host that
    looks fresh, is a rerun between its two writes: it is not taken, the lease is left as it was."""
    if where == "this host":
        taker = _dead_here(pid=os.getpid(), run="taking")
    else:
        taker = _record("taking", 0)
    dead = _claimed_by(store, taker)
    refused = pytest.raises(  # the claim's taker and the claim named: it blocks until its taker ends
        TokshardError,
        match=rf"another `tokshard prepare` \(pid \d+ on [^,]+, by its claim {re.escape(store.url)}/"
        rf"\.tokshard/claims/\w+\.json\) took over {re.escape(store.url)} just now",
    )
    with refused, lease(store, "rerun", lambda m: None):
        pytest.fail("took a claimed lease")
    assert store.read_bytes(LEASE_FILE) == dead
    assert len(store.list(CLAIMS_DIR)) == 1


def test_a_claim_from_another_host_whose_taker_rewrites_the_lease_while_watched_is_not_taken(store):
    """A claim from another host whose record looks stale (that host's clock runs behind) is
    watched like a lease: its taker rewrites the lease meanwhile, so it runs, and this rerun is
    refused."""
    _claimed_by(store, _record("taking", -600))
    timer = threading.Timer(2.0, store.write_bytes, args=(LEASE_FILE, _record("taking", -600)))
    timer.start()
    said: list[str] = []
    try:
        with (
            pytest.raises(TokshardError, match=rf"took over {store.url} just now"),
            lease(store, "rerun", said.append),
        ):
            pytest.fail("took a lease another host's rerun was taking")
    finally:
        timer.join()
    assert json.loads(store.read_bytes(LEASE_FILE) or b"{}")["run"] == "taking"
    assert [m for m in said if "was claimed by pid 7 on far" in m and "watching it" in m], said
