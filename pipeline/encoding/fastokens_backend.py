"""The native back end: `fastokens`, a Rust BPE that reads the tokenizer.json itself.

Built with ``Tokenizer.from_json_str`` from the file's own text (never ``from_tiktoken``,
which parts from `tokenizers` on some Unicode whitespace), so it runs the same
pre-tokenizer regex and merges as the reference. ``encode_batch_flat`` returns one uint32
buffer and per-document offsets: a batch's ids reach the shard writer as numpy views
of that buffer, without a Python int per token.

Narrow interface, so the module can move: `available`, `version`, `FastokensEncoder`.
Only use it where `pipeline.encoding.equivalence` found it gives `tokenizers`' ids (``choose``
does that).
"""

from __future__ import annotations

import itertools
import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

import numpy as np
import orjson

from pipeline.encoding.equivalence import confirm_builtin
from pipeline.encoding.tokenizer import read_bytes, read_spec, unreadable

LIBRARY = "fastokens"


def version() -> str | None:
    """The installed fastokens version, or None where it is not installed."""
    try:
        return _version(LIBRARY)
    except PackageNotFoundError:
        return None


def available() -> bool:
    """Is fastokens importable here (a wheel exists for this platform and it is installed)?"""
    try:
        import fastokens  # noqa: F401
    except ImportError:
        return False
    return True


def set_threads(threads: int) -> None:
    """fastokens' own BPE thread pool: one thread per worker process unless asked (processes
    scale better). Read when the library first encodes, so set before that."""
    os.environ["FASTOKENS_BPE_THREADS"] = str(threads)


def file_text(path: str) -> str:
    try:
        return read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise unreadable(path, exc) from exc


def encoding_part(path: str) -> str:
    """The tokenizer.json's text without the parts encoding never runs here (post-processor,
    decoder), for the files whose own text fastokens refuses for one of those (RoBERTa's
    ``RobertaProcessing``): we never add special tokens or decode. Text, because
    ``from_json_str`` takes JSON: the vocabulary, merges, pre-tokenizer and added tokens pass
    through unchanged."""
    spec = read_spec(path)
    spec["post_processor"] = None
    spec["decoder"] = None
    return orjson.dumps(spec).decode("utf-8")


class FastokensEncoder:
    """fastokens on a tokenizer.json: `tokenizers`' ids where the check says so, flat arrays out."""

    name = LIBRARY

    def __init__(self, path: str, threads: int = 1, confirm: bool = True) -> None:
        set_threads(threads)
        import fastokens

        text = file_text(path)  # as it is, most often: parsing and rewriting it costs each worker's start
        try:
            self.tokenizer = fastokens.Tokenizer.from_json_str(text)
        except ValueError:  # a part encoding never runs that fastokens cannot build
            self.tokenizer = fastokens.Tokenizer.from_json_str(encoding_part(path))
        if confirm:
            confirm_builtin(path, self)

    @classmethod
    def wrapping(cls, tokenizer) -> FastokensEncoder:
        """An encoder around a fastokens Tokenizer built some other way (the check's tests use
        ``from_tiktoken``, the inexact route, to prove the check refuses it)."""
        self = cls.__new__(cls)
        self.tokenizer = tokenizer
        return self

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids as one uint32 array, and ``len(texts) + 1`` int64 offsets into it.
        Special-token text is encoded as text (``split_special_tokens``)."""
        ids, offsets = self.tokenizer.encode_batch_flat(
            texts, add_special_tokens=False, split_special_tokens=True
        )
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids, offsets = self.encode_flat(texts)
        bounds = offsets.tolist()
        return [ids[a:b] for a, b in itertools.pairwise(bounds)]
