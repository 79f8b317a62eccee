"""Encoder back ends: the one place that calls a tokenizer library to turn text into ids.

Every back end encodes text as *ordinary text*: the literal text of a special token inside
a document (``<|endoftext|>`` on a web page) becomes ordinary tokens, never the special id,
so only the pipeline's own document separators are EOS ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

from pipeline.errors import TokshardError
from pipeline.tokenizer import load


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


def _tiktoken(path: str, threads: int, checked_with: tuple[tuple[str, str], ...]) -> Encoder:
    from pipeline.tiktoken_encoder import TiktokenEncoder

    # The driver compared both encoders before the run; a worker with the same libraries
    # would repeat that for nothing (a quarter of a second), one with others must redo it.
    return TiktokenEncoder(path, threads, confirm=checked_with != library_versions())


BACKENDS: dict[str, Callable[[str, int, tuple[tuple[str, str], ...]], Encoder]] = {
    "tokenizers": lambda path, threads, _: TokenizersEncoder(path, threads),
    "tiktoken": _tiktoken,
}


@lru_cache(maxsize=4)
def cached_encoder(
    name: str, path: str, sha256: str, threads: int, checked_with: tuple[tuple[str, str], ...] = ()
) -> Encoder:
    """One encoder per worker process and tokenizer (``sha256`` keys the cache on content).

    ``checked_with``: the library versions the driver's equivalence check ran with."""
    if name not in BACKENDS:
        raise TokshardError(f"encoder {name!r} is not available; use one of {', '.join(BACKENDS)}")
    return BACKENDS[name](path, threads, checked_with)


def choose(requested: str, tokenizer_path: str, samples: Callable[[], list[str]]) -> tuple[str, str]:
    """Pick the back end for a run and say why (the reason goes into the log and manifest).

    ``samples`` returns the run's first documents, read only if a check needs them. `auto`
    takes tiktoken only where `pipeline.encoder_check` finds it gives the same ids as
    `tokenizers`; asking for tiktoken where it does not is an error that names the reason.
    """
    if requested == "tokenizers":
        return "tokenizers", "requested with --encoder tokenizers"
    if requested not in ("auto", "tiktoken"):
        raise TokshardError(f"encoder {requested!r} is not available; use auto, tokenizers or tiktoken")
    from pipeline.encoder_check import check

    verdict = check(tokenizer_path, samples)
    if verdict.equivalent:
        how = "auto" if requested == "auto" else "requested with --encoder tiktoken"
        return "tiktoken", f"{how}: {verdict.reason}"
    if requested == "tiktoken":
        raise TokshardError(
            f"--encoder tiktoken would change the ids: {verdict.reason}; "
            "use --encoder auto (falls back to tokenizers) or --encoder tokenizers"
        )
    return "tokenizers", f"auto: tiktoken not used, {verdict.reason}"
