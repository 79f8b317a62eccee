"""A real multi-process Dask cluster started with the `dask` CLI on 127.0.0.1, as on CPU nodes:
`prepare --scheduler` survives a worker killed mid-task (the retry resumes from the
partition's last commit) and a driver killed mid-run (its orphaned tasks stop at their next
commit when the rerun takes over). Output byte-identical to an uninterrupted run."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import (
    REPO,
    assert_same_output,
    checkpoints,
    cli,
    corpus,
    files_recipe,
    kill_group,
    leftovers,
    one_error_line,
    reference,
    start_prepare,
    wait_for,
    write_jsonl,
)

from pipeline.run.run_state import STATE_DIR

pytestmark = pytest.mark.slow
DASK = [sys.executable, "-m", "distributed.cli.dask_worker"]


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        start_new_session=True,
    )


def start_cluster(d: Path, workers: int, procs: list[subprocess.Popen]) -> str:
    """`dask scheduler` and ``workers`` `dask worker` processes (one single-threaded worker
    each), appended to ``procs`` as they start (the caller kills them); the scheduler's address."""
    sched_file = d / "scheduler.json"
    dask_cli = [sys.executable, "-m", "dask"]
    procs.append(
        spawn(
            [*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(sched_file)],
            d / "scheduler.log",
        )
    )  # fmt: skip
    wait_for(sched_file.exists, 60, "the scheduler file")
    address = json.loads(sched_file.read_text())["address"]
    for i in range(workers):
        procs.append(start_worker(address, d, f"w{i}"))
    if workers:
        from distributed import Client

        # a Client another test of this process left unclosed is finalized here, not by the
        # garbage collector inside the new Client's loop thread as it starts: its __del__
        # there waits on its own loop runner, and the start hung (600 s) or gave up after 10 s
        gc.collect()
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(workers, timeout=60)
    return address


