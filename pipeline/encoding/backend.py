"""The reference back end and the shape every back end has: text in, ids out.

Every back end encodes text as *ordinary text*: the literal text of a special token inside
a document (``<|endoftext|>`` on a web page) becomes ordinary tokens, never the special id,
so only the pipeline's own document separators are EOS ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import numpy as np

from pipeline.encoding.tokenizer import load


class Encoder(Protocol):
    name: str

    def encode_batch(self, texts: list[str]) -> Sequence[Sequence[int]]:
        """Ids of each text (a list or a 1-D integer array), no special tokens added,
        special-token text kept as text."""
        ...

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one integer array and ``len(texts) + 1`` offsets into it."""
        ...


def flat(encoded: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text ids joined into one array with offsets, for back ends that return them apart."""
    lengths = np.fromiter((len(ids) for ids in encoded), np.int64, len(encoded))
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not encoded:
        return np.zeros(0, np.uint32), offsets
    return np.concatenate([np.asarray(ids, np.uint32) for ids in encoded]), offsets


def set_threads(threads: int) -> None:
    """One encoder thread per worker process unless asked: processes scale better here.

    Must run before the first parallel call in the process (the Rust thread pool reads the
    environment once).
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)


#: the reference back end's library: every run's ids depend on its version (a fast back end
#: is checked against it, fastokens sends a class of documents to it)
REFERENCE = "tokenizers"


class TokenizersEncoder:
    """Hugging Face `tokenizers`: exact for every tokenizer.json, the reference."""

    name = "tokenizers"

    def __init__(self, path: str, threads: int = 1) -> None:
        set_threads(threads)
        self.tokenizer = load(path)  # special-token text encodes as text

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat(self.encode_batch(texts))


def library_version(lib: str) -> str | None:
    """A library's installed version, None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(lib)
    except PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def library_versions() -> tuple[tuple[str, str], ...]:
    """The encoder libraries' versions: the equivalence check holds for these only. Read once
    a process (the libraries it has loaded do not change; each lookup scans site-packages)."""
    return tuple((lib, v) for lib in ("fastokens", "tiktoken", "tokenizers") if (v := library_version(lib)))
