"""`prepare`, `status`, `verify` and `inspect` with an s3:// URL, against a real S3 API server
(moto_server on 127.0.0.1, started by the tests): every request travels over HTTP."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
from faulty_store import FAULTS, faults_given, faulty_store
from support import (
    REPO,
    alive,
    assert_same_as_local,
    cli,
    dask_worker_pids,
    free_port,
    kill_group,
    moto_server,
    start_prepare,
    train_tokenizer_json,
    web_folder,
    write_jsonl,
)

from pipeline.format import manifest
from pipeline.run.records import pid_namespace
from pipeline.run.store_state import LEASE_FILE, lease
from pipeline.storage.object_store import ObjectStore

#: one round of each kind of kill (the whole machine, the driver alone), in a random order and
#: at random moments: the seed picks when, not whether each kind is tried
KILL_KINDS = ("machine", "driver")


def test_prepare_to_s3_gives_the_bytes_of_a_local_run_and_status_verify_inspect_read_it(
    s3_server, store_setup, tmp_path
):
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    done = cli("prepare", str(recipe), "--out", url, "--workers", "2", cwd=tmp_path, check=True)
    assert done.stdout.startswith(f"{url}/manifest.json: ")
    assert "conditional writes" not in done.stderr  # the server keeps them: its lease is exclusive
    assert_same_as_local(s3_server, bucket, "run", ref)
    assert list(tmp_path.iterdir()) == [], "a URL made a local folder"
    status = cli("status", url, cwd=tmp_path, check=True).stdout
    assert "7 done, 0 partial, 0 pending" in status and "running: no" in status
    of_the_manifest = cli("status", f"{url}/manifest.json", cwd=tmp_path, check=True).stdout
    assert of_the_manifest == status  # the folder it is in, as verify and inspect take it
    verified = cli("verify", f"{url}/manifest.json", cwd=tmp_path, check=True).stdout
    assert verified.startswith("OK: ")
    inspected = cli("inspect", url, "--json", cwd=tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "c")})
    report = json.loads(inspected.stdout)
    assert (
        report["manifest"] == url
        and report["totals"] == json.loads((ref / "manifest.json").read_text())["totals"]
    )
    assert not (tmp_path / "s3:").exists()


@pytest.fixture
def served(store_setup):
    """The local run's folder served by a plain web server (no listing API, no byte ranges)."""
    _, ref = store_setup
    with web_folder(ref.parent) as url:
        yield f"{url}/{ref.name}"


def test_a_manifest_served_over_http_is_verified_and_status_there_is_refused_in_one_line(served, tmp_path):
    """verify, inspect and train read a manifest by URL; a web server's URL, which has no
    bucket, was "store error ... InvalidUrlClientError: http://". status reads a run's state,
    which prepare never writes to a web server."""
    assert cli("verify", f"{served}/manifest.json", cwd=tmp_path, check=True).stdout.startswith("OK: ")
    proc = cli("status", served, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        "a prepare keeps its run's state in a folder or an object store, never at a http:// URL"
        in proc.stderr
    )


def test_prepare_through_a_store_that_fails_every_few_requests_gives_the_bytes_of_a_local_run(
    s3_server, store_setup, tmp_path
):
    """Throttling (503 SlowDown), a 500 and a dropped connection, in turn on every 16th request:
    the store client's retries carry the run through, and its output is the local run's."""
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    with faulty_store(s3_server.endpoint, every=16) as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint}
        cli("prepare", str(recipe), "--out", f"s3://{bucket}/run", cwd=tmp_path, env=env, check=True)
        assert cli("verify", f"s3://{bucket}/run", cwd=tmp_path, env=env, check=True).stdout.startswith(
            "OK: "
        )
        assert faults_given(endpoint) >= len(FAULTS)
    assert_same_as_local(s3_server, bucket, "run", ref)


