"""Which back end a run uses and why: `decide`, the one place that chooses, returns a
`Decision` (the `EncoderSpec` the workers build, and the reason the log and the manifest give).

The top of the encoding layers: it imports the back ends and the comparisons that prove them
equal (`equivalence`); none of those imports this module. The run's workers take part only
through the narrow `Workers` hook: they build the likely spec while the driver checks it, and
may encode the check's documents with the copy they built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pipeline.encoding import BACKEND_NAMES, check_cache
from pipeline.encoding.backend import TokenizersEncoder, library_version
from pipeline.encoding.byte_level import NotEquivalent
from pipeline.encoding.equivalence import (
    SAMPLE_DOC_CHARS,
    SAMPLE_DOCS,
    Verdict,
    Vocabulary,
    fastokens_spec,
    first_difference,
    show,
    static_difference,
    static_summary,
    vocabulary_from_spec,
    vocabulary_of,
)
from pipeline.encoding.fastokens_backend import available
from pipeline.encoding.normalizing import Ahead
from pipeline.encoding.routing import describe
from pipeline.encoding.spec import EncoderSpec, build
from pipeline.encoding.tiktoken_backend import TiktokenEncoder
from pipeline.format.content_hash import sha256_file
from pipeline.format.errors import TokshardError

#: the exact fast back ends, fastest first (bench/RESULTS.md, "Native encoder"): `auto` takes
#: the first the equivalence check passes
FAST = ("fastokens", "tiktoken")
#: what ``--encoder`` accepts (`pipeline.encoding.BACKEND_NAMES`, and `auto`)
NAMES = ("auto", *BACKEND_NAMES)


class Workers(Protocol):
    """The hook through which the run's workers take part in the choice (the cluster's side)."""

    def warm(self, spec: EncoderSpec) -> None:
        """Have every worker build ``spec``'s encoder, in the background, before its first task."""

    def probe(self, spec: EncoderSpec, texts: list[str]) -> list | None:
        """``spec``'s ids for ``texts`` from a worker that built it (None: no worker can say)."""


#: ``probe(texts)``: the candidate's ids for ``texts`` from a copy built elsewhere (a warm worker)
Probe = Callable[[list[str]], list | None]


@dataclass(frozen=True)
class Decision:
    """The run's encoder: what each worker builds, and why it was chosen."""

    spec: EncoderSpec
    #: why, as the manifest keeps it: the same for a run however this node's check cache stands,
    #: so a rerun after a kill writes the manifest an uninterrupted run would have
    reason: str
    #: the run-independent comparisons' pass was read from the check cache (the log says so)
    kept: bool = False

    @property
    def name(self) -> str:
        return self.spec.backend

    def log_line(self) -> str:
        """The run's line about its encoder: the reason, and where a kept pass came from."""
        kept = (
            f"; all but the documents' comparison passed in an earlier run, kept in {check_cache.cache_dir()} "
            "for this tokenizer and these libraries"
            if self.kept
            else ""
        )
        return f"encoder: {self.name} ({self.reason}{kept})"

    def manifest_entry(self, routed_documents: int) -> dict[str, object]:
        """The manifest's ``encoder`` entry: which back end, why, the library that ran it, and
        for fastokens the class of documents it sent to `tokenizers` and how many there were."""
        spec = self.spec
        entry: dict[str, object] = {
            "name": spec.backend,
            "reason": self.reason,
            "threads": spec.threads,
            "library": spec.backend,
            "version": library_version(spec.backend) or "unknown",
        }
        changed_by = _changed_by(spec)
        if spec.route or changed_by:
            routed = {
                "class": describe(spec.route, changed_by),
                "to": "tokenizers",
                "documents": routed_documents,
            }
            entry["routed"] = routed
        return entry


def _changed_by(spec: EncoderSpec) -> str | None:
    """The normalizer whose changes send a text to `tokenizers` (`normalizing.Ahead`), if any."""
    ahead = Ahead.from_json(spec.normalizer)
    return ahead.normalizer.get("type") if ahead is not None and ahead.route_changed else None


