"""The embedded Dask cluster boots while the driver still checks the encoder and builds
tasks; whatever ends the run, no worker process outlives it."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import psutil
import pytest
from background import in_a_job
from published_vocabs import tokenizer_json
from support import cli, one_error_line, train_tokenizer_json, write_jsonl

from pipeline import recipe
from pipeline.format import manifest
from pipeline.format.errors import TokshardError
from pipeline.run.cluster import EarlyStart
from pipeline.run.driver import RunOptions, prepare


def _children() -> set[int]:
    """This process's live descendants (other tests' shared clusters among them), but for the
    suite's background jobs (tests/background.py), which start and end processes of their own."""
    alive = []
    for c in psutil.Process().children(recursive=True):
        try:
            if in_a_job(c):
                continue
            if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()):
                alive.append(c.pid)
        except psutil.Error:
            pass
    return set(alive)


@pytest.fixture
def before() -> set[int]:
    return _children()


def _settle(before: set[int], deadline: float = 10.0) -> set[int]:
    """The processes started since ``before`` still alive after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while (left := _children() - before) and time.monotonic() < end:
        time.sleep(0.1)
    return left


def test_a_refused_encoder_after_the_workers_booted_leaves_no_worker_behind(tmp_path, docs, before):
    # letters and spaces only: tiktoken would change the ids, so --encoder tiktoken is refused
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    r = recipe.from_dict(
        {
            "tokenizer": str(tok),
            "encoder": "tiktoken",
            "sources": {"d": {"type": "files", "paths": [str(data)]}},
        },
        "test",
    )
    with pytest.raises(TokshardError, match="would change the ids"):
        prepare(r, tmp_path / "out", RunOptions(workers=2), log=lambda m: None)
    time.sleep(3)  # a worker still booting in the background would have appeared by now
    assert _settle(before, deadline=1.0) == set()


def test_a_dask_scratch_folder_that_cannot_be_made_is_one_line_naming_it_and_the_setting(
    tmp_path, tokenizer_path, docs
):
    """Dask's temporary-directory on a read-only or missing mount (here: under a file)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the scratch folder's parent should be")
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "out"),
        env={"DASK_TEMPORARY_DIRECTORY": str(blocker)},
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"tokshard: error: Dask's local workers could not use their scratch folder {blocker}/dask-scratch-space "
        "(Not a directory); point Dask's temporary-directory at a writable local folder "
        "(DASK_TEMPORARY_DIRECTORY=DIR, or temporary-directory in ~/.config/dask/dask.yaml)"
    )
    assert not (tmp_path / "out").exists(), "the refused run left its state in the new --out"


def test_an_untaken_early_cluster_is_closed_by_discard(before):
    early = EarlyStart(workers=1, scheduler=None, threads=1, memory_limit=None)
    early.discard()
    assert _settle(before) == set()


def test_a_taken_early_cluster_belongs_to_its_taker(before):
    early = EarlyStart(workers=1, scheduler=None, threads=1, memory_limit=None)
    cluster, client = early.take()
    early.discard()  # no effect: the caller owns it now
    assert len(cluster.workers) == 1 and cluster.status.name == "running"
    client.close()
    cluster.close()
    assert _settle(before) == set()


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wake_ups(dask_worker) -> tuple[bool, float]:
    """Whether the worker's event loop runs the statistical profiler, and its tick (ms)."""
    callbacks = dask_worker.periodic_callbacks
    return "profile" in callbacks, callbacks["tick"].callback_time


@pytest.mark.parametrize(
    ("asked", "status", "wake_ups"), [(False, 404, (False, 100.0)), (True, 200, (True, 20.0))]
)
def test_local_workers_serve_the_dashboard_and_feed_it_only_when_asked(asked, status, wake_ups, before):
    cluster, client = EarlyStart(1, None, threads=1, memory_limit=None, dashboard=asked).take()
    with cluster, client:
        assert _http_status(client.dashboard_link) == status
        assert list(client.run(_wake_ups).values()) == [wake_ups]
    assert _settle(before) == set()


