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
pieces either). Such a token marked ``normalized`` is found in the normalized text by its
normalized form; one whose content the normalizer changes would be missed by a back end built
without the normalizer, so it keeps the run off the fast back end (`added_tokens_it_changes`).
Every Unicode normalization form leaves ASCII text as it is, in every Unicode
version, so such text is passed through without a call.

Other text is passed through too where Python's own tables prove NFC leaves it as it is
(`unicodedata.is_normalized`, many times faster than `tokenizers`' NFC), but only for the code
points on which those tables and `tokenizers`' agree. NFC is decided per code point by its
canonical decomposition, its combining class and the pairs that compose; `nfc_disagreements`
compares those on every code point (alone, decomposed and composed again, and ordered against
marks of known class), and `NFC_PROVEN` holds what it found for these versions: the marks of
Unicode versions after `tokenizers`' tables. A text holding one of them is normalized by
`tokenizers`, as is every text where no proof is kept for the installed versions.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.encoding.backend import library_version
from pipeline.encoding.byte_level import normalizer_of, plain_added
from pipeline.encoding.routing import every_code_point

#: the normalizers a fast back end takes as already-normalized text
RUN_AHEAD: tuple[dict[str, Any], ...] = ({"type": "NFC"},)

#: the normalizers that leave ASCII text as it is
ASCII_STABLE = frozenset({"NFC", "NFD", "NFKC", "NFKD"})

Normalize = Callable[[str], str]

#: (`tokenizers` version, Python's Unicode version) -> ranges of the code points whose NFC
#: `tokenizers` and Python's `unicodedata` decide differently (`nfc_disagreements`)
NFC_PROVEN: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("0.23.3", "14.0.0"): (
        (0x07FD, 0x07FD), (0x0898, 0x089F), (0x08CA, 0x08D3), (0x09FE, 0x09FE), (0x0C3C, 0x0C3C),
        (0x0D3B, 0x0D3C), (0x0EBA, 0x0EBA), (0x1715, 0x1715), (0x1ABF, 0x1ACE), (0x1DF6, 0x1DFA),
        (0xA82C, 0xA82C), (0x10D24, 0x10D27), (0x10EAB, 0x10EAC), (0x10F46, 0x10F50),
        (0x10F82, 0x10F85), (0x11070, 0x11070), (0x1133B, 0x1133B), (0x1145E, 0x1145E),
        (0x11839, 0x1183A), (0x11938, 0x11938), (0x1193D, 0x1193E), (0x11943, 0x11943),
        (0x119E0, 0x119E0), (0x11A34, 0x11A34), (0x11A47, 0x11A47), (0x11A99, 0x11A99),
        (0x11D42, 0x11D42), (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x16FF0, 0x16FF1),
        (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
    ),
}  # fmt: skip


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
    normalizer = normalizer_of(spec)
    if normalizer not in RUN_AHEAD:
        return None
    return Ahead(normalizer, bool(plain_added(spec)))


def added_tokens_it_changes(spec: dict[str, Any], ahead: Ahead) -> list[tuple[str, str]]:
    """The non-special added tokens `tokenizers` matches in normalized text (``normalized``)
    whose content its normalizer changes: it looks for their normalized form (``na\u0308ive``
    is found as ``na\u00efve``), a fast back end built without the normalizer for the content as
    written, so the two part on text holding the normalized form, which no check is sure to
    meet. Each as (content, normalized form)."""
    normalize = normalizing(ahead.normalizer)
    matched_normalized = [
        t.get("content", "")
        for t in spec.get("added_tokens") or []
        if not t.get("special") and t.get("normalized", True)
    ]
    return [(content, normalize(content)) for content in matched_normalized if normalize(content) != content]


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
    leaves = python_proves_nfc() if normalizer == {"type": "NFC"} else None

    def normalize(text: str) -> str:
        if text.isascii() or (leaves is not None and leaves(text)):
            return text
        return normalize_str(text)

    return normalize


def python_proves_nfc() -> Callable[[str], bool] | None:
    """A test that `tokenizers`' NFC leaves a text as it is, by Python's tables, for the
    installed versions (`NFC_PROVEN`); None where none is kept for them."""
    ranges = NFC_PROVEN.get((library_version("tokenizers") or "", unicodedata.unidata_version))
    if ranges is None:
        return None
    finds = re.compile(_covering_class(ranges)).search

    def leaves(text: str) -> bool:
        return finds(text) is None and unicodedata.is_normalized("NFC", text)

    return leaves


def _covering_class(ranges: tuple[tuple[int, int], ...]) -> str:
    """A regex class holding every code point of ``ranges``: those above the Basic Multilingual
    Plane as one range from the first to the last (Python's `re` scans text against a class of
    many such ranges at a tenth of its speed on one; a text it holds goes to `tokenizers`)."""
    bmp = [(a, b) for a, b in ranges if b <= 0xFFFF]
    above = [(a, b) for a, b in ranges if b > 0xFFFF]
    if above:
        bmp.append((min(a for a, _ in above), max(b for _, b in above)))
    return "[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in bmp) + "]"


#: code points compared together, in one string, before those of a differing string alone
CHUNK = 256


def nfc_disagreements(nfc: Normalize, nfd: Normalize, code_points: Iterable[int] | None = None) -> list[int]:
    """Every code point whose NFC properties differ between `tokenizers` (its ``nfc`` and
    ``nfd``) and Python's tables: its decomposition and composition (NFD and NFC of it alone, its
    decomposition composed again) and its combining class, by the order NFD gives it beside a
    mark of each class that Unicode 3.2 already had (so both tables know the mark). The probes
    of `CHUNK` code points are compared as one string first, each probe set off by spaces
    (a starter nothing composes with, so each is normalized as if alone); a string that
    differs has its code points compared one by one."""
    marks = _marks_by_class()
    classes = tuple(marks.values())
    ends = (marks[min(marks)], marks[max(marks)])  # any class but 0 is reordered beside one
    cps = list(every_code_point() if code_points is None else code_points)
    found = []
    for i in range(0, len(cps), CHUNK):
        chunk = cps[i : i + CHUNK]
        probes = [_probes(chr(c), classes if unicodedata.combining(chr(c)) else ends) for c in chunk]
        if _same(nfc, nfd, " ".join(" ".join(p) for p in probes)):
            continue
        found += [c for c, p in zip(chunk, probes, strict=True) if not all(_same(nfc, nfd, t) for t in p)]
    return found


def _probes(ch: str, beside: tuple[str, ...]) -> list[str]:
    """``ch`` alone, its decomposition, and ``ch`` after and before each mark of ``beside``."""
    return [
        ch,
        unicodedata.normalize("NFD", ch),
        *["a" + m + ch for m in beside],
        *["a" + ch + m for m in beside],
    ]


def _same(nfc: Normalize, nfd: Normalize, text: str) -> bool:
    return nfd(text) == unicodedata.normalize("NFD", text) and nfc(text) == unicodedata.normalize("NFC", text)


def _marks_by_class() -> dict[int, str]:
    """One combining mark of each class, from those Unicode 3.2 had with that class."""
    old = unicodedata.ucd_3_2_0
    marks: dict[int, str] = {}
    for c in every_code_point():
        ch = chr(c)
        cls = old.combining(ch)
        if cls and cls not in marks and not old.decomposition(ch) and unicodedata.combining(ch) == cls:
            marks[cls] = ch
    return marks


def code_point_ranges(code_points: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted code points as (first, last) runs, as `NFC_PROVEN` keeps them."""
    runs: list[tuple[int, int]] = []
    for c in sorted(code_points):
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return tuple(runs)
