"""Helpers the tests share (fixtures are in conftest.py, which imports these).

- real text and the reference encoding: `english_documents`, `plain_encode`, `stream_of`;
- running tokshard as users do: `cli` (a fresh process), `run_prepare` (in process);
- crash and resume: a corpus worth killing, real `prepare` processes, byte-for-byte
  comparison of two output folders (`files_recipe`, `start_prepare`, `assert_same_output`...);
- the trainer's small real-text manifest, made without `tokshard prepare`: a byte-level BPE
  trained on docstrings of Python's own standard library, documents encoded the way the
  design contract says, shards and manifest written with the format contract's own writers
  (`make_manifest`, `cached_manifest`). Deterministic for a given Python.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import http.server
import importlib
import json
import os
import pkgutil
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline import recipe as recipe_mod
from pipeline.encoding.byte_level import LLAMA3_PATTERN  # noqa: F401  (tests import it from here)
from pipeline.format import manifest as manifest_mod
from pipeline.format.shard_writer import ShardSequence
from pipeline.run.driver import RunOptions, prepare
from pipeline.run.run_state import STATE_DIR

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
EOS = "<|endoftext|>"
SCHEMA = REPO / "manifests" / "schema.json"


# --- real text, the reference encoding, the CLI ---------------------------------------------


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
    from pipeline.format import manifest

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


def run_prepare(recipe_dict: dict, out: Path, client=None, where: str = "test", log=None) -> Path:
    """Prepare in-process on the shared cluster (the CLI path has its own tests)."""
    from pipeline import recipe
    from pipeline.run.driver import RunOptions, prepare

    r = recipe.from_dict(recipe_dict, where)
    path = prepare(r, out, RunOptions(client=client), log=log or (lambda msg: None))
    validate_manifest(path)
    return path


def prepared_with_an_emptied_source(folder: Path, tokenizer: Path) -> Path:
    """A manifest `tokshard prepare` made of a source of real text ('good') and one ('broken')
    whose 12 records were all bad, skipped under on_bad_record = "skip": the manifest lists it
    and its counts, with no shards."""
    good = write_jsonl(folder / "good.jsonl", english_documents(200))
    broken = folder / "broken.jsonl"
    broken.write_text('{"text": "cut short\n' * 12)
    recipe = folder / "recipe.toml"
    recipe.write_text(
        f'tokenizer = "{tokenizer}"\non_bad_record = "skip"\n'
        f'[sources.good]\ntype = "files"\npaths = ["{good}"]\n'
        f'[sources.broken]\ntype = "files"\npaths = ["{broken}"]\n'
    )
    cli("prepare", str(recipe), "--out", str(folder / "out"), "--workers", "1", check=True)
    return folder / "out" / manifest_mod.MANIFEST_NAME


def as_an_older_tokshard_left_it(out) -> None:
    """Make ``out`` what a tokshard that recorded no provenance left: no ``.origin`` sidecars
    and no open shard's origin logs, checkpoints (and the manifest) whose shard records have no
    ``origin_hash``/``origin_bytes`` and no ``routed`` count, as that version wrote them."""
    from pipeline.format import manifest, provenance

    for suffix in (provenance.SUFFIX, provenance.LOG_SUFFIX, provenance.INPUTS_SUFFIX):
        for path in out.rglob(f"*{suffix}*"):
            path.unlink()
    for path in out.glob(".tokshard/parts/**/*.json"):
        ck = json.loads(path.read_text())
        ck.pop("routed", None)
        for rec in ck["closed"]:
            del rec["origin_hash"], rec["origin_bytes"]
        path.write_text(json.dumps(ck))
    if (out / manifest.MANIFEST_NAME).exists():
        doc = json.loads((out / manifest.MANIFEST_NAME).read_text())
        for shard in doc["shards"]:
            del shard["origin_hash"], shard["origin_bytes"]
        manifest.write(out, {k: v for k, v in doc.items() if k != "checksum"})


def cli(*args: str, check: bool = False, timeout: float = 300, env: dict | None = None, cwd=None):
    """Run `tokshard ARGS` as a user would (a fresh process), returning CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "tokshard", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"tokshard {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def one_error_line(proc) -> str:
    """The single `tokshard: error:` line a failed command must end with (and no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert lines and lines[-1].startswith("tokshard: error: "), proc.stderr
    assert [line for line in lines if line.startswith("tokshard: error: ")] == lines[-1:], proc.stderr
    return lines[-1]


def as_a_limited_user(argv: list[str], user: str, processes: int) -> list[str]:
    """``argv`` run as ``user`` (made if missing) under ``ulimit -u processes``: root is never
    held to that limit. The process keeps root's right to read and write any file (ambient
    capabilities), so the test's files and this interpreter need no new permissions. Skips
    the test where this is not root or useradd or setpriv is missing. A user of its own per
    test: the limit counts every thread of the user's processes."""
    import pytest

    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv: ulimit -u holds only a user other than root")
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", user], check=True, capture_output=True)
    caps = "+dac_override,+dac_read_search"
    inner = f'ulimit -u {processes} && exec "$@"'
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", f"--inh-caps={caps}",
            f"--ambient-caps={caps}", "bash", "-c", inner, "bash", *argv]  # fmt: skip


