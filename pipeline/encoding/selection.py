"""Which back end a run uses (`choose`, after `check`), and each worker's one encoder
(`cached_encoder`).

The top of the encoding layers: it imports the back ends (`backend`, `tiktoken_backend`,
`fastokens_backend`) and the comparisons that prove them equal (`equivalence`); none of those
imports this module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from functools import lru_cache

from pipeline.encoding import BACKEND_NAMES, check_cache
from pipeline.encoding.backend import Encoder, TokenizersEncoder, library_version, library_versions
from pipeline.encoding.byte_level import NotEquivalent
from pipeline.encoding.equivalence import (
    SAMPLE_DOC_CHARS,
    SAMPLE_DOCS,
    Verdict,
    Vocabulary,
    confirm_builtin,
    fastokens_spec,
    first_difference,
    show,
    static_difference,
    static_summary,
    vocabulary_from_spec,
    vocabulary_of,
)
from pipeline.encoding.fastokens_backend import FastokensEncoder, available, rewritten_text
from pipeline.encoding.routing import RoutedEncoder, describe, fastokens_class
from pipeline.encoding.tiktoken_backend import TiktokenEncoder
from pipeline.format.errors import TokshardError

#: the exact fast back ends, fastest first (bench/RESULTS.md, "Native encoder"): `auto` takes
#: the first the equivalence check passes
FAST = ("fastokens", "tiktoken")
#: what ``--encoder`` accepts (`pipeline.encoding.BACKEND_NAMES`, and `auto`)
NAMES = ("auto", *BACKEND_NAMES)

#: ``elsewhere(name, texts)``: the ids back end ``name`` gives ``texts`` where a copy of it is
#: already built (a warm worker), or None where none is
Elsewhere = Callable[[str, list[str]], list | None]


def _fast(name: str, path: str, threads: int, checked_with: tuple[tuple[str, str], ...]) -> Encoder:
    # The driver compared the encoders before the run; a worker with the same libraries
    # would repeat that for nothing (a quarter of a second), one with others must redo it.
    confirm = checked_with != library_versions()
    if name == "fastokens":
        fast = routed_fastokens(path, threads)
        if confirm:
            confirm_builtin(path, fast)
        return fast
    return TiktokenEncoder(path, threads, confirm=confirm)


def routed_fastokens(path: str, threads: int = 1) -> Encoder:
    """fastokens, with the documents of its proven class (`pipeline.encoding.routing`) sent to
    `tokenizers`; fastokens alone where that class is empty or none is proven."""
    # what both derive from the file alone, kept for the run's workers on this machine
    rewritten = check_cache.derived(
        check_cache.key_parts("fastokens-text", path), lambda: rewritten_text(path)
    )
    fast = FastokensEncoder(path, threads, confirm=False, rewritten=rewritten)
    route = _routed_class(path)
    if not route:
        return fast
    return RoutedEncoder(fast, lambda: TokenizersEncoder(path, threads), route)


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


def choose(
    requested: str,
    tokenizer_path: str,
    samples: Callable[[], list[str]],
    elsewhere: Elsewhere | None = None,
) -> tuple[str, str]:
    """Pick the back end for a run and say why (the reason goes into the log and manifest).

    ``samples`` returns the run's first documents, read only if a check needs them (once);
    ``elsewhere`` encodes them where the candidate is built already (see `check`).
    `auto` takes the fastest back end in `FAST` that `pipeline.encoding.equivalence` finds gives
    the same ids as `tokenizers`, else `tokenizers`; asking for a fast one where it does
    not is an error that names the reason.
    """
    if requested == "tokenizers":
        return "tokenizers", "requested with --encoder tokenizers"
    if requested not in NAMES:
        raise TokshardError(
            f"encoder {requested!r} is not available; use {', '.join(NAMES[:-1])} or {NAMES[-1]}"
        )
    samples = functools.cache(samples)
    refused: list[str] = []
    for name in FAST if requested == "auto" else (requested,):
        verdict = check(tokenizer_path, samples, name, elsewhere)
        if verdict.equivalent:
            how = "auto" if requested == "auto" else f"requested with --encoder {name}"
            passed_over = "".join(f"; {r}" for r in refused)
            return name, f"{how}: {verdict.reason}{routing_note(name, tokenizer_path)}{passed_over}"
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
    return "fastokens" if available() else "tiktoken"


def _routed_class(path: str) -> frozenset[int] | None:
    """`routing.fastokens_class`, kept beside the checks for the run's workers on this machine
    (`check_cache.derived`; an entry that does not read as a class is made again)."""

    def make() -> str:
        found = fastokens_class(path)
        return json.dumps(None if found is None else sorted(found))

    parts = check_cache.key_parts("fastokens-class", path)
    try:
        kept = json.loads(check_cache.derived(parts, make))
    except ValueError:
        kept = json.loads(make())
    return None if kept is None else frozenset(int(c) for c in kept)


def manifest_entry(
    name: str, reason: str, threads: int, tokenizer_path: str, routed_documents: int
) -> dict[str, object]:
    """The manifest's ``encoder`` entry: which back end, why, the library that ran it, and for
    fastokens the class of documents it sent to `tokenizers` and how many there were."""
    library = "tokenizers" if name == "tokenizers" else name
    entry: dict[str, object] = {"name": name, "reason": reason, "threads": threads, "library": library,
                                "version": library_version(library) or "unknown"}  # fmt: skip
    route = _routed_class(tokenizer_path) if name == "fastokens" else None
    if route:
        entry["routed"] = {"class": describe(route), "to": "tokenizers", "documents": routed_documents}
    return entry


def routing_note(name: str, tokenizer_path: str) -> str:
    """What the reason adds where fastokens routes a class of documents to `tokenizers`."""
    route = _routed_class(tokenizer_path) if name == "fastokens" else None
    if not route:
        return ""
    return (
        f"; documents holding {describe(route)} go to tokenizers (fastokens' regex engine "
        "parts from it on that class alone, proven over every code point)"
    )


def _build(candidate: str, tokenizer_path: str) -> tuple[object, Callable[[], Vocabulary]] | Verdict:
    """The candidate back end and how to list its vocabulary (only the static comparisons need
    it, and reading it costs a quarter of a second for 50k entries), or a verdict saying why
    the candidate cannot be used."""
    try:
        if candidate == "fastokens":
            if not available():
                return Verdict(False, "fastokens is not installed (or has no wheel for this platform)")
            spec, _ = fastokens_spec(tokenizer_path)
            return routed_fastokens(tokenizer_path), lambda: vocabulary_from_spec(spec)
        fast = TiktokenEncoder(tokenizer_path, confirm=False)
        return fast, lambda: vocabulary_of(fast.conversion)
    except NotEquivalent as exc:
        return Verdict(False, str(exc))
    except TokshardError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a layout we do not know
        return _unknown_layout(exc)
    except Exception as exc:
        return Verdict(False, f"{candidate} cannot read this tokenizer ({type(exc).__name__}: {exc})")


def _unknown_layout(exc: Exception) -> Verdict:
    return Verdict(
        False, f"its BPE section has a layout tokshard does not know ({type(exc).__name__}: {exc})"
    )


def check(
    tokenizer_path: str,
    samples: Callable[[], list[str]],
    candidate: str = "tiktoken",
    elsewhere: Elsewhere | None = None,
) -> Verdict:
    """Can this run use ``candidate``? Structural rules first, then the comparisons above (the
    static ones once per tokenizer, libraries and code: see `check_cache`), then the run's
    first documents, always.

    With the static half kept (which stands for the structural rules too: same tokenizer
    bytes, same code), the documents need only the candidate's ids for them, and ``elsewhere``
    may have those from a worker that built the candidate for the run already. The driver then
    builds no copy of its own while the workers boot (bench/RESULTS.md, "590 MB, the check's
    documents on a worker"). Those ids come from the library that encodes the run; failing to
    get them only means the candidate is built here."""
    key = check_cache.key_parts(candidate, tokenizer_path)
    kept = check_cache.passed(key)
    reference = functools.cache(lambda: TokenizersEncoder(tokenizer_path))
    want = None  # the reference's ids for the documents, once computed
    if kept is not None and elsewhere is not None:
        docs = _documents(samples)
        want = _ids(reference(), docs, candidate)  # while the workers boot
        got = _ids_elsewhere(elsewhere, candidate, docs)
        if got is not None:
            return _documents_verdict(candidate, tokenizer_path, _kept_text(kept), docs, want, got)
    built = _build(candidate, tokenizer_path)
    if isinstance(built, Verdict):
        return built
    fast, vocabulary = built
    static = (
        _kept_text(kept) if kept is not None else _static_check(key, candidate, fast, reference(), vocabulary)
    )
    if isinstance(static, Verdict):
        return static
    docs = _documents(samples)
    if want is None:
        want = _ids(reference(), docs, candidate)
    return _documents_verdict(candidate, tokenizer_path, static, docs, want, _ids(fast, docs, candidate))


def _documents(samples: Callable[[], list[str]]) -> list[str]:
    return [d[:SAMPLE_DOC_CHARS] for d in samples()[:SAMPLE_DOCS]]


def _ids(encoder, docs: list[str], candidate: str) -> list | Verdict:
    try:
        return encoder.encode_batch(docs)
    except Exception as exc:
        return Verdict(False, _failed(candidate, exc))


def _ids_elsewhere(elsewhere: Elsewhere, candidate: str, docs: list[str]) -> list | None:
    try:
        return elsewhere(candidate, docs)
    except Exception:  # a worker lost, a timeout: the check builds the candidate here instead
        return None


def _documents_verdict(
    candidate: str,
    tokenizer_path: str,
    static: str,
    docs: list[str],
    want: list | Verdict,
    got: list | Verdict,
) -> Verdict:
    """The verdict once the static half passed: the run's documents decide."""
    for failed in (want, got):
        if isinstance(failed, Verdict):
            return failed
    found = first_difference(docs, lambda _: want, lambda _: got, candidate)
    if found:
        return Verdict(False, found)
    return Verdict(
        True,
        f"{_shape(candidate, tokenizer_path)}, and {candidate} gave the same ids as tokenizers on {static} "
        f"and the run's first {len(docs)} documents",
    )


def _shape(candidate: str, tokenizer_path: str) -> str:
    """The shape the candidate was checked on, as the reason names it."""
    if candidate == "fastokens":
        try:
            return fastokens_spec(tokenizer_path)[1]
        except NotEquivalent:
            pass
    return "byte-level BPE"


def _kept_text(kept: str) -> str:
    return f"{kept} (a pass kept in {check_cache.cache_dir()} for this tokenizer and these libraries)"


def _static_check(
    key: dict[str, object] | None, candidate: str, fast, reference, vocabulary: Callable[[], Vocabulary]
) -> str | Verdict:
    """What the run-independent comparisons covered, kept for the next run under ``key``, or
    the verdict that refuses the candidate."""
    try:
        vocab = vocabulary()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return _unknown_layout(exc)
    try:
        found = static_difference(fast, reference, vocab)
    except Exception as exc:
        found = _failed(candidate, exc)
    if found:
        return Verdict(False, found)
    summary = static_summary(vocab) + _left_out(fast)
    check_cache.remember(key, summary)
    return summary


def _left_out(fast) -> str:
    """Vocabulary entries the candidate was built without (tiktoken's ranks), said in the reason."""
    left_out = getattr(getattr(fast, "conversion", None), "unreachable", None)
    if not left_out:
        return ""
    return f"; left out {len(left_out)} vocabulary entries no merge makes ({show(left_out[0], 20)})"


def _failed(candidate: str, exc: Exception) -> str:
    return f"{candidate} failed where tokenizers did not ({type(exc).__name__}: {exc})"