def _allocator_env() -> tuple[str | None, str | None]:
    import os

    return os.environ.get("MALLOC_MMAP_THRESHOLD_"), os.environ.get("MALLOC_TRIM_THRESHOLD_")


@pytest.mark.parametrize("users", [None, "131072"])
def test_local_workers_start_with_the_allocator_kept_in_the_heap_unless_the_user_says(
    users, before, monkeypatch
):
    if users is None:
        monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    else:
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", users)  # set before the process started, as by a user
    cluster, client = EarlyStart(1, None, threads=1, memory_limit=None).take()
    with cluster, client:
        (seen,) = client.run(_allocator_env).values()
    assert seen == (str(256 << 20), users or str(1 << 30))
    assert _settle(before) == set()


def test_local_workers_leave_the_drivers_environment_as_it_was(before, monkeypatch):
    """Dask's nannies set their pre-spawn variables (OMP_NUM_THREADS=1, PYTHONHASHSEED) in the
    driver's own environment: the demo's trainer, started after a prepare in the same process,
    ran on one thread, and after a rerun that skipped the prepare on every core, computing
    other losses. The workers still get them."""
    import os

    for name in ("OMP_NUM_THREADS", "PYTHONHASHSEED", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    environment = dict(os.environ)
    cluster, client = EarlyStart(1, None, threads=1, memory_limit=None).take()
    with cluster, client:
        (workers,) = client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values()
        assert dict(os.environ) == environment
    assert workers == "1"
    assert _settle(before) == set()


def test_only_dasks_own_variables_are_put_back_after_the_workers_start(monkeypatch):
    """The driver's other threads set variables while the workers start (an encoder's thread
    count, read once by its Rust pool): putting the whole environment back dropped them."""
    import os

    from pipeline.run.cluster import environment_kept

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    with environment_kept():
        os.environ["OMP_NUM_THREADS"] = "1"  # as a nanny does
        os.environ["RAYON_NUM_THREADS"] = "1"  # as the driver's check does, on its own thread
    assert "OMP_NUM_THREADS" not in os.environ
    assert os.environ["RAYON_NUM_THREADS"] == "1"


def _encoders_built(dask_worker) -> int:
    from pipeline.encoding.spec import worker_encoder

    return worker_encoder.cache_info().misses


def test_each_worker_builds_its_encoder_once_while_the_driver_checks_it(tmp_path, docs, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:400])
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40])
    r = recipe.from_dict(
        {
            "tokenizer": str(tok),
            "sources": {"d": {"type": "files", "paths": [str(data)], "partition_bytes": 20_000}},
        },
        "test",
    )
    built = dask_client.run(_encoders_built)
    path = prepare(
        r, tmp_path / "out", RunOptions(scheduler=dask_client.scheduler.address), log=lambda m: None
    )
    after = dask_client.run(_encoders_built)
    assert manifest.load(path).data["encoder"]["name"] == "fastokens"
    # the warm-up built it on both workers, and every task found it ready
    assert {w: after[w] - built[w] for w in after} == {w: 1 for w in after}


def test_with_a_kept_check_the_driver_compares_a_worker_s_copy_and_builds_none(
    tmp_path, docs, before, monkeypatch
):
    from pipeline.encoding import selection, spec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the driver's cache only
    data = write_jsonl(tmp_path / "in.jsonl", docs[:100])
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40])
    selection.decide("fastokens", str(tok), lambda: docs)  # an earlier run's pass, kept
    built: list[str] = []
    monkeypatch.setattr(spec, "FastokensEncoder", lambda path, *a, **k: built.append(path))
    r = recipe.from_dict(
        {"tokenizer": str(tok), "sources": {"d": {"type": "files", "paths": [str(data)]}}}, "test"
    )
    said: list[str] = []
    path = prepare(r, tmp_path / "out", RunOptions(workers=1), log=said.append)
    assert manifest.load(path).data["encoder"]["name"] == "fastokens"
    (line,) = [m for m in said if m.startswith("encoder: ")]
    assert f"kept in {tmp_path / 'xdg'}" in line
    assert built == []
    assert _settle(before) == set()