def train_tokenizer_json(
    path: Path,
    docs: list[str],
    *,
    model: str = "bpe",
    normalizer=None,
    split: str | None = None,
    specials: tuple[str, ...] = (EOS,),
    full_alphabet: bool = True,
    vocab_size: int = 600,
) -> Path:
    """A real tokenizer trained on real text, in one of the shapes a user may bring."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet() if full_alphabet else []
    if model == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", *specials])
    elif model == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(specials))
    else:
        tok = Tokenizer(models.BPE())
        if split is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), "isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(specials),
            initial_alphabet=alphabet,
            show_progress=False,
        )
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.train_from_iterator(docs, trainer)
    if "</s>" in specials:
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def edited(src: Path, dest: Path, edit) -> Path:
    """A copy of a tokenizer.json changed by ``edit(spec)``, as a hand-edited file would be."""
    spec = json.loads(src.read_text())
    edit(spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(spec, ensure_ascii=False))
    return dest


def plain_added_token(spec):
    spec["added_tokens"].append(
        {"id": 1024, "content": "hello world", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False}
    )  # fmt: skip


# --- crash and resume -------------------------------------------------------------------------


def files_recipe(path: Path, tokenizer: Path, data: Path, partition_bytes: int, **settings: Any) -> Path:
    """A recipe file for one files source, as a user writes it."""
    top = {"tokenizer": str(tokenizer), **settings}
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    lines += [
        "[sources.text]",
        'type = "files"',
        f"paths = [{json.dumps(str(data))}]",
        f"partition_bytes = {partition_bytes}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def corpus(path: Path, docs: list[str], copies: int, long_doc_copies: int = 0) -> Path:
    """Real text, repeated; with ``long_doc_copies`` one document that long in the middle
    (over 1M characters it is encoded piece by piece, with commit points inside it)."""
    texts = docs * copies
    if long_doc_copies:
        texts.insert(len(texts) // 2, "\n\n".join(docs * long_doc_copies))
    return write_jsonl(path, texts)


def reference(recipe_path: Path, out: Path, client) -> Path:
    """The uninterrupted run every interrupted one must equal (same recipe file)."""
    r = recipe_mod.load(recipe_path)
    return prepare(r, out, RunOptions(client=client), log=lambda m: None)


#: the command after it with SIGHUP and SIGINT at their defaults, as a command typed at a
#: terminal has them: a suite started under ``nohup`` (or by a runner that ignores SIGHUP), or
#: in the background of a script (``pytest &``: the shell ignores SIGINT for it), passes the
#: ignoring on to every process it starts, and a command started ignoring a signal keeps
#: ignoring it
AS_AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


def start_prepare(recipe_path: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`tokshard prepare` as its own process group (so a test can kill it like a machine),
    started as at a terminal."""
    cmd = [
        *AS_AT_A_TERMINAL,
        sys.executable,
        "-m",
        "tokshard",
        "prepare",
        str(recipe_path),
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@contextlib.contextmanager
def paused(proc: subprocess.Popen):
    """The process group of ``proc`` (`start_prepare`) stopped while the block runs, so what the
    test does there lands between two of the run's steps however fast or slow the machine."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc: no extra dependency)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def dask_worker_pids(driver_pid: int) -> list[int]:
    """The local Dask worker processes a `prepare` driver spawned."""
    pids = []
    for pid in children(driver_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            pids.append(pid)
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def checkpoints(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / STATE_DIR / "parts").rglob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now
    return found


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc=None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def output_files(folder: Path) -> list[str]:
    """Every file a reader may see (the run state under .tokshard/ excluded)."""
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and STATE_DIR not in p.parts
    )


def assert_same_output(ref: Path, out: Path, context: str = "") -> None:
    """Shards, indexes, tokenizer byte for byte; the manifest equal but for its creation time."""
    got, want = set(output_files(out)), set(output_files(ref))
    assert got == want, f"extra {sorted(got - want)}, missing {sorted(want - got)} {context}"
    for rel in output_files(ref):
        a, b = (ref / rel).read_bytes(), (out / rel).read_bytes()
        if rel == "manifest.json":
            a_doc, b_doc = json.loads(a), json.loads(b)
            for doc in (a_doc, b_doc):
                del doc["created"], doc["checksum"]
            assert a_doc == b_doc, f"manifest differs {context}"
        else:
            assert a == b, f"{rel} differs {context}"


def leftovers(out: Path) -> list[Path]:
    """Temporary files and spools that must not survive a completed run."""
    return [*out.rglob("*.tmp"), *(out / STATE_DIR / "spool").glob("*")]


# --- the trainer's manifest -------------------------------------------------------------------

#: source name -> stdlib packages whose docstrings make its documents
SOURCES: dict[str, tuple[str, ...]] = {
    "stdlib": ("email", "json", "http", "logging", "unittest", "xml", "importlib", "concurrent"),
    "asyncio": ("asyncio", "multiprocessing", "urllib", "sqlite3", "tomllib", "zoneinfo"),
}


def docstring_documents(package: str) -> list[str]:
    """One document per module: its module, class and function docstrings, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"]) / package
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts[len(root.parts) - 1 :]:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = [tree, *ast.walk(tree)]
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        parts = [ast.get_docstring(n) for n in nodes if isinstance(n, kinds)]
        text = "\n\n".join(dict.fromkeys(p.strip() for p in parts if p and p.strip()))
        if text:
            docs.append(text)
    return docs


def docstring_corpus(sources: dict[str, tuple[str, ...]] = SOURCES) -> dict[str, list[str]]:
    return {name: [d for pkg in pkgs for d in docstring_documents(pkg)] for name, pkgs in sources.items()}


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.encode_special_tokens = True
    return tok


def encode(tok: Tokenizer, docs: list[str], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token stream ``doc_1 EOS doc_2 EOS ...`` and per-document lengths (EOS included)."""
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    tokens = np.fromiter((t for d in ids for t in [*d, eos_id]), dtype=np.int64)
    return tokens, np.array([len(d) + 1 for d in ids], dtype=np.int32)


def make_manifest(
    out: Path,
    *,
    vocab_size: int = 1024,
    shard_tokens: int = 20_000,
    val_docs: int = 8,
    packages: dict[str, tuple[str, ...]] = SOURCES,
    tokenizer_of: Path | None = None,
    more: dict[str, list[str]] | None = None,
) -> Path:
    """Write shards + manifest.json under ``out``; the last ``val_docs`` documents of each
    source form its ``validation`` split. ``tokenizer_of`` reuses another manifest's tokenizer
    (a corpus prepared later for the same run); ``more`` adds sources of these documents.
    Returns the manifest's path."""
    out.mkdir(parents=True, exist_ok=True)
    texts = {**docstring_corpus(packages), **(more or {})}
    tok_path = out / manifest_mod.TOKENIZER_NAME
    if tokenizer_of is not None:
        tok_path.write_bytes(manifest_mod.load(tokenizer_of).tokenizer_path.read_bytes())
        tok = Tokenizer.from_file(str(tok_path))
        tok.encode_special_tokens = True
    else:
        tok = train_tokenizer([d for docs in texts.values() for d in docs], vocab_size)
        tok.save(str(tok_path))
    eos_id = tok.token_to_id(EOS)
    shards, sources = [], {}
    for name, docs in texts.items():
        splits = {}
        for split, part in (("train", docs[:-val_docs]), ("validation", docs[-val_docs:])):
            tokens, lengths = encode(tok, part, eos_id)
            seq = ShardSequence(out, f"{name}/{split}/00000", "uint16", shard_tokens)
            seq.add(tokens, lengths)
            records = seq.finish()
            shards += [{**r.to_json(), "source": name, "split": split} for r in records]
            splits[split] = {
                "documents": len(part),
                "tokens": int(lengths.sum()),
                "shards": len(records),
                "partitions": 1,
                "dropped_empty": 0,
                "skipped": {},
            }
        sources[name] = {
            "type": "files",
            "origin": {"stdlib_packages": list(packages.get(name, ()))},
            "splits": splits,
        }
    recipe = {"sources": {name: {"type": "files"} for name in texts}}
    doc = manifest_mod.build(
        recipe=recipe,
        recipe_hash=manifest_mod.content_hash(recipe),
        dtype="uint16",
        tokenizer={
            "path": manifest_mod.TOKENIZER_NAME,
            "sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
            "vocab_size": tok.get_vocab_size(),
            "eos_id": eos_id,
            "eos_token": EOS,
            "origin": "trained by tests/support.py",
        },
        encoder={"name": "tokenizers", "reason": "test helper"},
        sources=sources,
        shards=shards,
    )
    return manifest_mod.write(out, doc)


def cached_manifest(tmp_path_factory) -> Path:
    """One manifest per test session (made on first use, about two seconds)."""
    root = tmp_path_factory.getbasetemp() / "trainer-manifest"
    path = root / manifest_mod.MANIFEST_NAME
    if not path.is_file():
        make_manifest(root)
    return path


# --- the trainer as users run it --------------------------------------------------------------

#: the shipped DeepSpeed configs
CONFIGS = REPO / "trainer" / "configs"
SMALL = ["--model", "tiny", "--seq-len", "32", "--log-every", "1", "--eval-samples", "8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str, procs: int = 1, launcher: str = "python", timeout: int = 240):
    """Run the trainer as users do; returns the finished process (output captured)."""
    if launcher == "python":
        cmd = [sys.executable, "-m", "tokshard", "train"]
    elif launcher == "deepspeed":
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(procs)]
        cmd += ["--master_port", str(free_port()), "--module", "tokshard", "train"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs)]
        cmd += ["--master_port", str(free_port()), "-m", "tokshard", "train"]
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    # torchrun leaves a torchelastic_* folder in the temporary folder after every run
    with tempfile.TemporaryDirectory(prefix="launch-") as scratch:
        env["TMPDIR"] = scratch
        done = subprocess.run(
            [*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    assert done.returncode == 0, f"{' '.join([*cmd, *args])}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "loss" in x], [x for x in lines if "eval_loss" in x]


def samples_by_step(run_dir: Path) -> dict[int, list[tuple]]:
    """Every sample each step trained on, over all ranks: (position, source, window, crc32)."""
    steps: dict[int, list[tuple]] = defaultdict(list)
    for path in run_dir.glob("samples-rank*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            steps[r["step"]] += zip(r["positions"], r["sources"], r["windows"], r["crc32"], strict=True)
    return {k: sorted(v) for k, v in sorted(steps.items())}


# --- a real S3 API server ---------------------------------------------------------------------
# moto's standalone `moto_server`, started by the tests on 127.0.0.1 and a free port. Clients
# find it the way users' tools find S3: through AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY in the environment.


def moto_server_command() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    return [str(exe)] if exe.exists() else [shutil.which("moto_server") or "moto_server"]


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to talk to this server (and nothing else)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials(self.env))

    def new_bucket(self) -> str:
        name = f"tokshard-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key (relative to prefix) -> bytes."""
        s3 = self.client()
        found = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                found[key[len(prefix) :].lstrip("/")] = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return found


def _boto_credentials(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


@contextlib.contextmanager
def moto_server(extra_env: dict[str, str] | None = None) -> Iterator[S3Server]:
    port = free_port()
    argv = [*moto_server_command(), "-H", "127.0.0.1", "-p", str(port)]
    endpoint = f"http://127.0.0.1:{port}"
    with serving(argv, f"{endpoint}/moto-api/", "moto_server", {**os.environ, **(extra_env or {})}) as proc:
        yield S3Server(endpoint, proc)


@contextlib.contextmanager
def serving(
    argv: list[str], probe: str, what: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """A server process, once ``probe`` (a URL) answers; stopped at the end."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(probe, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def s3_session_server() -> Iterator[S3Server]:
    """One server for the session (conftest's ``s3_server`` fixture); the test process's
    environment points at it."""
    with moto_server() as server, _environment(server.env):
        yield server


def gcs_emulator_command() -> list[str]:
    exe = Path(sys.executable).with_name("gcp-storage-emulator")
    return [str(exe)] if exe.exists() else [shutil.which("gcp-storage-emulator") or "gcp-storage-emulator"]


@dataclass
class GCSServer:
    """A Google Cloud Storage JSON API server (gcp-storage-emulator), reached as gcsfs reaches
    one: ``STORAGE_EMULATOR_HOST``. As published it keeps no preconditions (``ifGenerationMatch``);
    `gcs_emulator(preconditions=True)` starts it with GCS's (tests/gcs_preconditions.py)."""

    endpoint: str
    proc: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "tokshard-tests"}

    def fs(self):
        """A client as tokshard's own (by ``env``: an explicit anonymous token would send gcsfs
        to Google's control API for the bucket's type, which no test machine reaches)."""
        import gcsfs

        assert os.environ.get("STORAGE_EMULATOR_HOST") == self.endpoint, "use gcs_emulator()'s server"
        return gcsfs.GCSFileSystem(skip_instance_cache=True)

    def new_bucket(self) -> str:
        name = f"tokshard-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=tokshard-tests",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).close()
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key (relative to prefix) -> bytes."""
        fs = self.fs()
        root = f"{bucket}/{prefix}".rstrip("/")
        return {path[len(root) :].lstrip("/"): fs.cat_file(path) for path in fs.find(root)}

    def upload(self, folder: Path, bucket: str, prefix: str) -> None:
        """Put every file of a prepared folder (its run state left out) under ``prefix``."""
        fs = self.fs()
        for rel, data in sorted(local_output(folder).items()):
            fs.pipe_file(f"{bucket}/{prefix}/{rel}", data)


@contextlib.contextmanager
def gcs_emulator(preconditions: bool = False) -> Iterator[GCSServer]:
    port = free_port()
    command = (
        [sys.executable, str(TESTS / "gcs_preconditions.py")] if preconditions else gcs_emulator_command()
    )
    argv = [*command, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    endpoint = f"http://127.0.0.1:{port}"
    with serving(argv, f"{endpoint}/storage/v1/b?project=tokshard-tests", "gcp-storage-emulator") as proc:
        server = GCSServer(endpoint, proc)
        with _environment(server.env):
            yield server


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload_folder(server: S3Server, folder: Path, bucket: str, prefix: str) -> None:
    """Put every file of a prepared folder (its run state left out) under ``prefix``."""
    s3 = server.client()
    for rel, data in sorted(local_output(folder).items()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


def copy_run(server: S3Server, manifest_url: str) -> str:
    """A copy of a stored run in a bucket of its own (for a test that changes what is stored);
    the copy's manifest URL."""
    bucket, key = manifest_url.removeprefix("s3://").split("/", 1)
    prefix = key.rsplit("/", 1)[0]
    new = server.new_bucket()
    s3 = server.client()
    for rel, data in server.objects(bucket, prefix).items():
        s3.put_object(Bucket=new, Key=f"{prefix}/{rel}", Body=data)
    return f"s3://{new}/{key}"


def local_output(folder: Path) -> dict[str, bytes]:
    """Every file a reader of a prepared folder sees (its run state left out), by name."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and STATE_DIR not in p.parts
    }


def assert_same_as_local(server: S3Server | GCSServer, bucket: str, prefix: str, ref: Path) -> None:
    """Every .bin, .idx and the tokenizer in the store byte for byte those of the local run
    ``ref``; the manifest's shard list, totals and sources equal."""
    stored = {k: v for k, v in server.objects(bucket, prefix).items() if not k.startswith(f"{STATE_DIR}/")}
    local = local_output(ref)
    assert sorted(stored) == sorted(local)
    for rel, data in local.items():
        if rel == "manifest.json":
            a, b = json.loads(data), json.loads(stored[rel])
            assert a["shards"] == b["shards"] and a["totals"] == b["totals"] and a["sources"] == b["sources"]
        else:
            assert stored[rel] == data, rel


def gpt2_through_from_tiktoken(gpt2: Path, work: Path):
    """fastokens built by its own ``from_tiktoken`` route from GPT-2's ranks and split pattern:
    the route the issue found inexact (it parts from `tokenizers` around U+180E)."""
    import base64

    import fastokens

    from pipeline.encoding.fastokens_backend import FastokensEncoder
    from pipeline.encoding.tiktoken_backend import TiktokenEncoder

    conversion = TiktokenEncoder(str(gpt2)).conversion
    ranks = work / "gpt2.tiktoken"
    ranks.write_text(
        "".join(
            f"{base64.b64encode(b).decode()} {r}\n"
            for b, r in sorted(conversion.ranks.items(), key=lambda kv: kv[1])
        )
    )
    tok = fastokens.Tokenizer.from_tiktoken(
        str(ranks), pattern=conversion.pattern, special_tokens=conversion.special_tokens
    )
    return FastokensEncoder.wrapping(tok)


class _GatedHub(http.server.BaseHTTPRequestHandler):
    """The hub's answer for a gated repo (Llama's, Gemma's) to a user who has not accepted its
    terms: 403 with the hub's error code, which huggingface_hub turns into GatedRepoError."""

    def answer(self) -> None:
        self.send_response(403)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model meta-llama/Meta-Llama-3-8B is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = answer

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def http_serving(handler: Any) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering with ``handler``, for the block: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def web_folder(folder: Path) -> contextlib.AbstractContextManager[str]:
    """``folder`` served by Python's own file server (no listing API, no byte ranges): its URL."""
    return http_serving(functools.partial(_QuietFiles, directory=str(folder)))


def gated_hub() -> contextlib.AbstractContextManager[str]:
    """An endpoint (for HF_ENDPOINT) that answers every request as the hub does for a gated repo."""
    return http_serving(_GatedHub)


def unchecked_strings(values: list[bytes]):
    """An Arrow string column built from raw bytes, unchecked, as Spark and other writers store
    web text: Arrow takes bytes that are not UTF-8 without looking."""
    import pyarrow as pa

    offsets = np.cumsum([0, *map(len, values)]).astype(np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def rank_killed(folder: Path, rank: int, at: str) -> dict[str, str]:
    """The environment of a `tokshard train` whose rank ``rank`` kills itself (SIGKILL, as the
    OOM killer or a lost node would end it) at ``at``: "save" (its first write into a
    checkpoint's unfinished ``.partial`` folder) or "backward:N" (its Nth backward pass, that
    is step N with one micro-batch a step). A `sitecustomize` on PYTHONPATH, so the moment is
    the same on every machine."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import os, signal\n"
        f"if os.environ.get('RANK', '0') == '{rank}' and 'TOKSHARD_KILL_AT' in os.environ:\n"
        "    import torch\n"
        "    where, _, n = os.environ['TOKSHARD_KILL_AT'].partition(':')\n"
        "    calls = [0]\n"
        "    def killing(real, now):\n"
        "        def wrapper(*args, **kwargs):\n"
        "            calls[0] += 1\n"
        "            if now(args, calls[0]):\n"
        "                os.kill(os.getpid(), signal.SIGKILL)\n"
        "            return real(*args, **kwargs)\n"
        "        return wrapper\n"
        "    if where == 'save':\n"
        "        torch.save = killing(torch.save, lambda args, _: '.partial' in str(args[1]))\n"
        "    else:\n"
        "        torch.autograd.backward = killing(torch.autograd.backward, lambda _, k: k == int(n))\n"
    )
    return {"PYTHONPATH": f"{folder}{os.pathsep}{REPO}", "TOKSHARD_KILL_AT": at}
