"""Shared fixtures: real text, a real tokenizer, a real Dask cluster, the real CLI."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"

# Tests never reach the hub: fail at once instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def english_documents(limit: int | None = None) -> list[str]:
    """Real English prose available on every machine: the standard library's docstrings.

    Deterministic for one Python version (sorted modules, then sorted members).
    """
    docs: list[str] = []
    names = sorted(
        m.name
        for m in pkgutil.iter_modules()
        if m.name in sys.stdlib_module_names
        and not m.name.startswith("_")
        and m.name not in {"this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo"}
    )
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        parts = [mod.__doc__ or ""]
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr, None)
            doc = getattr(obj, "__doc__", None)
            if callable(obj) and isinstance(doc, str) and getattr(obj, "__module__", None) == name:
                parts.append(f"{attr}\n{doc}")
        text = "\n\n".join(p for p in parts if p.strip())
        if len(text) > 200:
            docs.append(text)
        if limit and len(docs) >= limit:
            break
    return docs


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
    from pipeline.tokenizer import from_gpt2_files

    data = REPO / "tests" / "data" / "gpt2"
    out = tmp_path_factory.mktemp("gpt2") / "tokenizer.json"
    return from_gpt2_files(data / "encoder.json", data / "vocab.bpe", out)


def plain_encode(tokenizer_path: Path, docs: list[str]) -> np.ndarray:
    """The reference: encode(doc_1) + [EOS] + encode(doc_2) + [EOS] ... with the plain API."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.encode_special_tokens = True
    eos = tok.token_to_id(EOS)
    out: list[int] = []
    for doc in docs:
        if doc.strip():
            out += tok.encode(doc, add_special_tokens=False).ids
            out.append(eos)
    return np.array(out, dtype=np.uint16)


def stream_of(manifest_path: Path, source: str | None = None, split: str | None = None) -> np.ndarray:
    """A source/split's shards concatenated in manifest order."""
    from pipeline import manifest

    m = manifest.load(manifest_path)
    parts = [np.fromfile(s.bin_path, dtype=np.uint16) for s in m.select(source, split)]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({field: d}) + "\n")
    return path


def validate_manifest(path: Path) -> dict:
    """Every manifest a test produces must satisfy manifests/schema.json."""
    import jsonschema

    schema = json.loads((REPO / "manifests" / "schema.json").read_text())
    data = json.loads(Path(path).read_text())
    jsonschema.validate(data, schema, format_checker=jsonschema.FormatChecker())
    return data


@pytest.fixture(scope="session")
def dask_client():
    """One real local cluster (2 worker processes) shared by the tests that need no other."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        yield client


def run_prepare(recipe_dict: dict, out: Path, client=None, where: str = "test") -> Path:
    """Prepare in-process on the shared cluster (the CLI path has its own tests)."""
    from pipeline import recipe
    from pipeline.runner import RunOptions, prepare

    r = recipe.from_dict(recipe_dict, where)
    path = prepare(r, out, RunOptions(client=client), log=lambda msg: None)
    validate_manifest(path)
    return path


def cli(*args: str, check: bool = False, timeout: float = 300, env: dict | None = None, cwd=None):
    """Run `tokshard ARGS` as a user would (a fresh process), returning CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"tokshard {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server (moto_server on 127.0.0.1, a free port) for the object-store tests."""
    from s3_support import session_server

    yield from session_server()