def test_a_store_that_ignores_conditional_writes_is_named_and_the_run_is_exact(
    s3_server, store_setup, tmp_path
):
    """Some S3-compatible stores ignore If-None-Match (every create succeeds), so the lease
    cannot keep a second prepare out: the run says so, and its output is still the local run's."""
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    with faulty_store(s3_server.endpoint, every=0, ignore_conditions=True) as endpoint:
        done = cli(
            "prepare", str(recipe), "--out", url, cwd=tmp_path, env={"AWS_ENDPOINT_URL": endpoint}, check=True
        )
    warned = f"tokshard: {url}: this store ignores conditional writes (S3's If-None-Match, GCS's ifGenerationMatch), so a second"
    assert done.stderr.count(warned) == 1, done.stderr
    assert_same_as_local(s3_server, bucket, "run", ref)


@pytest.mark.parametrize("status", [501, 400])
def test_a_store_that_refuses_conditional_writes_is_named_in_one_line(
    s3_server, store_setup, tmp_path, status
):
    """Some S3 APIs answer If-None-Match with 501 NotImplemented (or a 400 saying a header
    "implies functionality that is not implemented"): the line quoted s3fs's
    "OSError: [Errno 38] ..." and said nothing of what to do."""
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    with faulty_store(s3_server.endpoint, every=0, reject_conditions=status) as endpoint:
        done = cli("prepare", str(recipe), "--out", url, cwd=tmp_path, env={"AWS_ENDPOINT_URL": endpoint})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"tokshard: error: {url}/.tokshard/lease.json: this store does not support conditional writes "
        "(S3's If-None-Match: *), which the lease"
    ), lines[0]
    assert "prepare into a local or shared folder" in lines[0] and "Errno" not in lines[0]
    assert not [k for k in s3_server.objects(bucket) if k.endswith("manifest.json")]


def test_a_conditional_write_the_store_denies_is_named_as_access_denied(s3_server, store_setup, tmp_path):
    """A key without write permission is answered 403 AccessDenied, whatever words the answer's
    message has (here those of a store that lacks conditions): the line said the store does not
    support conditional writes, and sent the user to another store."""
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    with faulty_store(s3_server.endpoint, every=0, reject_conditions=403) as endpoint:
        done = cli("prepare", str(recipe), "--out", url, cwd=tmp_path, env={"AWS_ENDPOINT_URL": endpoint})
    lines = done.stderr.strip().splitlines()
    assert done.returncode in (1, 2) and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tokshard: error: access denied to {url}/.tokshard/lease.json ("), lines[0]
    assert "check the credentials and the bucket's permissions" in lines[0]
    assert "conditional writes" not in lines[0]
    assert not [k for k in s3_server.objects(bucket) if k.endswith("manifest.json")]


def test_a_store_whose_listings_lag_its_writes_finishes_the_run_exactly(s3_server, store_setup, tmp_path):
    """Eventually consistent stores and caching gateways list an object only a while after it
    is written: here a minute, longer than the whole run. The run still finishes (before, it
    stopped at its end with "did not finish", every time), a rerun finds it complete, `status`
    sees all of it, and the bytes are the local run's."""
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    with faulty_store(s3_server.endpoint, every=0, list_lag=60) as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint}
        done = cli("prepare", str(recipe), "--out", url, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        again = cli("prepare", str(recipe), "--out", url, cwd=tmp_path, env=env, check=True)
        assert "is already complete" in again.stderr, again.stderr
        state = json.loads(cli("status", url, "--json", cwd=tmp_path, env=env, check=True).stdout)
        assert (state["complete"], state["progress"]) == (True, 1.0), state
    assert_same_as_local(s3_server, bucket, "run", ref)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_store_that_keeps_failing_is_one_line_that_says_so(s3_server, store_setup, tmp_path, fault):
    recipe, _ = store_setup
    url = f"s3://{s3_server.new_bucket()}/run"
    with faulty_store(s3_server.endpoint, every=1, faults=(fault,)) as endpoint:
        # one attempt, not botocore's default five: the line is the same, only sooner
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"}
        commands = [["prepare", str(recipe), "--out", url]] + ([["status", url]] if fault == "drop" else [])
        for args in commands:
            proc = cli(*args, cwd=tmp_path, env=env)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert re.fullmatch(
                rf"tokshard: error: the store kept failing on {url} after its client's retries \(.+\): "
                r"it is overloaded or down; try again later",
                proc.stderr.strip(),
            ), proc.stderr
    _no_local_folder(tmp_path)


def test_a_store_that_never_answers_is_named_in_one_line_in_bounded_time(s3_server, tmp_path):
    """A stopped server, or a proxy that swallows requests: each command waited six minutes and
    more (botocore's five tries of each of s3fs's five). Here each wait is 1 s (a user's
    FSSPEC_S3 setting, kept): botocore's two tries of s3fs's five take about 15 s with their
    pauses, where five of five took about a minute."""
    url = f"s3://{s3_server.new_bucket()}/run"
    with faulty_store(s3_server.endpoint, every=1, faults=("silence",)) as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint, "FSSPEC_S3": json.dumps({"config_kwargs": {"read_timeout": 1}})}
        started = time.monotonic()
        proc = cli("status", url, cwd=tmp_path, env=env, timeout=180)
        waited = time.monotonic() - started
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        f"tokshard: error: the store kept failing on {url} after its client's retries"
    )
    assert waited < 35, waited