def test_a_busy_worker_holds_the_run_back_only_briefly(dask_client, monkeypatch):
    from pipeline.run import cluster

    monkeypatch.setattr(cluster, "WARM_UP_SECONDS", 1.0)
    (busy, _) = dask_client.scheduler_info(n_workers=-1)["workers"]
    sleeper = dask_client.submit(time.sleep, 6, workers=[busy], pure=False)
    while not dask_client.processing()[busy]:
        time.sleep(0.05)
    early = cluster.EarlyStart(None, dask_client.scheduler.address, threads=1, memory_limit=None)
    early.warm(time.sleep, 0)
    began = time.monotonic()
    _, client = early.take()
    took = time.monotonic() - began
    client.close()
    sleeper.result()
    assert took < 4.0


def test_a_rerun_with_fewer_partitions_left_than_workers_boots_one_per_partition(
    tmp_path, docs, tokenizer_path
):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:60])
    r = recipe.from_dict(
        {
            "tokenizer": str(tokenizer_path),
            "sources": {"d": {"type": "files", "paths": [str(data)], "partition_bytes": 20_000}},
        },
        "test",
    )
    out = tmp_path / "out"
    first = manifest.load(prepare(r, out, RunOptions(workers=2), log=lambda m: None))
    shards = {s.rel_path: s.bin_path.read_bytes() for s in first.select()}
    (out / "manifest.json").unlink()
    checkpoints = sorted(out.glob(".tokshard/parts/d/train/*.json"))
    assert len(checkpoints) > 2
    checkpoints[1].unlink()  # that partition is redone, the others are kept
    said: list[str] = []
    again = manifest.load(prepare(r, out, RunOptions(workers=2), log=said.append))
    assert f"{len(checkpoints)} partitions: {len(checkpoints) - 1} done, 0 to resume, 1 to start" in said
    assert any(line.startswith("Dask: 1 local worker process;") for line in said), said
    assert {s.rel_path: s.bin_path.read_bytes() for s in again.select()} == shards


def test_a_run_with_fewer_partitions_than_workers_boots_one_per_partition(tmp_path, docs, tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])  # one partition
    r = recipe.from_dict(
        {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}}, "test"
    )
    said: list[str] = []
    prepare(r, tmp_path / "out", RunOptions(workers=2), log=said.append)
    assert "1 partition: 0 done, 0 to resume, 1 to start" in said
    assert any(line.startswith("Dask: 1 local worker process;") for line in said), said


