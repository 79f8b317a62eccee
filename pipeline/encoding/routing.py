"""Where fastokens parts from `tokenizers`, bounded to a class of characters, and the encoder
that sends only the documents holding one of them to the reference.

fastokens splits the published patterns (GPT-2's, Llama 3's, Qwen's, DeepSeek V3's three in a
row, and cl100k_base's and o200k_base's in the spelling `fastokens_backend.NATIVE_SPELLING`
gives them) without a regex engine, and any other on PCRE2, where `tokenizers` runs Oniguruma.
The two can part on a class of characters: PCRE2 counts U+180E MONGOLIAN VOWEL SEPARATOR as
white space, which Unicode stopped doing in 6.3, so on its regex route a document holding
U+180E may split differently. `disagreeing_code_points` finds such a class by comparing the two
on every code point of the planes Unicode assigns characters in (`scanned_code_points`; in the
others, alike to every table, their edges and a stride) in the contexts the patterns tell apart
(letters of both cases, digits, spaces, tabs, newlines, contractions; `context_for` a file's
patterns); `PROVEN` holds what it found for fastokens as `FastokensEncoder` builds it on the
published patterns and these library versions (nothing, since the native spellings), which
tests/pipeline/encoding/test_routing.py proves again. Where no class is proven, nothing is
routed and the check decides as before (a difference refuses fastokens for the run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.encoding.backend import flat, library_versions
from pipeline.encoding.byte_level import (
    CL100K_PATTERN,
    DEEPSEEK_V3_PATTERNS,
    LLAMA3_PATTERN,
    O200K_PATTERN,
    QWEN2_PATTERN,
    NotEquivalent,
    split_patterns,
)
from pipeline.encoding.tokenizer import read_spec

#: (fastokens version, tokenizers version, the file's split patterns as
#: `byte_level.split_patterns` gives them) -> the code points on which they part
PROVEN: dict[tuple[str, str, tuple[str, ...]], frozenset[int]] = {
    ("0.3.5", "0.23.3", (CL100K_PATTERN,)): frozenset(),
    ("0.3.5", "0.23.3", (O200K_PATTERN,)): frozenset(),
    ("0.3.5", "0.23.3", (LLAMA3_PATTERN,)): frozenset(),
    ("0.3.5", "0.23.3", (QWEN2_PATTERN,)): frozenset(),
    ("0.3.5", "0.23.3", DEEPSEEK_V3_PATTERNS): frozenset(),
}

#: one code point ``c`` in every context the patterns tell apart
CONTEXT = "a{c}a {c}1{c} 'll{c}'s {c}{c}\n{c} A{c}b {c}'VE\t{c}\r\nn'{c}t"
#: the same for DeepSeek V3's patterns (`DEEPSEEK_V3_PATTERNS`). They ask a character which of
#: these it is: a digit (\p{N}), a letter or mark (\p{L}, \p{M}: asked together everywhere,
#: save that a mark may also be the one character before a run of letters, where it joins
#: the run all the same), punctuation or a symbol (\p{P}, \p{S}: asked together everywhere),
#: white space (\s), or none; the CJK and kana ranges, the ASCII marks and letters and CR
#: and LF are code points listed in the patterns, the same to any engine. A character's bytes
#: seldom merge with their neighbours, so each context shows its answer in a boundary
#: elsewhere that moves with it: "1{c}23" (a digit takes "2" into its run of three, which
#: parts "2" from "3", one token otherwise), " x  {c}b" (white space keeps the two spaces
#: together, anything else leaves one before it), "{c}.com" and "{c}'s" (punctuation takes
#: the mark, which parts it from the letters after it, one token otherwise), " {c}" (a letter or punctuation takes the space before it, which merges with
#: its first byte, none leaves it alone), and a letter or kana beside it, and newlines after.
#: A mark taken for a letter by one engine and for none of these by the other moves only the
#: boundaries beside it, which change ids only where its bytes merge with that neighbour.
DEEPSEEK_CONTEXT = "1{c}23 x  {c}b {c}.com {c}'s 中{c}ab{c} {c}\n\n"


def context_for(patterns: tuple[str, ...]) -> str:
    """The contexts the scan puts each code point in for these split patterns."""
    return DEEPSEEK_CONTEXT if patterns == DEEPSEEK_V3_PATTERNS else CONTEXT


#: code points compared per string (a difference is then narrowed down to its code point)
CHUNK = 256


def proven_class(patterns: tuple[str, ...] | None, versions: dict[str, str]) -> frozenset[int] | None:
    """The proven class for these split patterns and library versions, None if none is."""
    if patterns is None:
        return None
    return PROVEN.get((versions.get("fastokens", ""), versions.get("tokenizers", ""), patterns))


def fastokens_class(tokenizer_path: str) -> frozenset[int] | None:
    """The proven class of a byte-level tokenizer.json for the installed libraries (None: none
    is proven, or it is not a byte-level BPE of a shape fastokens is checked on).

    Keyed by the patterns alone, whichever way the file's Split keeps its matches: the classes
    were proven on Splits that isolate them, and `pattern_of` takes one that drops the text
    between them (``Removed`` with ``invert``, Xenova's GPT-4 files) only for a pattern that
    leaves no such text (`byte_level.TOTAL_PATTERNS`), so `tokenizers` cuts the same pieces, and
    fastokens is built from the isolating spelling (`fastokens_backend.natively_spelled`)."""
    try:
        patterns = split_patterns(read_spec(tokenizer_path).get("pre_tokenizer"))
    except NotEquivalent:
        return None
    return proven_class(patterns, dict(library_versions()))


def every_code_point() -> list[int]:
    """Every Unicode scalar value (no surrogates: they cannot be in a document's text)."""
    return [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


#: the planes that hold every character a Unicode version has assigned so far (the Basic and
#: Supplementary Multilingual planes, the two Ideographic planes, and the Supplementary
#: Special-purpose plane's tags and variation selectors): where engines whose tables come from
#: different Unicode versions can part, as PCRE2 and Oniguruma do on U+180E
ASSIGNED_PLANES = (0, 1, 2, 3, 14)
#: In the other planes every code point is alike to any table: planes 4 to 13 hold no character
#: of any version, 15 and 16 only private use, a category Unicode keeps fixed. What no table
#: decides there (a code point's four UTF-8 bytes, the ends of ranges) shows on each plane's
#: first and last code points and on a stride between; that the reference's engine gives them no
#: class the patterns ask is checked whole (`classed_outside_assigned_planes`).
PLANE_EDGE = 1024
#: a prime, so the stride meets every value of a code point's last UTF-8 byte
PLANE_STRIDE = 61


def outside_assigned_planes() -> list[int]:
    """Every code point outside `ASSIGNED_PLANES`: no character in any Unicode version, or
    private use."""
    return [c for c in every_code_point() if c >> 16 not in ASSIGNED_PLANES]


def scanned_code_points() -> list[int]:
    """The code points a scan compares: every scalar value of `ASSIGNED_PLANES`, and of each
    other plane its first and last `PLANE_EDGE` and every `PLANE_STRIDE`-th between."""
    cps = [c for c in every_code_point() if c >> 16 in ASSIGNED_PLANES]
    for plane in sorted(set(range(17)) - set(ASSIGNED_PLANES)):
        start, end = plane << 16, (plane + 1) << 16
        cps += [
            c
            for c in range(start, end)
            if c < start + PLANE_EDGE or c >= end - PLANE_EDGE or c % PLANE_STRIDE == 0
        ]
    return cps


#: every class a split pattern of these vocabularies asks a character for (letters and marks,
#: digits, punctuation and symbols, separators and white space, and what folds to a
#: contraction's letter)
ANY_CLASS = r"[\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}\s]|(?i:[a-z])"


def classed_outside_assigned_planes() -> list[int]:
    """The code points outside `ASSIGNED_PLANES` that `tokenizers`' regex engine puts in a class
    of `ANY_CLASS`: none, where the scan's premise holds."""
    import tokenizers  # the scan's own check, not the encoders': a worker need not load it here

    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(ANY_CLASS), behavior="removed", invert=True)
    cps = outside_assigned_planes()
    found: list[int] = []
    for i in range(0, len(cps), 4096):
        found += [ord(piece) for piece, _ in split.pre_tokenize_str("".join(map(chr, cps[i : i + 4096])))]
    return found


def in_context(code_points: Sequence[int], context: str = CONTEXT) -> str:
    return "".join(context.format(c=chr(c)) for c in code_points)


EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


def disagreeing_code_points(
    fast: EncodeBatch,
    reference: EncodeBatch,
    code_points: Sequence[int] | None = None,
    context: str = CONTEXT,
) -> list[int]:
    """Every code point of ``code_points`` (by default `scanned_code_points`) on which ``fast``
    and ``reference`` give different ids in ``context`` (`context_for` the patterns)."""
    cps = list(scanned_code_points() if code_points is None else code_points)
    chunks = [cps[i : i + CHUNK] for i in range(0, len(cps), CHUNK)]
    texts = [in_context(chunk, context) for chunk in chunks]
    found = []
    for chunk, want, got in zip(chunks, reference(texts), fast(texts), strict=True):
        if _ids(want) == _ids(got):
            continue
        alone = [in_context([c], context) for c in chunk]
        found += [
            c for c, w, g in zip(chunk, reference(alone), fast(alone), strict=True) if _ids(w) != _ids(g)
        ]
    return found


def _ids(ids: Sequence[int]) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def describe(code_points: frozenset[int], changed_by: str | None = None) -> str:
    """The class as the manifest and the log name it, e.g. ``holding U+180E``, or ``text its
    NFC normalizer changes`` (``changed_by``, the normalizer's type), or both."""
    parts = ["holding " + ", ".join(f"U+{c:04X}" for c in sorted(code_points))] if code_points else []
    if changed_by:
        parts.append(f"text its {changed_by} normalizer changes")
    return " or ".join(parts)


class RoutedEncoder:
    """The fast encoder for every text without a character of ``route`` (and, with
    ``changed_by``, that this normalizer leaves as it is), the reference (built at the first
    such text) for the others; ``routed`` counts the latter."""

    def __init__(
        self,
        fast,
        reference: Callable[[], object],
        route: frozenset[int],
        changed_by: Callable[[str], str] | None = None,
    ) -> None:
        self.name = fast.name
        self.fast = fast
        self.route = route
        self._reference_factory = reference
        self._reference = None
        holds = "[" + "".join(re.escape(chr(c)) for c in sorted(route)) + "]"
        self._finds = re.compile(holds).search if route else None
        self._changed_by = changed_by
        self.routed = 0

    @property
    def reference(self):
        if self._reference is None:
            self._reference = self._reference_factory()
        return self._reference

    def _split(self, texts: list[str]) -> list[int]:
        finds, changed_by = self._finds, self._changed_by
        return [
            i
            for i, text in enumerate(texts)
            if (finds is not None and finds(text)) or (changed_by is not None and changed_by(text) != text)
        ]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        routed = self._split(texts)
        if not routed:
            return self.fast.encode_flat(texts)
        return flat(self._encode_routed(texts, routed))

    def encode_batch(self, texts: list[str]) -> list:
        routed = self._split(texts)
        if not routed:
            return list(self.fast.encode_batch(texts))
        return self._encode_routed(texts, routed)

    def _encode_routed(self, texts: list[str], routed: list[int]) -> list:
        self.routed += len(routed)
        marked = set(routed)
        rest = [i for i in range(len(texts)) if i not in marked]
        out: list = [None] * len(texts)
        for i, ids in zip(rest, self.fast.encode_batch([texts[i] for i in rest]), strict=True):
            out[i] = ids
        for i, ids in zip(routed, self.reference.encode_batch([texts[i] for i in routed]), strict=True):
            out[i] = ids
        return out


def routed_count(encoder) -> int:
    """How many texts an encoder has routed to the reference so far (0 for any but a
    `RoutedEncoder`)."""
    return encoder.routed if isinstance(encoder, RoutedEncoder) else 0