def test_an_upper_case_scheme_is_the_same_store(s3_server, store_setup, tmp_path):
    """``S3://`` is ``s3://`` (URL schemes ignore case): never "protocol not installed", never a
    local folder."""
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    done = cli(
        "prepare", str(recipe), "--out", f"S3://{bucket}/up", "--workers", "1", cwd=tmp_path, check=True
    )
    assert done.stdout.startswith(f"s3://{bucket}/up/manifest.json: ")
    assert_same_as_local(s3_server, bucket, "up", ref)
    assert cli("verify", f"S3://{bucket}/up", cwd=tmp_path, check=True).stdout.startswith("OK: ")
    _no_local_folder(tmp_path)


def test_verify_of_a_url_finds_a_corrupted_object(s3_server, store_setup, tmp_path):
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    cli("prepare", str(recipe), "--out", url, "--workers", "1", check=True)
    s3 = s3_server.client()
    key = "run/text/train/00000-0000.bin"
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[100] ^= 1
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    idx_key = "run/text/train/00001-0000.idx"
    index = s3.get_object(Bucket=bucket, Key=idx_key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=idx_key, Body=index[:-8])  # cut short: named by its URL
    proc = cli("verify", url, cwd=tmp_path)
    assert proc.returncode == 1
    assert "FAULT text/train/00000-0000.bin: .bin content hash differs from the manifest" in proc.stdout
    assert f"FAULT text/train/00001-0000.bin: s3://{bucket}/{idx_key}: index is " in proc.stdout
    assert "tokshard-verify-" not in proc.stdout  # the temporary copy, deleted by then


def scratch_pids() -> set[int]:
    """Processes that have a partition in their local scratch folder right now."""
    import tempfile

    root = Path(tempfile.gettempdir()) / "tokshard-scratch"
    pids = (p.name.split("-", 1)[0].split(".", 1)[0] for p in root.glob("*-*"))  # PID.NAMESPACE-
    return {int(pid) for pid in pids if pid.isdigit()}


def test_sigkill_at_random_moments_then_rerun_gives_identical_bytes(s3_server, store_setup):
    recipe, ref = store_setup
    seed = int(os.environ.get("TOKSHARD_KILL_SEED", random.randrange(1 << 31)))
    print(f"TOKSHARD_KILL_SEED={seed}")
    rng = random.Random(seed)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    history = []
    for kind in rng.sample(KILL_KINDS, len(KILL_KINDS)):
        proc = start_prepare(recipe, url, "--workers", "2")
        delay = rng.uniform(1.0, 10.0)
        time.sleep(delay)
        if proc.poll() is not None:
            history.append(f"finished before the kill at {delay:.1f}s")
            break
        if kind == "machine":
            kill_group(proc)
            history.append(f"machine at {delay:.1f}s")
        else:
            workers = dask_worker_pids(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
            deadline = time.monotonic() + 20
            while any(map(alive, workers)) and time.monotonic() < deadline:
                time.sleep(0.1)
            history.append(f"driver at {delay:.1f}s")
        if s3_server.objects(bucket, "run/.tokshard/run.json"):
            s = cli("status", url, "--json", check=True)
            assert json.loads(s.stdout)["running"] is None, history  # the dead run's lease is no bar
    # the last run: one worker is killed while it encodes a partition; the run still finishes
    proc = start_prepare(recipe, url, "--workers", "2")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        busy = scratch_pids() & set(dask_worker_pids(proc.pid))
        if busy:
            os.kill(rng.choice(sorted(busy)), signal.SIGKILL)
            history.append("one worker killed in the last run")
            break
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=300)
    print("\n".join(history))
    assert proc.returncode == 0, f"seed {seed} {history}: {stderr}"
    assert_same_as_local(s3_server, bucket, "run", ref)
    assert cli("verify", url, check=True).stdout.startswith("OK: ")
    assert not s3_server.objects(bucket, "run/.tokshard/lease.json"), "the lease outlived its run"


