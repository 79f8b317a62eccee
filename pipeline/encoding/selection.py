"""Which back end a run uses (`choose`, after `check`), and each worker's one encoder
(`cached_encoder`).

The top of the encoding layers: it imports the back ends (`backend`, `tiktoken_backend`)
and the comparisons that prove them equal (`equivalence`); none of those imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from pipeline.encoding import BACKEND_NAMES
from pipeline.encoding.backend import Encoder, TokenizersEncoder, library_versions
from pipeline.encoding.equivalence import SAMPLE_DOC_CHARS, SAMPLE_DOCS, Verdict, compare, probes, show
from pipeline.encoding.tiktoken_backend import NotEquivalent, TiktokenEncoder
from pipeline.format.errors import TokshardError


def _tiktoken(path: str, threads: int, checked_with: tuple[tuple[str, str], ...]) -> Encoder:
    # The driver compared both encoders before the run; a worker with the same libraries
    # would repeat that for nothing (a quarter of a second), one with others must redo it.
    return TiktokenEncoder(path, threads, confirm=checked_with != library_versions())


def _tokenizers(path: str, threads: int, checked_with: tuple[tuple[str, str], ...]) -> Encoder:
    return TokenizersEncoder(path, threads)


#: each back end's factory, under its name in `pipeline.encoding.BACKEND_NAMES`
BACKENDS: dict[str, Callable[[str, int, tuple[tuple[str, str], ...]], Encoder]] = dict(
    zip(BACKEND_NAMES, (_tokenizers, _tiktoken), strict=True)
)


@lru_cache(maxsize=4)
def cached_encoder(
    name: str, path: str, sha256: str, threads: int, checked_with: tuple[tuple[str, str], ...] = ()
) -> Encoder:
    """One encoder per worker process and tokenizer (``sha256`` keys the cache on content).

    ``checked_with``: the library versions the driver's equivalence check ran with."""
    if name not in BACKENDS:
        raise TokshardError(f"encoder {name!r} is not available; use one of {', '.join(BACKENDS)}")
    return BACKENDS[name](path, threads, checked_with)


def check(tokenizer_path: str, samples: Callable[[], list[str]]) -> Verdict:
    """Can this run use tiktoken? Structural rules first, then the comparisons above."""
    try:
        fast = TiktokenEncoder(tokenizer_path, confirm=False)
    except NotEquivalent as exc:
        return Verdict(False, str(exc))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a layout we do not know
        return Verdict(
            False, f"its BPE section has a layout tokshard does not know ({type(exc).__name__}: {exc})"
        )
    reference = TokenizersEncoder(tokenizer_path)
    docs = [d[:SAMPLE_DOC_CHARS] for d in samples()[:SAMPLE_DOCS]]
    found = compare(fast, reference, docs)
    if found:
        return Verdict(False, found)
    left_out = fast.conversion.unreachable
    note = (
        f"; left out {len(left_out)} vocabulary entries no merge makes ({show(left_out[0], 20)})"
        if left_out
        else ""
    )
    return Verdict(
        True,
        f"byte-level BPE, and tiktoken gave the same ids as tokenizers on all "
        f"{len(fast.conversion.merged):,} merged tokens, {len(probes(fast.conversion))} built-in strings "
        f"and the run's first {len(docs)} documents{note}",
    )


def choose(requested: str, tokenizer_path: str, samples: Callable[[], list[str]]) -> tuple[str, str]:
    """Pick the back end for a run and say why (the reason goes into the log and manifest).

    ``samples`` returns the run's first documents, read only if a check needs them. `auto`
    takes tiktoken only where `pipeline.encoding.equivalence` finds it gives the same ids as
    `tokenizers`; asking for tiktoken where it does not is an error that names the reason.
    """
    if requested == "tokenizers":
        return "tokenizers", "requested with --encoder tokenizers"
    if requested not in ("auto", "tiktoken"):
        raise TokshardError(f"encoder {requested!r} is not available; use auto, tokenizers or tiktoken")
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
