"""Shared fixtures: real text, a real tokenizer, a real Dask cluster, the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never reach the hub: fail at once instead of retrying (set before any library loads).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from support import EOS, REPO, english_documents


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory) -> Path:
    """The suite's own ~/.cache (XDG_CACHE_HOME), shared by its tests as by a user's runs:
    nothing is written to the real one, and no earlier session's kept checks count."""
    folder = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(folder))
        yield folder


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
def dask_client():
    """One real local cluster (2 worker processes) shared by the tests that need no other."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
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
