"""Find, check, fingerprint and train tokenizers (`tokenizers` JSON format).

`TOK` on the command line is a tokenizer.json, a folder holding one, or a hub name such as
``gpt2``. Whatever it was, the file is copied beside the manifest and identified by its
sha256, so a prepared folder says exactly which vocabulary made it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.encoding import byte_level
from pipeline.format.atomic import check_writable_dir
from pipeline.format.content_hash import sha256_file
from pipeline.format.errors import TokshardError
from pipeline.format.token_dtypes import TOKEN_DTYPES

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_EOS = "<|endoftext|>"
#: EOS spellings tried in order when a recipe does not name one.
EOS_CANDIDATES = (DEFAULT_EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]")
UINT16_LIMIT = 1 << 16


@dataclass(frozen=True)
class TokenizerInfo:
    """Facts the manifest records and every worker checks."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    eos_token: str
    origin: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def locate(spec: str, revision: str | None = None) -> Path:
    """Turn TOK into a local tokenizer.json (downloading a hub name through the hub cache)."""
    from pipeline.storage.locations import refuse_url

    refuse_url(spec, "tokenizer")
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return path / TOKENIZER_FILE
        raise TokshardError(f"tokenizer folder {path} holds no {TOKENIZER_FILE}; pass the file itself")
    looks_local = spec.startswith((".", "/", "~")) or spec.endswith(".json") or spec.count("/") > 1
    if looks_local:
        raise TokshardError(
            f"no tokenizer at {spec}; pass a tokenizer.json, a folder holding one, or a hub name"
        )
    return _from_hub(spec, revision)


