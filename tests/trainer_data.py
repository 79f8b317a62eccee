"""A small real-text manifest for the trainer's tests, made without `tokshard prepare`.

Stands in for the pipeline until `prepare` lands (swap `make_manifest` for it then): it
trains a byte-level BPE on English docstrings of Python's own standard library, encodes
documents the way the design contract says (plain text, EOS only as the separator), writes
shards with the pipeline's writer and a manifest with the pipeline's manifest module.
Deterministic for a given Python: same files, same order, same tokenizer, same bytes.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline import manifest as manifest_mod
from pipeline.shard_writer import ShardSequence

EOS = "<|endoftext|>"
SCHEMA = Path(__file__).resolve().parents[1] / "manifests" / "schema.json"

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


def corpus(sources: dict[str, tuple[str, ...]] = SOURCES) -> dict[str, list[str]]:
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
) -> Path:
    """Write shards + manifest.json under ``out``; the last ``val_docs`` documents of each
    source form its ``validation`` split. ``tokenizer_of`` reuses another manifest's tokenizer
    (a corpus prepared later for the same run). Returns the manifest's path."""
    out.mkdir(parents=True, exist_ok=True)
    texts = corpus(packages)
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
            "origin": {"stdlib_packages": list(packages[name])},
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
            "origin": "trained by tests/trainer_data.py",
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
