"""The reference back end and the shape every back end has: text in, ids out.

Every back end encodes text as *ordinary text*: the literal text of a special token inside
a document (``<|endoftext|>`` on a web page) becomes ordinary tokens, never the special id,
so only the pipeline's own document separators are EOS ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from pipeline.encoding.tokenizer import load


class Encoder(Protocol):
    name: str

    def encode_batch(self, texts: list[str]) -> Sequence[Sequence[int]]:
        """Ids of each text (a list or a 1-D integer array), no special tokens added,
        special-token text kept as text."""
        ...


def set_threads(threads: int) -> None:
    """One encoder thread per worker process unless asked: processes scale better here.

    Must run before the first parallel call in the process (the Rust thread pool reads the
    environment once).
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)


class TokenizersEncoder:
    """Hugging Face `tokenizers`: exact for every tokenizer.json, the reference."""

    name = "tokenizers"

    def __init__(self, path: str, threads: int = 1) -> None:
        set_threads(threads)
        self.tokenizer = load(path)  # special-token text encodes as text

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]


def library_versions() -> tuple[tuple[str, str], ...]:
    """The encoder libraries' versions: the equivalence check holds for these only."""
    from importlib.metadata import version

    return tuple((lib, version(lib)) for lib in ("tiktoken", "tokenizers"))