def start_worker(address: str, d: Path, name: str) -> subprocess.Popen:
    return spawn(
        [sys.executable, "-m", "dask", "worker", address, "--nworkers", "1", "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard", "--name", name],
        d / f"{name}.log",
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes (one single-threaded worker each)."""
    d = tmp_path_factory.mktemp("dask-cli")
    procs: list[subprocess.Popen] = []
    try:
        yield start_cluster(d, 2, procs), d
    finally:
        for proc in reversed(procs):
            kill_group(proc)


@pytest.fixture
def own_cluster(tmp_path):
    """A scheduler of this test's own (to kill, or to leave without workers): call it with the
    number of workers; returns (address, the processes: the scheduler's first)."""
    procs: list[subprocess.Popen] = []

    def start(workers: int) -> tuple[str, list[subprocess.Popen]]:
        d = tmp_path / f"dask-{len(procs)}"
        d.mkdir()
        return start_cluster(d, workers, procs), procs

    try:
        yield start
    finally:
        for proc in reversed(procs):
            kill_group(proc)


@pytest.fixture(scope="module")
def workload(tmp_path_factory, docs, tokenizer_path, dask_client):
    d = tmp_path_factory.mktemp("dask-cli-data")
    # one 8 MB partition: seconds of work left after its first commit, whatever the machine
    # (with the reference encoder: fastokens encodes it in a fraction of a second)
    data = corpus(d / "in.jsonl", docs, copies=12)
    recipe = files_recipe(
        d / "r.toml",
        tokenizer_path,
        data,
        partition_bytes=64 << 20,
        shard_tokens=300_000,
        commit_seconds=0.2,
        encoder="tokenizers",
    )
    return recipe, reference(recipe, d / "ref", dask_client).parent


def partial_partition(out: Path) -> str | None:
    """Index (as in its file name, "00000") of a partition being written that has made a
    commit mid-way, if any."""
    for path in sorted((out / STATE_DIR / "parts").rglob("*.json")):
        try:
            ck = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not ck["complete"] and ck["progress"] > 0:
            return path.stem
    return None


def test_a_worker_killed_mid_task_loses_nothing(cluster, workload, tmp_path):
    from distributed import Client

    address, _ = cluster
    recipe, ref = workload
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--scheduler", address)
    index = wait_for(lambda: partial_partition(out), 120, "a partition with a commit", proc)
    assert index is not None, proc.communicate()[1]
    with Client(address, timeout="30s") as client:
        busy = {w for w, keys in client.processing().items() if any(f"-{index}-" in k for k in keys)}
        (worker,) = busy
        pid = client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, signal.SIGKILL)  # the nanny restarts it; the scheduler reschedules the task
        _, stderr = proc.communicate(timeout=240)
        client.wait_for_workers(2, timeout=60)
    assert proc.returncode == 0, stderr
    (ck,) = [c for c in checkpoints(out) if c["key"] == _partition_key(out, index)]
    assert ck["resumed_from"] and ck["resumed_from"][0]["progress"] > 0, "the retry started from scratch"
    assert_same_output(ref, out)
    assert not leftovers(out)


def _partition_key(out: Path, index: str) -> str:
    plan = json.loads((out / STATE_DIR / "run.json").read_text())
    return next(p["key"] for p in plan["partitions"] if p["index"] == int(index))


def test_orphaned_tasks_of_a_killed_driver_yield_to_the_rerun(cluster, workload, tmp_path):
    _, folder = cluster
    scheduler_file = str(folder / "scheduler.json")  # --scheduler also takes the scheduler file
    recipe, ref = workload
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--scheduler", scheduler_file)
    assert wait_for(lambda: partial_partition(out), 120, "a partition with a commit", proc) is not None
    kill_group(proc)  # the driver only: its tasks go on running on the dask workers
    started = time.time()
    rerun = start_prepare(recipe, out, "--scheduler", scheduler_file)
    _, stderr = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, stderr
    assert_same_output(ref, out)
    # a partition left partial after the kill can only be one whose orphaned task stopped
    # mid-way for the rerun (otherwise it would have finished it, holding its lock)
    resumed = [r for c in checkpoints(out) for r in c["resumed_from"] if r["time"] > started]
    assert resumed, "the orphaned tasks went on writing instead of yielding to the rerun"


@pytest.fixture
def http_port():
    """A port that answers HTTP, as Dask's dashboard or any web server does."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_that_is_not_a_dask_scheduler_is_one_line_not_a_wait(http_port, monkeypatch):
    from pipeline.format.errors import TokshardError
    from pipeline.run import cluster as cluster_mod

    monkeypatch.setattr(cluster_mod, "HANDSHAKE_SECONDS", 1.0)
    with pytest.raises(TokshardError, match=f"port {http_port} answers but is not a Dask scheduler"):
        cluster_mod._join(f"tcp://127.0.0.1:{http_port}")


def test_the_scheduler_s_own_address_passes_the_handshake_check(cluster):
    from pipeline.run.cluster import check_speaks_dask

    check_speaks_dask(cluster[0])


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{bad", "not a Dask scheduler file (Expecting property name"),
        ("{}", 'not a Dask scheduler file (no "address" string in it)'),
        ('{"address": 5}', 'not a Dask scheduler file (no "address" string in it)'),
        ("[]", 'not a Dask scheduler file (no "address" string in it)'),
    ],
)
def test_a_bad_scheduler_file_is_one_line(tmp_path, content, said):
    from pipeline.format.errors import TokshardError
    from pipeline.run.cluster import _join

    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(TokshardError, match=re.escape(f"--scheduler {path}: {said}")):
        _join(str(path))


def test_a_tls_scheduler_without_tls_settings_is_one_line():
    from pipeline.format.errors import TokshardError
    from pipeline.run.cluster import _join

    with pytest.raises(TokshardError, match=r"set distributed\.comm\.tls\.\* in your Dask config"):
        _join("tls://127.0.0.1:1")


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("ucx://127.0.0.1:8811", "ucx:// is not supported; give a tcp://HOST:PORT address (or tls://, ws://, wss://)"),
        ("tcp://127.0.0.1:99999", "port '99999' is not a port number (1-65535)"),
        ("tcp://127.0.0.1", "no port given; give the scheduler's HOST:PORT (tcp://127.0.0.1:8786 by default)"),
        ("tcp://nosuchhost.invalid:8786", "host nosuchhost.invalid does not resolve ("),
        (":8786", "no host given; give the scheduler's HOST:PORT (tcp://127.0.0.1:8786 on this machine)"),
        ("::1:8786", "an IPv6 address goes in brackets; give tcp://[::1]:8786"),
    ],
)  # fmt: skip
def test_a_scheduler_address_that_cannot_work_is_one_line_at_once(
    tmp_path, tokenizer_path, docs, address, said
):
    """ucx:// was refused with advice on TLS settings, a port out of range and a host that does
    not resolve after a 15 s wait as "Timed out trying to connect"."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    started = time.monotonic()
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", "out",
               "--scheduler", address, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert f"--scheduler {address}: {said}" in one_error_line(proc)
    assert time.monotonic() - started < 12  # the CLI's start included, on a busy machine
    assert not (tmp_path / "out").exists()


def other_tokshard(folder: Path, change: str) -> Path:
    """A copy of the ``pipeline`` package on a PYTHONPATH of its own, as a worker installed
    from another release would import it: its version or one of its sources changed."""
    shutil.copytree(REPO / "pipeline", folder / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    if change == "version":
        init = folder / "pipeline" / "__init__.py"
        init.write_text(re.sub(r'__version__ = "[^"]+"', '__version__ = "0.0.1"', init.read_text()))
    else:
        with open(folder / "pipeline" / "encoding" / "documents.py", "a") as f:
            f.write("\n# a change that could shape the tokens\n")
    return folder


def start_other_worker(address: str, other: Path, log: Path, *path: Path) -> subprocess.Popen:
    """A `dask worker` that imports the ``pipeline`` package in ``other`` (and first what the
    folders of ``path`` hold)."""
    python_path = os.pathsep.join(str(p) for p in (*path, other))
    return subprocess.Popen(
        [sys.executable, "-m", "dask", "worker", address, "--nworkers", "1", "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard"],
        cwd=log.parent, env={**os.environ, "PYTHONPATH": python_path}, stdout=subprocess.DEVNULL,
        stderr=open(log, "w"), start_new_session=True,
    )  # fmt: skip


def other_library(folder: Path, name: str, version: str | None, init: str | None = None) -> Path:
    """A folder that, first on a worker's PYTHONPATH, gives it another ``name`` library: a
    package of that name with its installed metadata (version None: an import of ``name``
    fails there, as where the library is not installed; ``init``: its ``__init__.py``)."""
    folder.mkdir(parents=True)
    if version is None:  # a finder first on the path that refuses the name
        (folder / "sitecustomize.py").write_text(
            "import sys\n\n\nclass Missing:\n"
            "    @staticmethod\n"
            "    def find_spec(fullname, path=None, target=None):\n"
            f"        if fullname.partition('.')[0] == {name!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {fullname!r}', name=fullname)\n\n\n"
            "sys.meta_path.insert(0, Missing)\n"
        )
        return folder
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text(init or f'__version__ = "{version}"\n')
    dist_info = folder / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


@pytest.mark.parametrize("change", ["version", "source"])
def test_a_worker_of_another_tokshard_is_refused_before_any_task(
    own_cluster, tmp_path, tokenizer_path, docs, change
):
    """A worker of an older tokshard died reading its first task and the run waited for workers
    without a word; one whose code differed would have been used."""
    from distributed import Client

    from pipeline import __version__

    address, procs = own_cluster(0)
    procs.append(start_other_worker(address, other_tokshard(tmp_path / "other", change), tmp_path / "w.log"))
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", "out",
               "--scheduler", address, cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    theirs = "0.0.1" if change == "version" else __version__
    line = one_error_line(proc)
    assert re.fullmatch(
        rf"tokshard: error: Dask worker tcp://127\.0\.0\.1:\d+ runs tokshard {theirs} \(code [0-9a-f]{{12}}\), "
        rf"this driver tokshard {__version__} \(code [0-9a-f]{{12}}\); install the same tokshard on every "
        r"worker \(and the driver\), restart the workers, then rerun",
        line,
    ), line
    assert not (tmp_path / "out").exists()


BROKEN = "raise ImportError('simulated: no wheel for this platform')\n"


@pytest.mark.parametrize(
    ("library", "version", "init", "theirs"),
    [
        ("fastokens", "0.0.1", None, "fastokens 0.0.1"),
        ("tokenizers", None, None, "no tokenizers it can import"),
        # the driver's version, but its import fails (a native module another CPU or glibc needs)
        ("fastokens", "driver's", BROKEN, "a fastokens that fails to import (ImportError: simulated: no wheel for this platform)"),
    ],
)  # fmt: skip
def test_a_worker_with_another_encoder_library_is_refused_before_any_task(
    own_cluster, tmp_path, tokenizer_path, docs, library, version, init, theirs
):
    """The same tokshard over another `tokenizers` or fast back end's library wrote other ids
    without a word: the worker's versions of the libraries the run's encoder depends on must
    be the driver's (`tokenizers` is checked on joining, the chosen back end's once chosen),
    and it must import there (one that did not died in the first task, with a traceback)."""
    from distributed import Client

    from pipeline.encoding.backend import library_version

    address, procs = own_cluster(0)
    version = library_version(library) if version == "driver's" else version
    libs = other_library(tmp_path / "libs", library, version, init)
    procs.append(start_other_worker(address, REPO, tmp_path / "w.log", libs))
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", "out",
               "--encoder", "fastokens", "--scheduler", address, cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    ours = library_version(library)
    assert re.fullmatch(
        rf"tokshard: error: Dask worker tcp://127\.0\.0\.1:\d+ has {re.escape(theirs)}, this driver {library} "
        rf"{re.escape(ours)}, and the ids this run writes depend on it; install {library}=={re.escape(ours)} "
        r"\(the driver's\) on every worker, restart the workers, then rerun",
        one_error_line(proc),
    ), proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_worker_with_another_tokenizers_that_joins_later_is_refused_its_tasks(own_cluster, tmp_path):
    """Each task checks its worker's encoder libraries too, as it checks its tokshard."""
    from distributed import Client

    from pipeline.run.code_check import gated, refusal

    address, procs = own_cluster(0)
    with Client(address, timeout="30s") as client:
        fn, args = gated(len, "abc", libraries=("tokenizers",))
        future = client.submit(fn, *args, pure=False)  # waits for a worker
        libs = other_library(tmp_path / "libs", "tokenizers", "0.0.1")
        procs.append(start_other_worker(address, REPO, tmp_path / "w.log", libs))
        with pytest.raises(RuntimeError) as caught:
            future.result(timeout=60)
        said = str(refusal(caught.value))
        worker = next(iter(client.nthreads()))
    assert said.startswith(f"Dask worker {worker} has tokenizers 0.0.1, this driver tokenizers "), said
    assert fn(*args) == 3  # here, the driver's own libraries: it runs


def test_a_worker_is_judged_by_the_encoder_library_it_loaded_not_its_install_since(own_cluster, tmp_path):
    """A worker that loaded tokenizers 0.0.1 runs it even once its install was upgraded to the
    driver's version under it (a `pip install -U` on a shared filesystem)."""
    import cloudpickle
    from distributed import Client

    from pipeline.encoding.backend import library_version
    from pipeline.run.code_check import GATE, driver_identity, gated, refusal

    address, procs = own_cluster(0)
    libs = other_library(tmp_path / "libs", "tokenizers", "0.0.1")
    procs.append(start_other_worker(address, REPO, tmp_path / "w.log", libs))
    loaded = cloudpickle.dumps((lambda: __import__("tokenizers").__version__, ()))
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
        then = client.submit(GATE, driver_identity(), loaded, (("tokenizers", "0.0.1"),), pure=False)
        assert then.result(timeout=60) == "0.0.1"  # checked, then loaded by the task
        shutil.rmtree(libs)
        other_library(libs, "tokenizers", library_version("tokenizers"))  # the upgrade
        fn, args = gated(len, "abc", libraries=("tokenizers",))
        with pytest.raises(RuntimeError) as caught:
            client.submit(fn, *args, pure=False).result(timeout=60)
    assert " has tokenizers 0.0.1, this driver tokenizers " in str(refusal(caught.value))


def test_a_worker_of_another_tokshard_that_joins_later_is_refused_its_tasks(own_cluster, tmp_path):
    """Workers that join once the run is going were not probed: each task checks first."""
    from distributed import Client

    from pipeline.run.code_check import gated, refusal

    address, procs = own_cluster(0)
    with Client(address, timeout="30s") as client:
        fn, args = gated(len, "abc", libraries=("tokenizers",))
        future = client.submit(fn, *args, pure=False)  # waits for a worker
        procs.append(
            start_other_worker(address, other_tokshard(tmp_path / "other", "source"), tmp_path / "w.log")
        )
        with pytest.raises(RuntimeError) as caught:
            future.result(timeout=60)
        said = str(refusal(caught.value))
        assert said.startswith(f"Dask worker {next(iter(client.nthreads()))} runs tokshard "), said
    assert fn(*args) == 3  # here, the driver's own tokshard: it runs


def test_a_scheduler_killed_mid_run_is_one_line_and_the_rerun_resumes(own_cluster, workload, tmp_path):
    address, procs = own_cluster(1)
    recipe, ref = workload
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--scheduler", address)
    assert wait_for(lambda: partial_partition(out), 120, "a partition with a commit", proc) is not None
    kill_group(procs[0])  # the scheduler, as kill -9 or its node lost
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert one_error_line(SimpleNamespace(stderr=stderr, stdout="")) == (
        f"tokshard: error: lost the Dask scheduler at {address}; rerun: it resumes from the last commit"
    )
    assert "Traceback" not in stderr and "distributed.client" not in stderr, stderr
    address, _ = own_cluster(1)
    rerun = start_prepare(recipe, out, "--scheduler", address)
    _, stderr = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, stderr
    assert_same_output(ref, out)


def test_a_worker_whose_tokshard_changed_on_disk_under_it_is_refused(own_cluster, tmp_path):
    """A worker keeps the code it loaded: started before an upgrade of a shared install, it
    passed a check of its disk, which now held the driver's code, and ran its old code."""
    import cloudpickle
    from distributed import Client

    from pipeline.run.code_check import CHANGED_SINCE, GATE, PROBE, gated, refusal, shown

    address, procs = own_cluster(0)
    other = other_tokshard(tmp_path / "other", "source")  # the worker's install before the upgrade
    procs.append(start_other_worker(address, other, tmp_path / "w.log"))
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
        (before,) = client.run(PROBE).values()
        payload = cloudpickle.dumps((shown, (tuple(before),)))
        assert "code" in client.submit(GATE, tuple(before), payload, pure=False).result(timeout=60)
        shutil.copy(
            REPO / "pipeline" / "encoding" / "documents.py", other / "pipeline" / "encoding"
        )  # the upgrade
        fn, args = gated(shown, tuple(before), libraries=())
        with pytest.raises(RuntimeError) as caught:
            client.submit(fn, *args, pure=False).result(timeout=60)
    said = str(refusal(caught.value))
    assert f"(code {CHANGED_SINCE})" in said and "restart the workers" in said, said


def test_a_scheduler_without_workers_is_said_and_the_run_waits_for_them(
    own_cluster, tmp_path, docs, tokenizer_path, monkeypatch, capsys
):
    from pipeline import recipe
    from pipeline.format import manifest
    from pipeline.run import driver

    monkeypatch.setattr(driver, "NO_WORKERS_SAY_SECONDS", 1.0)
    address, procs = own_cluster(0)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:20]))
    r = recipe.from_dict(
        {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}}, "test"
    )
    said: list[str] = []

    def log(line: str) -> None:
        said.append(line)
        if line.startswith("no Dask workers connected") and len(procs) == 1:
            procs.append(start_worker(address, tmp_path, "late"))  # as a batch queue starts one

    options = driver.RunOptions(scheduler=address, progress_interval=0)
    path = driver.prepare(r, tmp_path / "out", options, log=log)
    assert manifest.load(path).data["totals"]["tokens"] > 0
    # the progress lines meanwhile say why nothing moves, not a rate of 0 and no ETA
    assert "0.0% of input, 0 tokens, waiting for workers" in capsys.readouterr().err
    assert (
        f"no Dask workers connected to {address} for 1 s; start some (dask worker {address}) or stop "
        "with Ctrl-C: it resumes"
    ) in said


