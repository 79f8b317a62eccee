"""Shared fixtures: real text, a real tokenizer, a real Dask cluster, the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never reach the hub: fail at once instead of retrying (set before any library loads).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from background import JOB_TIMEOUT, JOBS, Job, owned_here, readers_last, shared_folder, wanted_jobs
from support import EOS, REPO, english_documents


def pytest_collection_modifyitems(config, items) -> None:
    readers_last(items)


def pytest_xdist_make_scheduler(config, log):
    """Under xdist's default ``--dist load``: each module's run of tests on one worker
    (`scheduling.ModuleRunScheduling`), in the collection's order; any other --dist as asked."""
    if config.getvalue("dist") != "load":
        return None
    config.option.loadscopereorder = False  # the order readers_last gave: background readers last
    from scheduling import ModuleRunScheduling

    return ModuleRunScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory) -> Path:
    """The suite's own ~/.cache (XDG_CACHE_HOME), shared by its tests (in every pytest-xdist
    worker) as by a user's runs: nothing is written to the real one, no earlier session's kept
    checks count, and what is built once (DeepSpeed's CPUAdam, a check) is built once a session."""
    folder = shared_folder(tmp_path_factory.getbasetemp()) / "xdg-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


#: set by Ctrl-C: the background jobs are stopped at once instead of run to their end
INTERRUPTED = False


@pytest.fixture(scope="session", autouse=True)
def background_jobs(request, tmp_path_factory, user_cache) -> dict[str, Job]:
    """Every background job (tests/background.py) that a selected test reads, each started now
    by the one process that owns it (`owned_here`), in a folder all of them read."""
    shared = shared_folder(tmp_path_factory.getbasetemp()) / "background"
    wanted = wanted_jobs(request.session.items)
    jobs = {name: Job(name, shared / name) for name in wanted}
    for name in owned_here(wanted):
        jobs[name].folder.mkdir(parents=True, exist_ok=True)
        jobs[name].start(JOBS[name](jobs[name].folder))
    yield jobs
    session = request.session
    interrupted = INTERRUPTED or bool(session.shouldstop or session.shouldfail)
    for job in jobs.values():
        job.finish(interrupted, timeout=JOB_TIMEOUT)


def pytest_keyboard_interrupt(excinfo) -> None:
    global INTERRUPTED
    INTERRUPTED = True


@pytest.fixture(scope="session")
def docs() -> list[str]:
    return english_documents()


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory, docs) -> Path:
    """A small byte-level BPE (vocab 1024, EOS id 0) trained on real text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def gpt2_tokenizer_path(tmp_path_factory) -> Path:
    """GPT-2's real vocabulary (tests/data/gpt2, MIT) as a tokenizer.json; EOS id 50256."""
    from pipeline.encoding.tokenizer import from_gpt2_files

    data = REPO / "tests" / "data" / "gpt2"
    out = tmp_path_factory.mktemp("gpt2") / "tokenizer.json"
    return from_gpt2_files(data / "encoder.json", data / "vocab.bpe", out)


@pytest.fixture(scope="session")
def deepseek_v3() -> str:
    """DeepSeek V3's tokenizer.json as published (`published_vocabs.hub_folder`): 128k
    byte-level BPE, three split patterns in a row, an empty normalizer sequence."""
    from published_vocabs import hub_folder

    return str(hub_folder("deepseek_v3") / "tokenizer.json")


@pytest.fixture(scope="session")
def deepseek_v3_tokenizers(deepseek_v3):
    """`tokenizers` on DeepSeek V3's file, the reference (built once: about a second)."""
    from pipeline.encoding.backend import TokenizersEncoder

    return TokenizersEncoder(deepseek_v3)


#: the shared cluster's idle timers, slowed: it waits between tests all session in each
#: pytest-xdist process, where Dask's defaults (a 20 ms event-loop check in the scheduler and
#: nannies, a 100 ms memory poll per worker, 100 ms work stealing) cost 1.7 CPU-s every 30 s
#: against 0.6 (bench/RESULTS.md, "the suite is CPU-bound, and its idle cluster")
IDLE_TIMERS = {
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "2s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.scheduler.work-stealing-interval": "1s",
}


@pytest.fixture(scope="session")
def dask_client():
    """One real local cluster (2 worker processes) shared by the tests that need no other,
    started as `prepare` starts its own (`EarlyStart`), with its idle timers slowed
    (`IDLE_TIMERS`): it stays up all session, in each pytest-xdist worker."""
    import dask
    import distributed  # noqa: F401  (its config keys exist once it is imported)

    from pipeline.run.cluster import EarlyStart

    with dask.config.set(IDLE_TIMERS):  # read as the scheduler, nannies and workers start
        cluster, client = EarlyStart(2, None, threads=1, memory_limit=None).take()
    with cluster, client:
        yield client


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server (moto_server on 127.0.0.1, a free port) for the object-store tests."""
    from support import s3_session_server

    yield from s3_session_server()


@pytest.fixture(scope="session")
def store_setup(tmp_path_factory, docs, tokenizer_path, dask_client):
    """A recipe of 2 MB of real text in 7 partitions, small shards, and the folder of its local
    reference run (what every run of it into a store must equal)."""
    from support import corpus, files_recipe, reference

    d = tmp_path_factory.mktemp("store")
    data = corpus(d / "in.jsonl", docs, copies=3)
    recipe = files_recipe(d / "r.toml", tokenizer_path, data, partition_bytes=300_000, shard_tokens=60_000)
    ref = reference(recipe, d / "ref", dask_client)
    return recipe, ref.parent


@pytest.fixture(scope="session")
def s3_manifest(s3_server, tmp_path_factory, docs, tokenizer_path, dask_client) -> str:
    """A prepared run (train and validation splits, 8+ shards) uploaded to a bucket; its
    manifest's URL. Tests that change what is stored work on a copy (`support.copy_run`)."""
    from support import run_prepare, write_jsonl

    d = tmp_path_factory.mktemp("s3train")
    train = write_jsonl(d / "train.jsonl", docs[:150])
    valid = write_jsonl(d / "valid.jsonl", docs[150:180])
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 25_000,
        "sources": {
            "text": {"type": "files", "splits": {"train": [str(train)], "validation": [str(valid)]}},
        },
    }
    local = run_prepare(recipe, d / "run", dask_client).parent
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for p in sorted(local.rglob("*")):
        if p.is_file() and ".tokshard" not in p.parts:
            s3.put_object(Bucket=bucket, Key=f"run/{p.relative_to(local)}", Body=p.read_bytes())
    return f"s3://{bucket}/run/manifest.json"


@pytest.fixture
def tmpfs(tmp_path):
    """mount(path, size) a tmpfs of our own with a size limit; remount(path, options); all
    unmounted afterwards (needs root to mount: skipped with the reason otherwise)."""
    import subprocess

    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); needs root")
        mounted.append(path)
        return path

    def remount(path: Path, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)

    yield mount, remount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="session")
def busy_setup(tmp_path_factory, docs, tokenizer_path, dask_client):
    """A recipe worth watching or stopping while it runs: 3 MB of real text in 8 partitions,
    each done within its first commit interval; and the folder of its uninterrupted reference
    run."""
    from support import corpus, files_recipe, reference

    d = tmp_path_factory.mktemp("busy")
    data = corpus(d / "in.jsonl", docs, copies=5)
    recipe = files_recipe(d / "r.toml", tokenizer_path, data, partition_bytes=400_000)
    return recipe, reference(recipe, d / "ref", dask_client).parent
