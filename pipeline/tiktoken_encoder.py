"""The fast back end: tiktoken's BPE core, built from the tokenizer.json itself.

A byte-level BPE (GPT-2, OPT/RoBERTa, Llama-3 style, or one trained by ``tokshard tokenizer
train``) is, underneath its JSON, a table of byte strings and a split pattern, which is
exactly what tiktoken runs, several times faster than `tokenizers` on one thread. So no
download: the vocabulary's byte-level strings are mapped back to bytes (GPT-2's
bytes-to-unicode table inverted), ids become ranks, the pre-tokenizer's regex becomes the
split pattern, and added special tokens stay special (they are never matched anyway: we
only call ``encode_ordinary``).

tiktoken merges the adjacent pair whose *result* has the lowest rank; `tokenizers` merges
the pair that comes first in its merge list. They agree when merge order is id order, every
merge makes a new token (or all of a token's merges are adjacent, as in files converted from
tiktoken like Llama-3's), and tiktoken never meets a token `tokenizers` cannot make. Where
the JSON shows they cannot agree, `convert` raises `NotEquivalent` with the reason (and
`pipeline.encoder_check` compares the two on real strings before any run uses this).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.errors import TokshardError
from pipeline.tokenizer import read_bytes, unreadable

#: GPT-2's split pattern as `tokenizers`' ByteLevel(use_regex=True) spells it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotEquivalent(TokshardError):
    """tiktoken cannot encode exactly like `tokenizers` for this tokenizer; says why."""


@dataclass
class Conversion:
    """A tokenizer.json restated in tiktoken's terms."""

    pattern: str
    ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    #: byte-level strings of merge results, by id, for the piece-by-piece comparison
    merged: dict[int, str] = field(default_factory=dict)
    #: vocabulary entries `tokenizers` can never produce from text, left out of the ranks
    unreachable: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: each printable stand-in back to its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {char: b for b, char in table.items()}


@lru_cache(maxsize=1)
def _to_latin1() -> dict[int, str]:
    """`str.translate` table: stand-in -> the latin-1 character of its byte, any other
    character below 256 -> one latin-1 cannot encode (so it fails instead of passing)."""
    table: dict[int, str] = {c: "\uffff" for c in range(256)}
    table.update({ord(ch): chr(b) for ch, b in byte_decoder().items()})
    return table


def to_bytes(token: str) -> bytes:
    """A byte-level vocabulary string back to its bytes; ValueError if it is not one."""
    try:
        return token.translate(_to_latin1()).encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"{token!r} is not a byte-level string") from None


