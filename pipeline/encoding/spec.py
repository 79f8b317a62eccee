"""What a worker builds to encode a run: `EncoderSpec`, and building it (`worker_encoder`).

The spec is plain, frozen data: it travels in every task to the workers and keys each
worker's one encoder. `pipeline.encoding.selection.decide` makes it (the driver's choice);
nothing else decides which back end runs or which documents fastokens sends to `tokenizers`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache

from pipeline.encoding import BACKEND_NAMES, check_cache
from pipeline.encoding.backend import REFERENCE, Encoder, TokenizersEncoder, library_versions
from pipeline.encoding.equivalence import confirm_builtin
from pipeline.encoding.fastokens_backend import FastokensEncoder, normalizer_ahead, rewritten_text
from pipeline.encoding.normalizing import Ahead, normalizing
from pipeline.encoding.routing import RoutedEncoder, fastokens_class
from pipeline.encoding.tiktoken_backend import TiktokenEncoder
from pipeline.format.errors import TokshardError


@dataclass(frozen=True)
class EncoderSpec:
    """One back end on one tokenizer: everything a worker needs to build the run's encoder."""

    #: the back end (`pipeline.encoding.BACKEND_NAMES`)
    backend: str
    #: the tokenizer.json a worker of this machine reads
    tokenizer: str
    #: the tokenizer's content (keys each worker's encoder, whatever its path)
    sha256: str
    #: encoder threads per worker process
    threads: int = 1
    #: the encoder libraries' versions the driver's equivalence check ran with (fast back
    #: ends; a worker with others compares the built-in strings again before it encodes)
    checked_with: tuple[tuple[str, str], ...] = ()
    #: fastokens: the code points whose documents go to `tokenizers` (`pipeline.encoding.routing`)
    route: frozenset[int] = frozenset()
    #: fastokens: how the tokenizer's normalizer runs ahead of it (`normalizing.Ahead.to_json`;
    #: ``null`` where none does)
    normalizer: str = "null"
    #: whether long documents may be cut at spaces (`check_cache.space_cuts`), found once by
    #: the driver for a fast back end, whose check reads the file anyway; None: not found (a
    #: worker looks it up at its first long document)
    space_cuts: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise TokshardError(
                f"encoder {self.backend!r} is not available; use one of {', '.join(BACKEND_NAMES)}"
            )

    @classmethod
    def checked_here(cls, backend: str, tokenizer: str, sha256: str, threads: int = 1) -> EncoderSpec:
        """The spec of ``backend`` as the driver checks it: with this process's library versions,
        for fastokens the class proven for them, and for a fast one how long documents are cut."""
        fast = backend != "tokenizers"
        return cls(
            backend,
            tokenizer,
            sha256,
            threads,
            checked_with=library_versions() if fast else (),
            route=routed_class(tokenizer) if backend == "fastokens" else frozenset(),
            normalizer=kept_normalizer(tokenizer) if backend == "fastokens" else "null",
            space_cuts=check_cache.space_cuts(tokenizer) if fast else None,
        )

    @property
    def libraries(self) -> tuple[str, ...]:
        """The libraries whose versions shape this encoder's ids, which a worker must share with
        the driver: its back end's and the reference's (`backend.REFERENCE`)."""
        return tuple(dict.fromkeys((self.backend, REFERENCE)))

    def reading(self, tokenizer: str) -> EncoderSpec:
        """The same encoder built from another copy of the tokenizer (a worker's own)."""
        return dataclasses.replace(self, tokenizer=tokenizer)


def routed_class(tokenizer: str) -> frozenset[int]:
    """`routing.fastokens_class` (empty where none is proven), kept beside the checks for the
    run's workers on this machine (`check_cache.derived_as`: an entry that does not read as a
    class is made again)."""
    return check_cache.derived_as(
        check_cache.key_parts("fastokens-class", tokenizer),
        lambda: json.dumps(sorted(fastokens_class(tokenizer) or ())),
        lambda text: frozenset(int(c) for c in json.loads(text)),
    )


def kept_normalizer(tokenizer: str) -> str:
    """`fastokens_backend.normalizer_ahead`, kept beside the checks for the run's workers on
    this machine (`check_cache.derived_as`: finding it parses the whole file; an entry that is
    not one of its answers is made again)."""
    return check_cache.derived_as(
        check_cache.key_parts("fastokens-normalizer", tokenizer),
        lambda: normalizer_ahead(tokenizer),
        _checked_normalizer,
    )


def _checked_normalizer(text: str) -> str:
    """``text`` if it reads as `Ahead.to_json`'s (or ``null``); `ValueError` otherwise."""
    Ahead.from_json(text)
    return text


def build(spec: EncoderSpec) -> Encoder:
    """The encoder ``spec`` names. Where this process's library versions are not those the
    driver checked with (another node, another environment), a fast one first compares the
    built-in strings with `tokenizers`, so a worker that would write other ids stops instead."""
    confirm = spec.backend != "tokenizers" and spec.checked_with != library_versions()
    if spec.backend == "tokenizers":
        return TokenizersEncoder(spec.tokenizer, spec.threads)
    if spec.backend == "tiktoken":
        return TiktokenEncoder(spec.tokenizer, spec.threads, confirm=confirm)
    # what both derive from the file alone, kept for the run's workers on this machine
    rewritten = check_cache.derived(
        check_cache.key_parts("fastokens-text", spec.tokenizer), lambda: rewritten_text(spec.tokenizer)
    )
    fast = FastokensEncoder(
        spec.tokenizer, spec.threads, confirm=False, rewritten=rewritten, normalizer=spec.normalizer
    )
    # the class is proven for the driver's libraries; other libraries route their own (if any)
    route = routed_class(spec.tokenizer) if confirm else spec.route
    ahead = Ahead.from_json(spec.normalizer)
    changed_by = normalizing(ahead.normalizer) if ahead is not None and ahead.route_changed else None
    encoder: Encoder = fast
    if route or changed_by:
        reference = lambda: TokenizersEncoder(spec.tokenizer, spec.threads)  # noqa: E731
        encoder = RoutedEncoder(fast, reference, route, changed_by)
    if confirm:
        confirm_builtin(spec.tokenizer, encoder)
    return encoder


@lru_cache(maxsize=4)
def worker_encoder(spec: EncoderSpec) -> Encoder:
    """This process's one encoder for ``spec`` (a worker builds it once, for all its tasks)."""
    return build(spec)
