"""What "byte-level BPE" means here, defined once: the shape, and the byte table under it.

A byte-level BPE (GPT-2, OPT/RoBERTa, Llama-3 style, or one trained by ``tokshard tokenizer
train``) is a BPE model with no normalizer and exactly one ``ByteLevel`` pre-tokenizer that
adds no prefix space, beside which only regex ``Split`` and ``Digits`` may cut the text. For
such a tokenizer, cutting a document at its own pre-tokenizer's boundaries changes no id
(`pipeline.encoding.documents` relies on that). tiktoken runs a narrower subset of these
(`pipeline.encoding.tiktoken_backend.pattern_of` says which, and why the rest are refused).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

#: pre-tokenizers a byte-level BPE may combine with its one ByteLevel
BYTE_LEVEL_COMPANIONS = ("ByteLevel", "Split", "Digits")


def pre_tokenizer_parts(pre_tokenizer: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The pre-tokenizers of a tokenizer.json, a ``Sequence`` unpacked (none: empty)."""
    pre = pre_tokenizer or {}
    if pre.get("type") == "Sequence":
        return pre.get("pretokenizers", [])
    return [pre] if pre else []


def byte_level_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in parts if p.get("type") == "ByteLevel"]


def is_byte_level_bpe(spec: dict[str, Any]) -> bool:
    """True for a parsed tokenizer.json of the shape above."""
    model = spec.get("model") or {}
    parts = pre_tokenizer_parts(spec.get("pre_tokenizer"))
    byte_level = byte_level_parts(parts)
    return (
        model.get("type") == "BPE"
        and spec.get("normalizer") is None
        and len(byte_level) == 1
        and not byte_level[0].get("add_prefix_space", False)
        and all(p.get("type") in BYTE_LEVEL_COMPANIONS for p in parts)
    )


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