def pattern_of(pre_tokenizer: dict[str, Any] | None) -> str:
    """The one regex that splits text into pieces, as tiktoken needs it."""
    pre = pre_tokenizer or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else ([pre] if pre else [])
    kinds = [p.get("type") for p in parts]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    if len(byte_level) != 1:
        raise NotEquivalent(f"pre-tokenizer {'+'.join(map(str, kinds)) or 'none'} is not byte-level")
    bl = byte_level[0]
    if bl.get("add_prefix_space"):
        raise NotEquivalent("ByteLevel add_prefix_space=true adds a space tiktoken does not")
    uses_regex = bl.get("use_regex", True)
    if kinds == ["ByteLevel"]:
        if not uses_regex:
            raise NotEquivalent("ByteLevel without a split pattern: no regex to give tiktoken")
        return GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"] and not uses_regex:
        split = parts[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if regex is None:
            raise NotEquivalent("Split pre-tokenizer on a literal string, not a regex")
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise NotEquivalent(
                f"Split pre-tokenizer with behavior {split.get('behavior')}"
                f"{' inverted' if split.get('invert') else ''}; tiktoken isolates matches"
            )
        return regex
    raise NotEquivalent(f"pre-tokenizer sequence {'+'.join(map(str, kinds))} has no tiktoken equivalent")


def _check_model(spec: dict[str, Any]) -> dict[str, Any]:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotEquivalent(f"model {model.get('type')} is not BPE")
    if spec.get("normalizer") is not None:
        kind = spec["normalizer"].get("type", "?")
        raise NotEquivalent(f"normalizer {kind} changes the text before BPE; the fast back ends have none")
    for option, harmless in (
        ("dropout", (None, 0, 0.0)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
        ("byte_fallback", (None, False)),
    ):
        if model.get(option) not in harmless:
            raise NotEquivalent(f"BPE option {option}={model[option]!r} has no tiktoken equivalent")
    return model


def _merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    """Merges as pairs, whether the file spells them "a b" (older) or ["a", "b"]."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def convert(spec: dict[str, Any]) -> Conversion:
    """Restate a parsed tokenizer.json for tiktoken, or say why that would change ids."""
    model = _check_model(spec)
    pattern = pattern_of(spec.get("pre_tokenizer"))
    added = spec.get("added_tokens") or []
    plain_added = [t["content"] for t in added if not t.get("special")]
    if plain_added:
        raise NotEquivalent(
            f"added token {plain_added[0]!r} is not special: tokenizers cuts it out of the text, tiktoken cannot"
        )
    special = {t["content"]: t["id"] for t in added}
    vocab: dict[str, int] = model.get("vocab") or {}
    to_byte = byte_decoder()
    missing = [b for ch, b in sorted(to_byte.items(), key=lambda kv: kv[1]) if ch not in vocab]
    if missing:
        raise NotEquivalent(
            f"vocabulary lacks {len(missing)} of the 256 bytes (first 0x{missing[0]:02x}); "
            "tokenizers drops such bytes, tiktoken cannot"
        )
    merged: dict[int, str] = {}
    last_id, last_pair = -1, ("", "")
    for a, b in _merge_pairs(model.get("merges") or []):
        token = a + b
        tid = vocab.get(token)
        if tid is None:
            raise NotEquivalent(f"merge {a!r} + {b!r} makes {token!r}, which is not in the vocabulary")
        if tid == last_id:  # another split of the same token, as files converted from tiktoken list
            continue
        if tid in merged:
            raise NotEquivalent(
                f"token {token!r} is made by two merges far apart; tiktoken ranks each token once"
            )
        if tid < last_id:
            raise NotEquivalent(
                f"merge order is not id order ({last_pair[0] + last_pair[1]!r} id {last_id} merges "
                f"before {token!r} id {tid}); tiktoken merges by id"
            )
        merged[tid] = token
        last_id, last_pair = tid, (a, b)
    ranks: dict[bytes, int] = {}
    unreachable: list[str] = []
    for token, tid in vocab.items():
        if tid in merged or len(token) == 1:
            try:
                ranks[to_bytes(token)] = tid
            except ValueError:
                raise NotEquivalent(f"vocabulary entry {token!r} is not a byte-level string") from None
        elif special.get(token) != tid:  # a special token's own entry is never reached: left out
            unreachable.append(token)
    if unreachable and model.get("ignore_merges"):
        raise NotEquivalent(
            f"vocabulary entry {unreachable[0]!r} is made by no merge, yet ignore_merges lets "
            "tokenizers emit it for a whole word; tiktoken would also build it from parts"
        )
    return Conversion(pattern, ranks, special, merged, unreachable)


def read_spec(path: str | Path) -> dict[str, Any]:
    """The parsed tokenizer.json: by orjson (a quarter of `json`'s 0.06 s for GPT-2's, on
    every worker's start), by `json` where orjson refuses a file `json` may still read."""
    data = read_bytes(path)
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(data)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise unreadable(path, exc) from exc


def build_encoding(conversion: Conversion, name: str = "tokshard"):
    """A tiktoken `Encoding` (a regex tiktoken's engine refuses is a `NotEquivalent`)."""
    import tiktoken

    try:
        return tiktoken.Encoding(
            name,
            pat_str=conversion.pattern,
            mergeable_ranks=conversion.ranks,
            special_tokens=conversion.special_tokens,
        )
    except ValueError as exc:
        raise NotEquivalent(f"tiktoken cannot use this tokenizer ({exc})") from exc


class TiktokenEncoder:
    """tiktoken's core on a tokenizer.json: the same ids as `tokenizers`, several times faster.

    Only use it where `pipeline.encoder_check` found it equivalent (``choose`` does that).
    With ``confirm`` (what a worker whose library versions differ from the driver's gets)
    building it re-runs the built-in comparison in this process, so such a worker stops
    instead of writing different ids.
    Ids come back as uint32 arrays straight from tiktoken's buffer: no Python int per token.
    """

    name = "tiktoken"

    def __init__(self, path: str, threads: int = 1, confirm: bool = True) -> None:
        self.conversion = convert(read_spec(path))
        self.encoding = build_encoding(self.conversion)
        self._encode = self._ordinary_to_numpy()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tiktoken") if threads > 1 else None
        if confirm:
            from pipeline.encoder_check import confirm_builtin

            confirm_builtin(path, self)

    def _ordinary_to_numpy(self) -> Callable[[str], np.ndarray]:
        """Special-token text encoded as text (tiktoken: ``disallowed_special=()`` is
        ``encode_ordinary``). Both calls raise on a lone surrogate, as `tokenizers` does;
        ``encode_ordinary`` itself would silently replace it and change the ids."""
        encoding = self.encoding
        if encoding.special_tokens_set:
            return functools.partial(encoding.encode_to_numpy, disallowed_special=())
        # With no special tokens tiktoken's special-token scan matches everywhere; skip it.
        core = encoding._core_bpe
        return lambda text: np.asarray(core.encode_ordinary(text), dtype=np.uint32)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        from pipeline.encoders import flat

        return flat(self.encode_batch(texts))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self._pool is None:
            encode = self._encode
            return [encode(t) for t in texts]
        return list(self._pool.map(self._encode, texts))