def test_workers_set_in_a_recipe_is_how_many_boot(tmp_path, docs, tokenizer_path):
    """``workers = 1`` in a recipe file: one worker for several partitions (it was accepted, and
    the machine's core count booted instead)."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:60])
    path = tmp_path / "r.toml"
    path.write_text(
        f'tokenizer = "{tokenizer_path}"\nworkers = 1\n'
        f'[sources.d]\ntype = "files"\npaths = ["{data}"]\npartition_bytes = 20000\n'
    )
    done = cli("prepare", str(path), "--out", str(tmp_path / "out"), check=True)
    assert "tokshard: Dask: 1 local worker process;" in done.stderr, done.stderr
    assert "0 done, 0 to resume, 1 to start" not in done.stderr  # several partitions


def test_local_workers_all_gone_is_an_error_not_a_wait(tmp_path, docs, tokenizer_path, before, monkeypatch):
    """Workers killed for memory as soon as they start (a limit below what one needs, as the
    CLI no longer lets through): none is left to run the tasks."""
    from pipeline.run import cluster, driver

    monkeypatch.setattr(driver, "LOCAL_WORKERS_GONE_SECONDS", 1.0)
    monkeypatch.setattr(cluster, "WARM_UP_SECONDS", 1.0)  # the warm-up's task has no worker either
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    r = recipe.from_dict(
        {
            "tokenizer": str(tokenizer_path),
            "encoder": "tokenizers",  # no check of the encoder on a worker (there is none to ask)
            "sources": {"d": {"type": "files", "paths": [str(data)]}},
        },
        "test",
    )
    with pytest.raises(driver.ClusterLost, match=r"^all local Dask workers are gone for \d+ s \(killed"):
        prepare(r, tmp_path / "out", RunOptions(workers=1, memory_limit="10MB"), log=lambda m: None)
    assert _settle(before) == set()


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ("10MB", "'10MB' is 10 MiB per worker, below the 512 MiB a worker process needs"),
        ("1B", "'1B' is 0 MiB per worker, below the 512 MiB a worker process needs"),
        # o200k_base's worker peaks at about 320 MiB, and its nanny stops it at 95% of the limit
        ("256MiB", "'256MiB' is 256 MiB per worker, below the 512 MiB a worker process needs"),
        ("0.00001", "'0.00001' is 0 MiB per worker, below the 512 MiB"),
        ("1.5", "a fraction of this machine's memory between 0 and 1 such as 0.5, or a size with a unit"),
        ("100", "a fraction of this machine's memory between 0 and 1 such as 0.5, or a size with a unit"),
    ],
)
def test_a_memory_limit_too_small_for_a_worker_is_refused_before_any_starts(tmp_path, limit, said):
    proc = cli("prepare", "--input", "x.jsonl", "--out", str(tmp_path / "o"), "--memory-limit", limit)
    assert proc.returncode == 2
    assert said in one_error_line(proc)
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(150)
def test_a_worker_whose_encoder_sits_above_dasks_pause_mark_still_runs_its_tasks(tmp_path, docs):
    """Llama 3's loaded worker holds about 220 MiB, above the 80% of 256MiB at which Dask pauses
    a worker; ours hold no Dask data to spill, so a paused one never resumed: the run hung."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:200])
    r = recipe.from_dict(
        {
            "tokenizer": str(tokenizer_json("llama3")),
            "sources": {"d": {"type": "files", "paths": [str(data)], "partition_bytes": 8192}},
        },
        "test",
    )
    path = prepare(r, tmp_path / "o", RunOptions(workers=1, memory_limit="256MiB"), log=lambda m: None)
    assert manifest.load(path).data["totals"]["shards"] > 1


def test_the_least_memory_limit_holds_the_largest_published_vocabulary(tmp_path, docs):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:200])
    done = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_json("o200k_base")),
        "--partition-bytes", "8KiB", "--workers", "1", "--memory-limit", "512MiB",
        "--out", str(tmp_path / "o"), timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_workers_killed_at_their_memory_limit_are_told_a_larger_one():
    from pipeline.run.cluster import killed_advice

    said = killed_advice("512MiB")
    assert "at 95% of its --memory-limit 512MiB" in said and "such as --memory-limit 1024MiB" in said
    assert "--memory-limit" not in killed_advice(None)  # the machine's memory split: fewer --workers


class _SlowToReap:
    """Dask's LocalCluster as a loaded machine left it: its close killed a worker process, then
    timed out joining it (`Nanny.kill`), raising TimeoutError after the run's work was done."""

    closed = False

    def close(self):
        self.closed = True
        raise TimeoutError


def test_a_close_that_times_out_reaping_a_killed_worker_does_not_fail_the_run():
    """Under load the suite saw it: every partition written, then a traceback and no manifest."""
    from pipeline.run.cluster import closed_at_exit

    cluster = _SlowToReap()
    with closed_at_exit(cluster):
        pass
    assert cluster.closed
