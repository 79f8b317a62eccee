"""The native back end: `fastokens`, a Rust BPE that reads the tokenizer.json itself.

Built with ``Tokenizer.from_json_str`` from the file's own text (never ``from_tiktoken``,
which parts from `tokenizers` on some Unicode whitespace), so it runs the same
pre-tokenizer regex and merges as the reference. ``encode_batch_flat`` returns one uint32
buffer and per-document offsets: a batch's ids reach the shard writer as numpy views
of that buffer, without a Python int per token.

Narrow interface, so the module can move: `available`, `version`, `FastokensEncoder`.
Only use it where `pipeline.encoding.equivalence` found it gives `tokenizers`' ids (``decide``
does that).
"""

from __future__ import annotations

import itertools
import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import Any

import numpy as np
import orjson

from pipeline.encoding.byte_level import (
    CL100K_PATTERN,
    LLAMA3_PATTERN,
    O200K_FOLDED_PATTERN,
    O200K_PATTERN,
    NotEquivalent,
    applied_merges,
    merge_pairs,
    pattern_of,
    pre_tokenizer_parts,
)
from pipeline.encoding.equivalence import confirm_builtin
from pipeline.encoding.normalizing import Ahead, Normalize, normalizing, run_ahead, without_normalizer
from pipeline.encoding.tokenizer import encoding_whole_documents, read_bytes, read_spec, unreadable

LIBRARY = "fastokens"

#: published split patterns, and the spelling of the same pattern that fastokens splits
#: without a regex engine (its PCRE2 route is several times slower, bench/RESULTS.md):
#: the contractions as one case-insensitive group. `pipeline.encoding.routing.PROVEN` holds
#: what the exhaustive scan found for fastokens built from this spelling.
NATIVE_SPELLING = {CL100K_PATTERN: LLAMA3_PATTERN, O200K_PATTERN: O200K_FOLDED_PATTERN}


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


def encoding_part(
    spec: dict[str, Any], merges: list[Any] | None = None, pre_tokenizer: dict[str, Any] | None = None
) -> str:
    """The tokenizer.json's text as fastokens can build it, for the files whose own text it
    refuses: without the parts encoding never runs here (post-processor, decoder; RoBERTa's
    ``RobertaProcessing``), since we never add special tokens or decode; and without the model's
    vocabulary entries that are special added tokens no merge makes where they leave gaps in
    its ids (cl100k_base's and o200k_base's, kept there at their published ids), since fastokens
    wants the ids without gaps. Text encodes to such an entry only where a whole pre-token equals it
    (``ignore_merges``), so the check's special-token probes see any difference this makes; and
    with none for an empty subword prefix or suffix (`EMPTY_MEANS_NONE`).
    Text, because ``from_json_str`` takes JSON: pre-tokenizer and added tokens pass through
    unchanged unless ``pre_tokenizer`` (`natively_spelled`) replaces the one, and the merges
    unless ``merges`` (`applied_merges`) replaces them. ``spec`` (shared, see `read_spec`) is
    left as it was."""
    part = {**spec, "post_processor": None, "decoder": None}
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") == "BPE" and isinstance(vocab, dict):
        specials = {t.get("content") for t in spec.get("added_tokens") or [] if t.get("special")}
        in_vocab = {t for t in specials & vocab.keys() if len(t) > 1}
        if in_vocab:
            made = {a + b for a, b in merge_pairs(model.get("merges") or [])}
            left_out = in_vocab - made
            kept = {t: i for t, i in vocab.items() if t not in left_out}
            if not has_id_gaps({"model": {"vocab": kept}}):  # only where that closes the gaps
                part["model"] = {**model, "vocab": kept}
    if spells_none_empty(model):
        part["model"] = {**part["model"], **dict.fromkeys(EMPTY_MEANS_NONE)}
    if merges is not None:
        part["model"] = {**part["model"], "merges": spelled_as_strings(merges)}
    if pre_tokenizer is not None:
        part["pre_tokenizer"] = pre_tokenizer
    return orjson.dumps(part).decode("utf-8")


#: BPE options that `tokenizers` reads as none where a file spells them "" (Xenova's GPT-4 and
#: GPT-4o copies do): it puts the prefix before each part of a word but the first and the
#: suffix after the last, so an empty one changes no string (tests/pipeline/encoding/
#: test_byte_level.py compares the two spellings); the text fastokens is built from says none
EMPTY_MEANS_NONE = ("continuing_subword_prefix", "end_of_word_suffix")


def spells_none_empty(model: dict[str, Any]) -> bool:
    """Does the model spell one of `EMPTY_MEANS_NONE` as ""?"""
    return any(model.get(option) == "" for option in EMPTY_MEANS_NONE)


def spelled_as_strings(merges: list[Any]) -> list[Any]:
    """Merges as "a b" strings, the older spelling, which fastokens reads faster than pairs;
    as they are where a part holds a space (then only pairs say where it splits)."""
    pairs = merge_pairs(merges)
    if any(" " in a or " " in b for a, b in pairs):
        return merges
    return [f"{a} {b}" for a, b in pairs]


