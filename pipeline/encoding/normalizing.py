"""A tokenizer's normalizer run ahead of a fast back end, by `tokenizers` itself.

Qwen2's tokenizer.json, and others like it, put an NFC normalizer before a byte-level BPE.
`tokenizers` normalizes the whole text, then pre-tokenizes and merges; the fast back ends are
checked on byte-level BPEs without a normalizer. So a fast back end is built from the file
without its normalizer and given text that `tokenizers`' own normalizer (the same class,
deserialized from the same JSON) has already normalized: the ids are exact by construction,
and the run's equivalence check still compares them with `tokenizers` on the whole file.

Only normalizers in `RUN_AHEAD` are taken out. Where the file has non-special added tokens
(Qwen2.5's tool-call and fill-in-the-middle markers), `tokenizers` finds those in the text
before it normalizes, so the text cannot be normalized first: there a text the normalizer
would change goes to `tokenizers` whole (`Ahead.route_changed`), and every other is encoded as
it is (a part of a normalized text is normalized too, so `tokenizers` changes none of its
pieces either). Every Unicode normalization form leaves ASCII text as it is, in every Unicode
version, so such text is passed through without a call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.encoding.byte_level import plain_added

#: the normalizers a fast back end takes as already-normalized text
RUN_AHEAD: tuple[dict[str, Any], ...] = ({"type": "NFC"},)

#: the normalizers that leave ASCII text as it is
ASCII_STABLE = frozenset({"NFC", "NFD", "NFKC", "NFKD"})

Normalize = Callable[[str], str]


@dataclass(frozen=True)
class Ahead:
    """How a tokenizer's normalizer is taken off a fast back end."""

    normalizer: dict[str, Any]
    #: the file has non-special added tokens: texts the normalizer changes go to `tokenizers`,
    #: the others are encoded as they are; else every text is normalized first
    route_changed: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Ahead | None:
        """`to_json`'s text back (``null``: none); `ValueError` for any other text."""
        data = json.loads(text)
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("normalizer") not in RUN_AHEAD:
            raise ValueError(f"not a normalizer run ahead: {text[:80]!r}")
        if not isinstance(data.get("route_changed"), bool):
            raise ValueError(f"not a normalizer run ahead: {text[:80]!r}")
        return cls(data["normalizer"], data["route_changed"])


def run_ahead(spec: dict[str, Any]) -> Ahead | None:
    """How the parsed tokenizer.json's normalizer runs ahead of a fast back end, None where it cannot."""
    normalizer = spec.get("normalizer")
    if normalizer not in RUN_AHEAD:
        return None
    return Ahead(normalizer, bool(plain_added(spec)))


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