def _from_hub(repo: str, revision: str | None) -> Path:
    """Download tokenizer.json from the hub, failing fast and clearly when it is unreachable."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo, TOKENIZER_FILE, revision=revision, etag_timeout=5))
    except LocalEntryNotFoundError as exc:  # offline, or the hub unreachable: nothing cached
        raise TokshardError(
            f"tokenizer {repo!r} is not in the local hub cache and the hub cannot be reached; "
            "pass a local tokenizer.json with --tokenizer (e.g. one made by `tokshard tokenizer train`)"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise TokshardError(
            f"tokenizer {repo!r} not found on the hub (nor as a local path); check the name"
        ) from exc
    except EntryNotFoundError as exc:
        raise TokshardError(f"hub repo {repo!r} has no {TOKENIZER_FILE}; pass a local file") from exc
    except OSError as exc:
        raise TokshardError(f"cannot fetch tokenizer {repo!r} from the hub: {exc}") from exc


def load(path: str | os.PathLike):
    """A `tokenizers.Tokenizer` for a tokenizer.json, a malformed file a clear error.

    Parsed once per process and content: a run's driver inspects the tokenizer, then checks
    the encoders on its installed copy (0.15 s a parse for GPT-2's). Shared, so set up once
    for every caller: special-token text in a document encodes as text, never as a special
    id (only the pipeline's own separators are EOS ids).
    """
    data = read_bytes(path)
    return _parsed(_Content(hashlib.sha256(data).hexdigest(), data, str(path)))


def unreadable(path: str | os.PathLike, exc: Exception) -> TokshardError:
    """The one error for a tokenizer.json that cannot be read or parsed, whichever encoder reads it."""
    return TokshardError(f"{path} is not a readable tokenizer.json: {exc}")


def read_bytes(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise unreadable(path, exc) from exc


@dataclass(frozen=True)
class _Content:
    """A tokenizer.json's bytes, equal to another by content hash alone (the cache key)."""

    sha256: str
    data: bytes = field(compare=False, repr=False)
    path: str = field(compare=False)


@functools.lru_cache(maxsize=2)
def _parsed(content: _Content):
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(content.data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception for parse errors
        raise unreadable(content.path, exc) from exc
    tok.encode_special_tokens = True
    return tok


def max_id(tok) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(vocab.values()) if vocab else -1


def find_eos(tok, eos_token: str | None, path: str | os.PathLike) -> tuple[int, str]:
    names = (eos_token,) if eos_token else EOS_CANDIDATES
    for name in names:
        tid = tok.token_to_id(name)
        if tid is not None:
            return tid, name
    wanted = repr(eos_token) if eos_token else "any of " + ", ".join(EOS_CANDIDATES)
    raise TokshardError(f"{path} has no EOS token ({wanted}); set eos_token in the recipe")


def check_dtype(vocab_size: int, dtype: str, where: str) -> None:
    """Refuse before any work if an id could not be stored: never truncate silently."""
    if dtype == "uint16" and vocab_size > UINT16_LIMIT:
        raise TokshardError(
            f"{where}: ids go up to {vocab_size - 1}, which does not fit uint16; "
            'pass --dtype uint32 (or dtype = "uint32" in the recipe)'
        )
    if dtype not in TOKEN_DTYPES:
        raise TokshardError(f"dtype {dtype!r} is not supported; use {' or '.join(TOKEN_DTYPES)}")


def inspect_file(path: Path, origin: str, eos_token: str | None, dtype: str) -> TokenizerInfo:
    tok = load(path)
    vocab_size = max_id(tok) + 1
    check_dtype(vocab_size, dtype, f"tokenizer {origin}")
    eos_id, eos_name = find_eos(tok, eos_token, path)
    return TokenizerInfo(
        path=TOKENIZER_FILE,
        sha256=sha256_file(path),
        vocab_size=vocab_size,
        eos_id=eos_id,
        eos_token=eos_name,
        origin=origin,
    )


def resolve(spec: str, eos_token: str | None, dtype: str) -> tuple[Path, TokenizerInfo]:
    """Find TOK and check it fits the run (EOS present, ids fit the dtype)."""
    src = locate(spec)
    return src, inspect_file(src, spec, eos_token, dtype)


def install(src: Path, info: TokenizerInfo, out_dir: Path) -> Path:
    """Copy the tokenizer beside the manifest as ``tokenizer.json`` (once)."""
    from pipeline.format.atomic import copy_file

    dest = out_dir / TOKENIZER_FILE
    if not (dest.exists() and sha256_file(dest) == info.sha256):
        copy_file(src, dest)  # durable and whole (a full disk gives a clear error)
    return dest


def is_byte_level_bpe(tok) -> bool:
    """True for GPT-2 style tokenizers (`pipeline.encoding.byte_level` defines the shape)."""
    return byte_level.is_byte_level_bpe(json.loads(tok.to_str()))


def train(inputs: list[str], vocab_size: int, out_dir: Path, eos_token: str = DEFAULT_EOS) -> Path:
    """Train a byte-level BPE (GPT-2 style) with EOS as its only special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipeline.sources.files import expand

    files = expand(inputs, ".")  # the same globs, and each file once, as `prepare --input`
    if vocab_size < 257 or vocab_size > 4 * UINT16_LIMIT:
        raise TokshardError(f"--vocab-size {vocab_size} is out of range (257 .. {4 * UINT16_LIMIT})")
    check_writable_dir(out_dir, "--out")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(files), trainer)
    dest = out_dir / TOKENIZER_FILE
    tmp = out_dir / (TOKENIZER_FILE + ".tmp")
    try:
        tok.save(str(tmp))
        os.replace(tmp, dest)
    except Exception as exc:  # tokenizers raises a bare Exception for an unwritable path
        tmp.unlink(missing_ok=True)
        raise TokshardError(
            f"--out {out_dir}: cannot write {dest} ({exc}); choose a writable folder"
        ) from exc
    return dest


def from_gpt2_files(encoder_json: Path, vocab_bpe: Path, out: Path, eos_token: str = DEFAULT_EOS) -> Path:
    """A tokenizer.json from OpenAI's original GPT-2 files (encoder.json, vocab.bpe).

    For sites that have those two files but no hub access; ids equal GPT-2's exactly.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads(Path(encoder_json).read_text(encoding="utf-8"))
    lines = Path(vocab_bpe).read_text(encoding="utf-8").splitlines()[1:]  # first line: version
    merges = [tuple(line.split(" ")) for line in lines if line]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(eos_token, special=True)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def _training_texts(files: list[str]):
    """Documents for BPE training: text fields of JSON lines and parquet, whole .txt files."""
    from pipeline.sources.files import iter_texts

    yield from iter_texts(files)


def read_spec(path: str | Path) -> dict[str, Any]:
    """The parsed tokenizer.json: by orjson (a quarter of `json`'s 0.06 s for GPT-2's, on
    every worker's start), by `json` where orjson refuses a file `json` may still read."""
    data = read_bytes(path)
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(data)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise unreadable(path, exc) from exc