def test_a_second_prepare_on_the_same_url_is_refused(s3_server, store_setup, tmp_path):
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    with lease(ObjectStore(url), "first-run", log=lambda m: None):  # this process is the running prepare
        proc = cli("prepare", str(recipe), "--out", url, "--workers", "1", cwd=tmp_path)
        running = json.loads(cli("status", url, "--json").stdout or "{}").get("running")
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: another `tokshard prepare` \(pid {os.getpid()} on \S+ since [^)]+\) is running "
        rf"on {url}; wait for it to finish or stop it, then rerun .*",
        proc.stderr.strip(),
    ), proc.stderr
    assert running is None or str(os.getpid()) in running  # no plan yet: status may refuse
    assert not s3_server.objects(bucket, "run/manifest.json")


@pytest.mark.parametrize(
    ("lease", "named"),
    [
        ("a dead pid on this host", r"pid 4206639 on \S+ since then, last renewed \d+ s ago"),
        ("another host, not renewed", r"pid 7 on elsewhere since then, last renewed \d+ s ago"),
        ("an unreadable record", r"its lease record was unreadable"),
    ],
)
def test_the_lease_of_a_dead_prepare_is_taken_over_and_named(s3_server, store_setup, lease, named):
    """Whatever the dead run left in its lease, the message names it as far as it can be
    read, never as "pid None on None"."""
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    if lease == "an unreadable record":
        body = b'{"pid": '
    else:
        here = lease == "a dead pid on this host"
        body = json.dumps(
            {
                "pid": 2**22 + 12335 if here else 7,
                "host": os.uname().nodename if here else "elsewhere",
                "since": "then",
                "time": time.time() - (0 if here else 600),
                "run": "old",
                # a record of this version says its PID namespace: a pid is looked up only there
                **({"pid_ns": pid_namespace()} if here else {}),
            }
        ).encode()
    assert ObjectStore(url).create(LEASE_FILE, body)
    assert json.loads(cli("status", url, "--json").stdout or "{}").get("running") is None
    proc = cli("prepare", str(recipe), "--out", url, "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "took over the lease" in ln]
    assert re.fullmatch(rf"tokshard: took over the lease of a dead run \({named}\)", line), line
    assert not s3_server.objects(bucket, "run/.tokshard/claims"), "a finished run left its claim"


def _no_local_folder(cwd: Path) -> None:
    assert not any(p.name.startswith(("s3:", "gs:")) for p in cwd.rglob("*")), list(cwd.rglob("*"))


@pytest.fixture(scope="module")
def denying_server():
    """A second server that enforces IAM: unknown keys are refused (HTTP 403)."""
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server


@pytest.mark.parametrize(
    "case",
    ["unreachable endpoint", "missing credentials", "missing bucket", "access denied", "gs not installed"],
)
def test_store_errors_are_one_line(s3_server, denying_server, store_setup, tmp_path, case):
    recipe, _ = store_setup
    bucket = s3_server.new_bucket()
    url, env, expect = f"s3://{bucket}/run", {}, ""
    if case == "unreachable endpoint":
        # one attempt: the message is the same after botocore's retries, which only take time
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_MAX_ATTEMPTS": "1"}
        expect = rf"cannot reach http://127\.0\.0\.1:\d+ for {url}; check AWS_ENDPOINT_URL .*"
    elif case == "missing credentials":
        env = {
            "AWS_ACCESS_KEY_ID": "",
            "AWS_SECRET_ACCESS_KEY": "",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
        }
        expect = rf"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or .*"
    elif case == "missing bucket":
        url = "s3://no-such-bucket-here/run"
        expect = rf"bucket no-such-bucket-here does not exist \({url}\); create it first"
    elif case == "access denied":
        env = {"AWS_ENDPOINT_URL": denying_server.endpoint}
        expect = rf"access denied to {url} \(.*\); check the credentials and the bucket's permissions"
    else:  # gcsfs as a machine without tokshard[gcs] has it: absent (the test extra installs it)
        absent = tmp_path / "without-gcsfs" / "gcsfs"
        absent.mkdir(parents=True)
        (absent / "__init__.py").write_text("raise ImportError(\"No module named 'gcsfs'\")\n")
        env = {"PYTHONPATH": os.pathsep.join([str(absent.parent), str(REPO)])}
        url = "gs://bucket/run"
        expect = (
            r"cannot open gs://bucket/run: the gs:// protocol is not installed; pip install tokshard\[gcs\]"
        )
    for args in (["prepare", str(recipe), "--out", url], ["status", url]):
        proc = cli(*args, cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line and re.fullmatch(rf"tokshard: error: {expect}", line), line
    _no_local_folder(tmp_path)


@pytest.mark.parametrize(
    "args",
    [
        ["tokenizer", "train", "--input", "x.jsonl", "--vocab-size", "300", "--out", "s3://b/tok"],
        ["demo", "--out", "s3://b/demo"],
        ["plot", "s3://b/run"],
        ["prepare", "s3://b/recipe.toml", "--out", "s3://b/run"],
        ["prepare", "--input", "x.jsonl", "--tokenizer", "s3://b/tokenizer.json", "--out", "out"],
        ["train", "--manifest", "m.json", "--save", "s3://b/ckpt"],
    ],
    ids=["tokenizer-out", "demo-out", "plot", "recipe", "tokenizer", "train-save"],
)
def test_a_url_where_only_a_local_path_works_is_refused_never_made_a_folder(tmp_path, args):
    proc = cli(*args, cwd=tmp_path, env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"})
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"s3://b/\S+ is a URL; this option takes a local path", proc.stderr), proc.stderr
    _no_local_folder(tmp_path)


def test_inputs_read_from_s3_give_the_shards_of_the_same_local_files(
    s3_server, docs, tokenizer_path, tmp_path
):
    """``--input 's3://bucket/in/*'`` (a glob over objects, plain and gzipped JSON Lines) reads
    over HTTP what the local files hold; an object changed before a resume is refused."""
    import gzip

    local = tmp_path / "in"
    plain = write_jsonl(local / "a.jsonl", docs[:40])
    (local / "b.jsonl.gz").write_bytes(
        gzip.compress(write_jsonl(tmp_path / "b.jsonl", docs[40:80]).read_bytes())
    )
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for path in (plain, local / "b.jsonl.gz"):
        s3.put_object(Bucket=bucket, Key=f"in/{path.name}", Body=path.read_bytes())
    common = ["--tokenizer", str(tokenizer_path), "--workers", "1", "--partition-bytes", "20000"]
    cli("prepare", "--input", f"s3://{bucket}/in/*", "--out", "from-s3", *common, cwd=tmp_path, check=True)
    cli("prepare", "--input", str(local / "*"), "--out", "from-disk", *common, cwd=tmp_path, check=True)
    shards = [
        [s.hash for s in manifest.load(tmp_path / o / "manifest.json").shards]
        for o in ("from-s3", "from-disk")
    ]
    assert len(shards[0]) > 2 and shards[0] == shards[1]

    s3.put_object(Bucket=bucket, Key="in/a.jsonl", Body=plain.read_bytes() + b'{"text": "added"}\n')
    (tmp_path / "from-s3" / "manifest.json").unlink()
    proc = cli("prepare", "--input", f"s3://{bucket}/in/*", "--out", "from-s3", *common, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"input s3://{bucket}/in/a.jsonl (train) changed since this run started" in proc.stderr


@pytest.mark.parametrize("where", ["folder", "store"])
def test_a_tokenizer_deleted_during_the_run_is_put_back_before_the_manifest(
    where, s3_server, store_setup, tmp_path
):
    """tokenizer.json deleted from the output while the run went on: the manifest was written
    beside no tokenizer (exit 0) and `verify` called the output faulty. It is put back from
    the run's tokenizer first; `status` says a rerun puts back one deleted after the end."""
    from pipeline import recipe as recipe_mod
    from pipeline.run.driver import RunOptions, prepare
    from pipeline.run.open_state import open_run_state
    from pipeline.run.status import render, status

    recipe_path, ref = store_setup
    out = str(tmp_path / "out") if where == "folder" else f"s3://{s3_server.new_bucket()}/run"
    state = open_run_state(out)
    finished_checkpoints = state.finished_checkpoints

    def deleted_first(plan):  # just before the driver writes the manifest
        state.place.delete("tokenizer.json")
        return finished_checkpoints(plan)

    state.finished_checkpoints = deleted_first
    said: list[str] = []
    # its own workers: the session's Dask workers may have started before the S3 server's
    # credentials were in this process's environment
    prepare(recipe_mod.load(recipe_path), state, RunOptions(workers=1), log=said.append)
    assert any("tokenizer.json was deleted while the run went on; putting" in line for line in said), said
    assert state.place.read_bytes("tokenizer.json") == (ref / "tokenizer.json").read_bytes()
    assert cli("verify", out, cwd=tmp_path, check=True).stdout.startswith("OK: ")

    state.place.delete("tokenizer.json")  # after the end: status says what a rerun does
    found = status(out)
    assert not found["complete"] and found["tokenizer"] == "missing"
    assert (
        "a rerun would: put back tokenizer.json (missing here) from the run's tokenizer; nothing else"
        in render(found)
    )
    prepare(recipe_mod.load(recipe_path), open_run_state(out), RunOptions(workers=1), log=said.append)
    assert state.place.read_bytes("tokenizer.json") == (ref / "tokenizer.json").read_bytes()
    assert status(out)["complete"]


def test_an_out_url_naming_an_object_is_refused_as_a_local_file_is(s3_server, docs, tokenizer_path, tmp_path):
    """It was taken as a prefix: the run went under ``README.txt/``."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="small/README.txt", Body=b"mine")
    out = f"s3://{bucket}/small/README.txt"
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", out,
               "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"tokshard: error: --out {out} is an object; it names a folder (a key prefix) to write the run "
        "under: choose another --out"
    )
    assert s3_server.objects(bucket) == {"small/README.txt": b"mine"}


def test_a_refused_encoder_on_a_new_url_leaves_no_object_behind(s3_server, docs, tmp_path):
    """The encoder is refused after the plan and the tokenizer went up for the workers: a
    fresh run takes both back, so the URL is as the user left it."""
    # letters and spaces only: tiktoken would change the ids, so --encoder tiktoken is refused
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    bucket = s3_server.new_bucket()
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tok), "--out", f"s3://{bucket}/run",
               "--encoder", "tiktoken", "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "would change the ids" in proc.stderr, proc.stderr
    assert s3_server.objects(bucket) == {}


def test_a_wrong_text_field_on_a_new_url_leaves_no_object_behind(s3_server, docs, tokenizer_path, tmp_path):
    """The refusal came from the run's task, after the plan and the tokenizer went up: a fresh run
    takes them back once its workers are closed, and says that the same URL will do."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5], field="body")
    bucket = s3_server.new_bucket()
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", f"s3://{bucket}/run",
               "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1 and "bad record (missing field 'text')" in proc.stderr, proc.stderr
    assert "nothing was committed: a rerun on the same --out plans afresh" in proc.stderr
    assert s3_server.objects(bucket) == {}
