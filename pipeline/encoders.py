"""Encoder back ends: the one place that calls a tokenizer library to turn text into ids.

Every back end encodes text as *ordinary text*: the literal text of a special token inside
a document (``<|endoftext|>`` on a web page) becomes ordinary tokens, never the special id,
so only the pipeline's own document separators are EOS ids.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol

import numpy as np

from pipeline.errors import TokshardError
from pipeline.tokenizer import load

#: the exact fast back ends, fastest first (bench/RESULTS.md, "Native encoder"): `auto` takes
#: the first the equivalence check passes
FAST = ("fastokens", "tiktoken")
NAMES = ("auto", "tokenizers", *FAST)


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


def library_versions() -> tuple[tuple[str, str], ...]:
    """The encoder libraries' versions: the equivalence check holds for these only."""
    return tuple((lib, v) for lib in ("fastokens", "tiktoken", "tokenizers") if (v := library_version(lib)))


def _fast(name: str, path: str, threads: int, checked_with: tuple[tuple[str, str], ...]) -> Encoder:
    # The driver compared the encoders before the run; a worker with the same libraries
    # would repeat that for nothing (a quarter of a second), one with others must redo it.
    confirm = checked_with != library_versions()
    if name == "fastokens":
        from pipeline.fastokens_encoder import FastokensEncoder

        return FastokensEncoder(path, threads, confirm=confirm)
    from pipeline.tiktoken_encoder import TiktokenEncoder

    return TiktokenEncoder(path, threads, confirm=confirm)


BACKENDS: dict[str, Callable[[str, int, tuple[tuple[str, str], ...]], Encoder]] = {
    "tokenizers": lambda path, threads, _: TokenizersEncoder(path, threads),
    **{name: functools.partial(_fast, name) for name in FAST},
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

    ``samples`` returns the run's first documents, read only if a check needs them (once).
    `auto` takes the fastest back end in `FAST` that `pipeline.encoder_check` finds gives
    the same ids as `tokenizers`, else `tokenizers`; asking for a fast one where it does
    not is an error that names the reason.
    """
    if requested == "tokenizers":
        return "tokenizers", "requested with --encoder tokenizers"
    if requested not in NAMES:
        raise TokshardError(
            f"encoder {requested!r} is not available; use {', '.join(NAMES[:-1])} or {NAMES[-1]}"
        )
    from pipeline.encoder_check import check

    samples = functools.cache(samples)
    refused: list[str] = []
    for name in FAST if requested == "auto" else (requested,):
        verdict = check(tokenizer_path, samples, name)
        if verdict.equivalent:
            how = "auto" if requested == "auto" else f"requested with --encoder {name}"
            passed_over = "".join(f"; {r}" for r in refused)
            return name, f"{how}: {verdict.reason}{passed_over}"
        if requested != "auto":
            raise TokshardError(
                f"--encoder {name} would change the ids: {verdict.reason}; "
                "use --encoder auto (falls back to tokenizers) or --encoder tokenizers"
            )
        refused.append(f"{name} not used, {verdict.reason}")
    return "tokenizers", f"auto: {'; '.join(refused)}"


def likely_choice(requested: str) -> str:
    """The back end a run will most likely use, built on the workers while the driver checks:
    the one asked for, or for `auto` the fastest installed."""
    if requested != "auto":
        return requested
    from pipeline.fastokens_encoder import available

    return "fastokens" if available() else "tiktoken"


def manifest_entry(name: str, reason: str, threads: int) -> dict[str, object]:
    """The manifest's ``encoder`` entry: which back end, why, and the library that ran it."""
    library = "tokenizers" if name == "tokenizers" else name
    return {"name": name, "reason": reason, "threads": threads, "library": library,
            "version": library_version(library) or "unknown"}  # fmt: skip