def decide(
    requested: str,
    tokenizer: str,
    samples: Callable[[], list[str]],
    *,
    sha256: str | None = None,
    threads: int = 1,
    workers: Workers | None = None,
) -> Decision:
    """Pick the back end for a run on ``tokenizer`` (the path its workers read) and say why.

    ``samples`` returns the run's first documents, read only if a check needs them (once).
    `auto` takes the fastest back end in `FAST` that `pipeline.encoding.equivalence` finds gives
    the same ids as `tokenizers`, else `tokenizers`; asking for a fast one where it does not is
    an error that names the reason. With ``workers``, they build the likely choice meanwhile,
    and the check's documents are encoded on one of their copies where that is enough (`check`).
    """
    if requested not in NAMES:
        raise TokshardError(
            f"encoder {requested!r} is not available; use {', '.join(NAMES[:-1])} or {NAMES[-1]}"
        )

    @functools.cache
    def spec_of(backend: str) -> EncoderSpec:
        return EncoderSpec.checked_here(backend, tokenizer, sha256 or sha256_file(tokenizer), threads)

    likely = _likely_choice(requested)
    if workers is not None:
        workers.warm(spec_of(likely))
    if requested == "tokenizers":
        return Decision(spec_of("tokenizers"), "requested with --encoder tokenizers")
    samples = functools.cache(samples)
    refused: list[str] = []
    for name in FAST if requested == "auto" else (requested,):
        spec = spec_of(name)
        probe = functools.partial(workers.probe, spec) if workers is not None and name == likely else None
        verdict = check(spec, samples, probe)
        if verdict.equivalent:
            how = "auto" if requested == "auto" else f"requested with --encoder {name}"
            passed_over = "".join(f"; {r}" for r in refused)
            return Decision(spec, f"{how}: {verdict.reason}{_routing_note(spec)}{passed_over}", verdict.kept)
        if requested != "auto":
            raise TokshardError(
                f"--encoder {name} would change the ids: {verdict.reason}; "
                "use --encoder auto (falls back to tokenizers) or --encoder tokenizers"
            )
        refused.append(f"{name} not used, {verdict.reason}")
    return Decision(spec_of("tokenizers"), f"auto: {'; '.join(refused)}")


def warm_likely(requested: str, tokenizer: str, sha256: str, threads: int, workers: Workers) -> None:
    """Have ``workers`` build the back end `decide` will most likely choose before it is called
    (a run of many input files plans for a while after its workers boot); `decide`'s own
    warm-up asks for the same spec and finds it built. An unknown name: `decide` refuses it."""
    if requested in NAMES:
        workers.warm(EncoderSpec.checked_here(_likely_choice(requested), tokenizer, sha256, threads))


def _likely_choice(requested: str) -> str:
    """The back end a run will most likely use, built on the workers while the driver checks:
    the one asked for, or for `auto` the fastest installed."""
    if requested != "auto":
        return requested
    return "fastokens" if available() else "tiktoken"


def _routing_note(spec: EncoderSpec) -> str:
    """What the reason adds where fastokens routes a class of documents to `tokenizers`."""
    note = ""
    if spec.route:
        note += (
            f"; documents {describe(spec.route)} go to tokenizers (fastokens' regex engine "
            "parts from it on that class alone, proven over every code point)"
        )
    changed_by = _changed_by(spec)
    if changed_by:
        note += (
            f"; documents its {changed_by} normalizer changes go to tokenizers (the file's "
            "non-special added tokens are found before it normalizes)"
        )
    return note


def _build(spec: EncoderSpec) -> tuple[object, Callable[[], Vocabulary]] | Verdict:
    """The candidate back end and how to list its vocabulary (only the static comparisons need
    it, and reading it costs a quarter of a second for 50k entries), or a verdict saying why
    the candidate cannot be used."""
    candidate = spec.backend
    try:
        if candidate == "fastokens":
            if not available():
                return Verdict(False, "fastokens is not installed (or has no wheel for this platform)")
            parsed, _ = fastokens_spec(spec.tokenizer)
            return build(spec), lambda: vocabulary_from_spec(parsed)
        fast = TiktokenEncoder(spec.tokenizer, confirm=False)
        return fast, lambda: vocabulary_of(fast.conversion)
    except NotEquivalent as exc:
        return Verdict(False, str(exc))
    except TokshardError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a layout we do not know
        return _unknown_layout(exc)
    except BaseException as exc:
        if not failed_inside(exc):
            raise
        return Verdict(False, f"{candidate} cannot read this tokenizer ({type(exc).__name__}: {exc})")


