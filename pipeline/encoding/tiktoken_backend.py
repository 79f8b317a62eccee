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
`pipeline.encoding.selection.check` compares the two on real strings before any run uses this).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.encoding.backend import flat
from pipeline.encoding.byte_level import (
    NotEquivalent,
    byte_decoder,
    check_model,
    merge_pairs,
    pattern_of,
    to_bytes,
)
from pipeline.encoding.equivalence import confirm_builtin
from pipeline.encoding.tokenizer import read_spec


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


def convert(spec: dict[str, Any]) -> Conversion:
    """Restate a parsed tokenizer.json for tiktoken, or say why that would change ids."""
    model = check_model(spec)
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
    for a, b in merge_pairs(model.get("merges") or []):
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

    Only use it where `pipeline.encoding.equivalence` found it equivalent (``decide`` does that).
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
        return flat(self.encode_batch(texts))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self._pool is None:
            encode = self._encode
            return [encode(t) for t in texts]
        return list(self._pool.map(self._encode, texts))