def test_the_clients_give_up_on_a_lost_scheduler_is_left_to_the_runs_one_line():
    """On a busy machine the driver noticed the lost scheduler after Dask's client had logged
    "Failed to reconnect ... closing client": two lines where the run says one."""
    import logging

    from pipeline.run.cluster import connection_faults_unlogged

    log = logging.getLogger("distributed.client")
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    log.addHandler(handler)
    try:
        with connection_faults_unlogged():
            log.error("Failed to reconnect to scheduler after %.2f seconds, closing client", 15.0)
            log.error("another client error")
    finally:
        log.removeHandler(handler)
    assert shown == ["another client error"]


def test_a_scheduler_refused_once_the_run_planned_leaves_a_new_out_as_it_was(tmp_path, tokenizer_path, docs):
    """The scheduler is joined while the driver plans: its refusal came after the plan and the
    tokenizer were written, and left them in the new --out."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    (tmp_path / "s.json").write_text("{}")
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", "out",
               "--scheduler", "s.json", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "not a Dask scheduler file" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_bracketed_ipv6_scheduler_address_is_joined(tmp_path):
    """The check that refuses an IPv6 address without brackets lets the bracketed one through."""
    from pipeline.run.cluster import _join

    sched_file = tmp_path / "scheduler.json"
    proc = spawn(
        [sys.executable, "-m", "dask", "scheduler", "--host", "[::1]", "--port", "0", "--no-dashboard",
         "--scheduler-file", str(sched_file)],
        tmp_path / "scheduler.log",
    )  # fmt: skip
    try:
        wait_for(sched_file.exists, 60, "the scheduler file")
        port = json.loads(sched_file.read_text())["address"].rpartition(":")[2]
        client = _join(f"tcp://[::1]:{port}")
        client.close()
    finally:
        kill_group(proc)


def test_a_worker_under_another_umask_writes_shards_of_the_drivers_mode(
    own_cluster, tmp_path, docs, tokenizer_path
):
    """A `dask worker` started under `umask 077` wrote its shards 0600 (and their folders 0700)
    while the driver made the folder and the manifest readable by all: the drivers' umask rules,
    also for tasks that overlap on the worker's threads (one ending gave another the 077 back)."""
    import stat

    from pipeline import recipe
    from pipeline.run import driver

    address, procs = own_cluster(0)
    procs.append(
        subprocess.Popen(
            ["sh", "-c", 'umask 077; exec "$0" "$@"', sys.executable, "-m", "dask", "worker", address,
             "--nworkers", "1", "--nthreads", "4", "--host", "127.0.0.1", "--no-dashboard"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "w.log", "w"), start_new_session=True,
        )
    )  # fmt: skip
    data = write_jsonl(tmp_path / "in.jsonl", docs[:200])
    source = {"type": "files", "paths": [str(data)], "partition_bytes": 16 << 10}  # tasks to overlap
    r = recipe.from_dict({"tokenizer": str(tokenizer_path), "sources": {"d": source}}, "test")
    before = os.umask(0o022)
    try:
        path = driver.prepare(r, tmp_path / "out", driver.RunOptions(scheduler=address), log=lambda _: None)
    finally:
        os.umask(before)
    modes = {
        str(p.relative_to(tmp_path / "out")): stat.S_IMODE(p.stat().st_mode)
        for p in (tmp_path / "out").rglob("*")
        if STATE_DIR not in p.parts
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert any(name.endswith(".bin") for name in modes), modes
    assert modes == {name: 0o755 if (tmp_path / "out" / name).is_dir() else 0o644 for name in modes}


def test_a_fresh_run_refused_by_a_worker_that_joins_later_leaves_out_as_it_was(
    own_cluster, tmp_path, docs, tokenizer_path
):
    """The late worker's refusal came while the run's other tasks were still submitted: the run
    took nothing back, and its plan and tokenizer stayed in the new --out."""
    address, procs = own_cluster(0)
    data = corpus(tmp_path / "in.jsonl", docs, copies=4)
    recipe = files_recipe(tmp_path / "r.toml", tokenizer_path, data, partition_bytes=64 << 10)
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--scheduler", address)
    wait_for(lambda: (out / STATE_DIR / "run.json").exists(), 120, "the run's plan", proc)
    procs.append(
        start_other_worker(address, other_tokshard(tmp_path / "other", "source"), tmp_path / "w.log")
    )
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert "install the same tokshard on every worker" in one_error_line(
        SimpleNamespace(stderr=stderr, stdout="")
    )
    assert not out.exists(), sorted(str(p.relative_to(out)) for p in out.rglob("*"))