#: how a Split that isolates its pattern's matches is spelled
ISOLATED = {"behavior": "Isolated", "invert": False}


def natively_spelled(pre_tokenizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pre-tokenizer with its split pattern spelled as `NATIVE_SPELLING` says, and its
    Split spelled `ISOLATED`, None where neither changes it. A Split that `pattern_of` takes in
    another spelling (``Removed`` with ``invert``) cuts the same pieces on that pattern
    (`byte_level.isolates_matches`), so fastokens is built from the spelling its native splitter
    and `pipeline.encoding.routing.PROVEN` know."""
    try:
        pattern = pattern_of(pre_tokenizer)
    except NotEquivalent:
        return None
    native = NATIVE_SPELLING.get(pattern, pattern)
    parts = pre_tokenizer_parts(pre_tokenizer)
    splits = [p for p in parts if p.get("type") == "Split"]
    if native == pattern and all(p.get("behavior") == "Isolated" for p in splits):
        return None
    return {
        "type": "Sequence",
        "pretokenizers": [
            {**p, "pattern": {"Regex": native}, **ISOLATED} if p.get("type") == "Split" else p for p in parts
        ],
    }


def has_id_gaps(spec: dict[str, Any]) -> bool:
    """Do the model's vocabulary ids leave gaps (which fastokens refuses)?"""
    vocab = (spec.get("model") or {}).get("vocab")
    return isinstance(vocab, dict) and bool(vocab) and max(vocab.values()) + 1 != len(vocab)


def rewritten_text(path: str) -> str:
    """The text fastokens is built from where the file's own is known not to do, or to cost
    more than it need (`encoding_part`: a vocabulary whose ids leave gaps; merges BPE never
    applies, which fastokens would read on every worker's start; a split pattern it would run
    on its regex engine, or a Split spelled other than `ISOLATED`; an empty subword prefix or
    suffix; a normalizer that runs ahead of it, `pipeline.encoding.normalizing`), else "" (the
    file as it is)."""
    spec = read_spec(path)
    ahead = run_ahead(spec)
    if ahead is not None:
        spec = without_normalizer(spec)
    merges = applied_merges(spec.get("model") or {})
    native = natively_spelled(spec.get("pre_tokenizer"))
    if (
        merges is None
        and native is None
        and not has_id_gaps(spec)
        and ahead is None
        and not spells_none_empty(spec.get("model") or {})
    ):
        return ""
    return encoding_part(spec, merges, native)


def normalizer_ahead(path: str) -> str:
    """How the tokenizer's normalizer runs ahead of fastokens (`Ahead.to_json`; ``null`` where
    none does)."""
    ahead = run_ahead(read_spec(path))
    return "null" if ahead is None else ahead.to_json()


class FastokensEncoder:
    """fastokens on a tokenizer.json: `tokenizers`' ids where the check says so, flat arrays out."""

    name = LIBRARY

    #: `tokenizers`' own normalizer, run on the texts first (None: the file has none, or
    #: texts it changes are routed to `tokenizers` instead)
    normalize: Normalize | None = None

    def __init__(
        self,
        path: str,
        threads: int = 1,
        confirm: bool = True,
        rewritten: str | None = None,
        normalizer: str | None = None,
    ) -> None:
        """``rewritten`` and ``normalizer``: `rewritten_text`'s and `normalizer_ahead`'s answers
        for this file, where the caller has them."""
        set_threads(threads)
        import fastokens

        if rewritten is None:
            rewritten = rewritten_text(path)
        if normalizer is None:
            normalizer = normalizer_ahead(path)
        ahead = Ahead.from_json(normalizer)
        if ahead is not None and not ahead.route_changed:  # else the caller routes (`spec.build`)
            self.normalize = normalizing(ahead.normalizer)
        # as it is, most often: rewriting it costs each worker's start, and a refusal costs a
        # whole build (1.5 s for a 200k vocabulary), so a file known to need it is rewritten first
        try:
            self.tokenizer = fastokens.Tokenizer.from_json_str(rewritten or file_text(path))
        except ValueError:  # a part encoding never runs that fastokens cannot build
            spec = read_spec(path)
            own = without_normalizer(spec) if ahead is not None else spec
            self.tokenizer = fastokens.Tokenizer.from_json_str(encoding_part(own))
        encoding_whole_documents(self.tokenizer)
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
        if self.normalize is not None:
            texts = [self.normalize(t) for t in texts]
        ids, offsets = self.tokenizer.encode_batch_flat(
            texts, add_special_tokens=False, split_special_tokens=True
        )
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids, offsets = self.encode_flat(texts)
        bounds = offsets.tolist()
        return [ids[a:b] for a, b in itertools.pairwise(bounds)]