def failed_inside(exc: BaseException) -> bool:
    """Whether ``exc`` is a library's own failure, which refuses that back end: any Exception,
    or a Rust panic (pyo3's PanicException derives from BaseException, as Ctrl-C does)."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _unknown_layout(exc: Exception) -> Verdict:
    return Verdict(
        False, f"its BPE section has a layout tokshard does not know ({type(exc).__name__}: {exc})"
    )


def check(spec: EncoderSpec, samples: Callable[[], list[str]], probe: Probe | None = None) -> Verdict:
    """Can this run use ``spec``'s back end? Structural rules first, then the comparisons
    above (the static ones once per tokenizer, libraries and code: see `check_cache`), then
    the run's first documents, always.

    With the static half kept (which stands for the structural rules too: same tokenizer
    bytes, same code), the documents need only the candidate's ids for them, and ``probe``
    may have those from a worker that built the candidate for the run already. The driver then
    builds no copy of its own while the workers boot (bench/RESULTS.md, "590 MB, the check's
    documents on a worker"). Those ids come from the library that encodes the run; failing to
    get them only means the candidate is built here."""
    candidate, tokenizer_path = spec.backend, spec.tokenizer
    key = check_cache.key_parts(candidate, tokenizer_path)
    kept = check_cache.passed(key)
    reference = functools.cache(lambda: TokenizersEncoder(tokenizer_path))
    want = None  # the reference's ids for the documents, once computed
    if kept is not None and probe is not None:
        docs = _documents(samples)
        want = _ids(reference(), docs, candidate)  # while the workers boot
        got = _probed(probe, docs)
        if got is not None:
            return _documents_verdict(candidate, tokenizer_path, kept, docs, want, got, kept=True)
    built = _build(spec)
    if isinstance(built, Verdict):
        return built
    fast, vocabulary = built
    static = kept if kept is not None else _static_check(key, candidate, fast, reference(), vocabulary)
    if isinstance(static, Verdict):
        return static
    docs = _documents(samples)
    if want is None:
        want = _ids(reference(), docs, candidate)
    got = _ids(fast, docs, candidate)
    return _documents_verdict(candidate, tokenizer_path, static, docs, want, got, kept=kept is not None)


def _documents(samples: Callable[[], list[str]]) -> list[str]:
    return [d[:SAMPLE_DOC_CHARS] for d in samples()[:SAMPLE_DOCS]]


def _ids(encoder, docs: list[str], candidate: str) -> list | Verdict:
    try:
        return encoder.encode_batch(docs)
    except BaseException as exc:
        if not failed_inside(exc):
            raise
        return Verdict(False, _failed(candidate, exc))


def _probed(probe: Probe, docs: list[str]) -> list | None:
    try:
        return probe(docs)
    except BaseException as exc:  # a worker lost, a timeout: the check builds the candidate here instead
        if not failed_inside(exc):
            raise
        return None


def _documents_verdict(
    candidate: str,
    tokenizer_path: str,
    static: str,
    docs: list[str],
    want: list | Verdict,
    got: list | Verdict,
    *,
    kept: bool,
) -> Verdict:
    """The verdict once the static half passed (``kept``: read from the check cache): the run's
    documents decide."""
    for failed in (want, got):
        if isinstance(failed, Verdict):
            return failed
    found = first_difference(docs, lambda _: want, lambda _: got, candidate)
    if found:
        return Verdict(False, found)
    return Verdict(
        True,
        f"{_shape(candidate, tokenizer_path)}, and {candidate} gave the same ids as tokenizers on {static} "
        f"and {_run_documents(len(docs))}",
        kept,
    )


def _run_documents(n: int) -> str:
    """How the reason names the run's documents the check compared (none: its first records
    held no text, as where --text-field names a field they lack)."""
    if n == 0:
        return "none of the run's documents (its first records held no text)"
    return f"the run's first {n:,} document{'' if n == 1 else 's'}"


def _shape(candidate: str, tokenizer_path: str) -> str:
    """The shape the candidate was checked on, as the reason names it: kept beside the checks
    (`check_cache.derived`), since finding it parses the whole file, which the driver of a run
    whose check was kept otherwise does only for this, after the workers are ready."""
    if candidate != "fastokens":
        return "byte-level BPE"

    def find() -> str:
        try:
            return fastokens_spec(tokenizer_path)[1]
        except NotEquivalent:
            return "byte-level BPE"

    return check_cache.derived(check_cache.key_parts("fastokens-shape", tokenizer_path), find)


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
    except BaseException as exc:
        if not failed_inside(exc):
            raise
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
