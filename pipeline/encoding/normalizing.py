"""A tokenizer's normalizer run ahead of a fast back end, by `tokenizers` itself.

Qwen2's tokenizer.json, and others like it, put an NFC normalizer before a byte-level BPE.
`tokenizers` normalizes the whole text, then pre-tokenizes and merges; the fast back ends are
checked on byte-level BPEs without a normalizer. So a fast back end is built from the file
without its normalizer and given text that `tokenizers`' own normalizer (the same class,
deserialized from the same JSON) has already normalized: the ids are exact by construction,
and the run's equivalence check still compares them with `tokenizers` on the whole file.

Only normalizers in `RUN_AHEAD` are taken out, and only where the file has no non-special added
token (`tokenizers` finds those in the text before it normalizes). Every Unicode normalization
form leaves ASCII text as it is, in every Unicode version, so such text is passed through
without a call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: the normalizers a fast back end takes as already-normalized text
RUN_AHEAD: tuple[dict[str, Any], ...] = ({"type": "NFC"},)

#: the normalizers that leave ASCII text as it is
ASCII_STABLE = frozenset({"NFC", "NFD", "NFKC", "NFKD"})

Normalize = Callable[[str], str]


def run_ahead(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The parsed tokenizer.json's normalizer where it can run ahead of a fast back end, else None."""
    normalizer = spec.get("normalizer")
    if normalizer not in RUN_AHEAD:
        return None
    if any(not t.get("special") for t in spec.get("added_tokens") or []):
        return None
    return normalizer


def without_normalizer(spec: dict[str, Any]) -> dict[str, Any]:
    """The parsed tokenizer.json as the fast back end is built from it (a new dict)."""
    return {**spec, "normalizer": None}


def normalizing(normalizer: dict[str, Any]) -> Normalize:
    """`tokenizers`' own normalizer for this JSON, as a text -> text function."""
    from tokenizers import Tokenizer

    model = {"type": "WordLevel", "vocab": {}, "unk_token": ""}
    host = Tokenizer.from_str(json.dumps({"version": "1.0", "normalizer": normalizer, "model": model}))
    normalize_str = host.normalizer.normalize_str
    if normalizer.get("type") not in ASCII_STABLE:
        return normalize_str

    def normalize(text: str) -> str:
        return text if text.isascii() else normalize_str(text)

    return normalize
