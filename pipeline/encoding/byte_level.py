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

from pipeline.format.errors import TokshardError

#: GPT-2's split pattern as `tokenizers`' ByteLevel(use_regex=True) spells it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_pattern_within(longest: int) -> str:
    """GPT-2's split pattern with each run (of letters, digits, other signs, white space) cut
    into pieces of at most ``longest`` characters: a run no longer splits exactly as
    `GPT2_PATTERN` splits it. (Each ``+`` in it is a repeat, none a literal plus sign.)"""
    return GPT2_PATTERN.replace("+", f"{{1,{longest}}}")


#: Llama 3's split pattern, as its tokenizer.json spells it
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen's split pattern (Qwen2 and Qwen2.5 as their tokenizer.json spells it): Llama 3's with
#: one digit a pre-token
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: the contractions of the patterns below, each case spelled out (as tiktoken's converted
#: files spell them) and as one case-insensitive group (as Llama 3's own file does): the same
#: matches, since no character but the ASCII letters folds to one of them save U+017F LATIN
#: SMALL LETTER LONG S, which `tokenizers` matches with neither spelling
CONTRACTIONS_SPELLED_OUT = r"('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)"
CONTRACTIONS_FOLDED = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#: DeepSeek V3's (and R1's) split patterns, as its tokenizer.json runs them one after another:
#: runs of up to three digits, runs of CJK ideographs and kana, then a GPT-style pattern
DEEPSEEK_V3_PATTERNS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    # the file holds CR and LF themselves where this spells their escapes
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""".replace("\\r\\n", "\r\n"),
)
#: OpenAI's cl100k_base (GPT-4) and o200k_base (GPT-4o) patterns, as their tiktoken files spell them
CL100K_PATTERN = (
    CONTRACTIONS_SPELLED_OUT
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _o200k(contractions: str) -> str:
    upper_then_lower = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    upper_run = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    rest = r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    return f"{upper_then_lower}{contractions}?|{upper_run}{contractions}?{rest}"


O200K_PATTERN = _o200k(CONTRACTIONS_SPELLED_OUT)
#: o200k_base's pattern with its contractions folded, as GPT-4o's other published files spell it
O200K_FOLDED_PATTERN = _o200k(CONTRACTIONS_FOLDED)


#: split patterns that start a non-empty match at every position of any text: every code point
#: is a letter, a number, white space or none of those, and each of the four classes has an
#: alternative that matches it whatever stands around it (``\p{L}+``, ``\p{N}``, ``\s+``,
#: ``[^\s\p{L}\p{N}]+``; o200k_base's letter runs take ``\p{M}`` too, which the last one also
#: matches). Splitting on one leaves no text between two matches, so a Split that drops that text
#: (behavior ``Removed`` with ``invert``, as Xenova's GPT-4 and GPT-4o files spell it) cuts the
#: same pieces as one that isolates each match; tests/pipeline/encoding/test_byte_level.py proves
#: it over every code point with `tokenizers`' own Split
TOTAL_PATTERNS = (
    GPT2_PATTERN,
    LLAMA3_PATTERN,
    QWEN2_PATTERN,
    CL100K_PATTERN,
    O200K_PATTERN,
    O200K_FOLDED_PATTERN,
)


class NotEquivalent(TokshardError):
    """A fast back end cannot encode exactly like `tokenizers` for this tokenizer; says why."""


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


def changes_nothing(normalizer: dict[str, Any] | None) -> bool:
    """Is this normalizer none at all: absent, or a ``Sequence`` of normalizers that each change
    nothing (DeepSeek V3 ships ``{"type": "Sequence", "normalizers": []}``)?"""
    if normalizer is None:
        return True
    if not isinstance(normalizer, dict) or normalizer.get("type") != "Sequence":
        return False
    steps = normalizer.get("normalizers")
    return isinstance(steps, list) and all(isinstance(s, dict) and changes_nothing(s) for s in steps)


def normalizer_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A parsed tokenizer.json's normalizer, None where it changes nothing (`changes_nothing`):
    the one place the shape rules read it."""
    normalizer = spec.get("normalizer")
    return None if changes_nothing(normalizer) else normalizer


def is_byte_level_bpe(spec: dict[str, Any]) -> bool:
    """True for a parsed tokenizer.json of the shape above."""
    model = spec.get("model") or {}
    parts = pre_tokenizer_parts(spec.get("pre_tokenizer"))
    byte_level = byte_level_parts(parts)
    return (
        model.get("type") == "BPE"
        and normalizer_of(spec) is None
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


#: the bytes a byte-level symbol most often stands for, by the name a line gives them
BYTE_NAMES = {0x00: "NUL byte", 0x09: "tab", 0x0A: "newline", 0x0D: "carriage return", 0x20: "space"}


def stood_for(token: str) -> bytes | None:
    """The bytes a byte-level vocabulary string stands for where they differ from its own text
    (``Ġ`` a space, ``Ċ`` a newline, ``Ā`` NUL); None where it is its own text or no such string."""
    try:
        raw = to_bytes(token)
    except ValueError:
        return None
    return None if raw == token.encode("utf-8") else raw


def byte_name(byte: int) -> str:
    """A byte as a line names it: ``space``, ``newline``, else ``byte 0xC3``."""
    return BYTE_NAMES.get(byte, f"byte 0x{byte:02X}")


def pattern_of(pre_tokenizer: dict[str, Any] | None) -> str:
    """The one regex that splits text into pieces, as tiktoken needs it."""
    parts = pre_tokenizer_parts(pre_tokenizer)
    kinds = [p.get("type") for p in parts]
    byte_level = byte_level_parts(parts)
    if len(byte_level) != 1:
        raise NotEquivalent(f"pre-tokenizer {'+'.join(map(str, kinds)) or 'none'} is not byte-level")
    bl = byte_level[0]
    if bl.get("add_prefix_space"):
        raise NotEquivalent("ByteLevel add_prefix_space=true adds a space the fast encoders do not")
    uses_regex = bl.get("use_regex", True)
    if kinds == ["ByteLevel"]:
        if not uses_regex:
            raise NotEquivalent("ByteLevel without a split pattern: no regex for the fast encoders")
        return GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"] and not uses_regex:
        split = parts[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if regex is None:
            raise NotEquivalent("Split pre-tokenizer on a literal string, not a regex")
        if not isolates_matches(split):
            raise NotEquivalent(
                f"Split pre-tokenizer with behavior {split.get('behavior')}"
                f"{' inverted' if split.get('invert') else ''}; tiktoken isolates matches"
            )
        return regex
    raise NotEquivalent(
        f"pre-tokenizer sequence {'+'.join(map(str, kinds))} has no equivalent in the fast encoders"
    )


def isolates_matches(split: dict[str, Any]) -> bool:
    """Does this regex Split cut text as tiktoken does, into its pattern's matches and the text
    between them? Behavior ``Isolated`` does; ``Removed`` with ``invert`` keeps the matches and
    drops the text between them, which is the same where a match starts at every position
    (`TOTAL_PATTERNS`)."""
    behavior, inverted = split.get("behavior"), bool(split.get("invert"))
    if behavior == "Isolated":
        return not inverted
    regex = (split.get("pattern") or {}).get("Regex")
    return behavior == "Removed" and inverted and regex in TOTAL_PATTERNS


#: what ``Digits(individual_digits=true)`` cuts, spelled as a split pattern: each character
#: Unicode calls a number (Nd, Nl, No; Rust's ``char::is_numeric``) a piece of its own
EACH_DIGIT = r"\p{N}"


def split_patterns(pre_tokenizer: dict[str, Any] | None) -> tuple[str, ...]:
    """The regexes that cut text into pieces, in the order they run, as fastokens takes them:
    `pattern_of`'s one; those of a ``Sequence`` of several Isolated, non-inverted regex
    ``Split``s then ``ByteLevel(use_regex=false)`` (DeepSeek V3's three), where each ``Split``
    cuts the pieces the ones before it left, in both libraries; or each digit alone, then
    GPT-2's pattern (``Digits(individual_digits=true)`` then ``ByteLevel(use_regex=true)``, as
    Command R ships it). `NotEquivalent` otherwise."""
    parts = pre_tokenizer_parts(pre_tokenizer)
    kinds = [p.get("type") for p in parts]
    if kinds == ["Digits", "ByteLevel"]:
        digits, bl = parts
        if not digits.get("individual_digits") or bl.get("add_prefix_space") or not bl.get("use_regex", True):
            raise NotEquivalent(
                "pre-tokenizer Digits+ByteLevel other than each digit alone then GPT-2's split"
            )
        return (EACH_DIGIT, GPT2_PATTERN)
    if len(parts) < 3 or kinds != ["Split"] * (len(parts) - 1) + ["ByteLevel"]:
        return (pattern_of(pre_tokenizer),)
    if parts[-1].get("add_prefix_space") or parts[-1].get("use_regex", True):
        raise NotEquivalent(
            f"pre-tokenizer {'+'.join(kinds)} ends in a ByteLevel that adds a space or splits again"
        )
    return tuple(map(isolated_regex, parts[:-1]))


def isolated_regex(split: dict[str, Any]) -> str:
    """One of several ``Split``s' regex, if it isolates its matches (the one shape checked)."""
    regex = (split.get("pattern") or {}).get("Regex")
    if regex is None:
        raise NotEquivalent("one of several Split pre-tokenizers splits on a literal string, not a regex")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise NotEquivalent(
            f"one of several Split pre-tokenizers has behavior {split.get('behavior')}"
            f"{' inverted' if split.get('invert') else ''}; only Isolated ones are checked"
        )
    return regex


def check_model(spec: dict[str, Any]) -> dict[str, Any]:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotEquivalent(f"model {model.get('type')} is not BPE")
    normalizer = normalizer_of(spec)
    if normalizer is not None:
        kind = normalizer.get("type", "?")
        raise NotEquivalent(
            f"normalizer {kind} changes the text before BPE; tiktoken takes none, fastokens only NFC"
        )
    for option, harmless in (
        ("dropout", (None, 0, 0.0)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
        ("byte_fallback", (None, False)),
    ):
        if model.get(option) not in harmless:
            raise NotEquivalent(
                f"BPE option {option}={model[option]!r} has no equivalent in the fast encoders"
            )
    return model


def merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    """Merges as pairs, whether the file spells them "a b" (older) or ["a", "b"]."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def applied_merges(model: dict[str, Any]) -> list[Any] | None:
    """The merges a BPE model can ever apply, in their order, where that drops some: files
    converted from tiktoken ranks list every split of a token into two entries (o200k_base:
    446,189 merges for 200k ids), and reading merges is most of a fast back end's build.

    Greedy BPE (the lowest-ranked adjacent pair first) applies, inside the span of any token
    it makes, the same merges in the same order as on that token's text alone: nothing outside
    the span touches it until the token exists. So every merge applied anywhere is the last
    merge of some token's own BPE, and keeping just those (ranks in the same order) changes no
    output. None where nothing would drop (no more merges than ids) or the model has options
    this reasoning does not cover."""
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return None
    if len(merges) <= len(vocab) or any(
        model.get(option)
        for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")
    ):
        return None
    rank: dict[tuple[str, str], int] = {}
    for i, pair in enumerate(merge_pairs(merges)):
        if rank.setdefault(pair, i) != i:  # a pair listed twice: which rank wins is the library's
            return None
    kept = {last for token in vocab if len(token) > 1 and (last := _last_merge(token, rank)) is not None}
    return [merges[i] for i in sorted(kept)]


def _last_merge(token: str, rank: dict[tuple[str, str], int]) -> int | None:
    """The rank of the merge that completes ``token`` in its own BPE (None: BPE never makes it)."""
    parts = list(token)
    last = None
    while len(parts) > 1:
        best, at = None, 0
        for j in range(len(parts) - 1):
            r = rank.get((parts[j], parts[j + 1]))
            if r is not None and (best is None or r < best):
                best, at = r, j
        if best is None:
            return None
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
        last = best
    return last


def check_fast_shape(spec: dict[str, Any]) -> None:
    """The rules every fast back end needs of a parsed tokenizer.json (those of tiktoken's
    conversion, minus the ones about tiktoken's own merge order); `NotEquivalent` naming the
    first one broken."""
    vocab = check_model(spec).get("vocab") or {}
    split_patterns(spec.get("pre_tokenizer"))
    missing = [b for ch, b in byte_decoder().items() if ch not in vocab]
    if missing:
        raise NotEquivalent(
            f"vocabulary lacks {len(missing)} of the 256 bytes (first 0x{min(missing):02x}); "
            "tokenizers drops such bytes, the fast back ends cannot"
        )


#: every space made a "▁", the normalizer of a SentencePiece-style BPE (the model sees the
#: whole text, no pre-tokenizer splits it)
SPACES_TO_METASPACE = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
#: the normalizer of a SentencePiece-style BPE as Llama 2 and Mistral ship it: a "▁" before the
#: text too
SENTENCEPIECE_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, SPACES_TO_METASPACE],
}
#: the normalizers of the SentencePiece-style BPEs fastokens is checked on: Llama 2's, and
#: without the "▁" before the text, InternLM2's and Yi's (in a Sequence) and Gemma's (alone)
SENTENCEPIECE_NORMALIZERS = (
    SENTENCEPIECE_NORMALIZER,
    {"type": "Sequence", "normalizers": [SPACES_TO_METASPACE]},
    SPACES_TO_METASPACE,
)


def splits_nothing_after_metaspace(pre_tokenizer: dict[str, Any] | None) -> bool:
    """No pre-tokenizer, or Gemma's: a Split on the string " ", which finds none once the
    normalizer has made every space a "▁" (it runs on the normalized text), so the model
    still sees the whole text."""
    if pre_tokenizer is None:
        return True
    return (
        pre_tokenizer.get("type") == "Split"
        and pre_tokenizer.get("pattern") == {"String": " "}
        and not pre_tokenizer.get("invert")
    )


def is_sentencepiece_bpe(spec: dict[str, Any]) -> bool:
    """A SentencePiece-style BPE with byte fallback in one of the published shapes
    (`SENTENCEPIECE_NORMALIZERS`; the one other shape a fast back end, fastokens, is checked on)."""
    model = spec.get("model") or {}
    return (
        model.get("type") == "BPE"
        and spec.get("normalizer") in SENTENCEPIECE_NORMALIZERS
        and splits_nothing_after_metaspace(spec.get("pre_tokenizer"))
        and model.get("byte_fallback") is True
        and model.get("dropout") in (None, 0, 0.0)
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
    )


def sentencepiece_text(token: str) -> str:
    """The text a SentencePiece-style vocabulary entry stands for (its "▁" are spaces)."""
    return token.replace("\u2581", " ")


#: Split patterns in which no pre-token holds a character no engine calls white space
#: followed by U+0020 (a space only ever starts a pre-token or sits in an all-whitespace one),
#: with no look-behind, and whose look-aheads (``(?!\\S)``) see a space there as the end of
#: the text: GPT-2's (ByteLevel's own), Llama 3's, cl100k_base's and o200k_base's (in both
#: spellings of its contractions, which hold no space). In them every such "word character,
#: space" position is a pre-token boundary of the whole text, and the text before it
#: pre-tokenizes the same alone (docs/ENCODERS.md, "Long documents"). DeepSeek V3's three
#: too: its first two hold no space and look neither ahead nor behind, so a cut there leaves
#: their pieces as they were, and its third is of the same kind as those above (a space starts
#: a piece or sits in an all-whitespace one, and every white space character is matched by
#: ``\s+``, so none sits in a span no alternative matches).
SPACE_CUT_PATTERNS = (
    (GPT2_PATTERN,),
    (LLAMA3_PATTERN,),
    (CL100K_PATTERN,),
    (O200K_PATTERN,),
    (O200K_FOLDED_PATTERN,),
    DEEPSEEK_V3_PATTERNS,
)


def space_cuts_apply(spec: dict[str, Any]) -> bool:
    """Can a parsed tokenizer.json's long documents be cut at every "word character, space"
    (`pipeline.encoding.documents.space_cut`)? A BPE without a normalizer whose split patterns
    are one of `SPACE_CUT_PATTERNS`, and no non-special added token holding a space (those are
    cut out of the text before pre-tokenizing, so one may span a pre-token boundary)."""
    try:
        patterns = split_patterns(spec.get("pre_tokenizer"))
    except NotEquivalent:
        return False
    model = spec.get("model") or {}
    bpe = model.get("type") == "BPE" and normalizer_of(spec) is None
    return bpe and patterns in SPACE_CUT_PATTERNS and not any(" " in t for t in plain_added(spec))


def special_added(spec: dict[str, Any]) -> list[str]:
    """The contents of a parsed tokenizer.json's special added tokens."""
    return [t.get("content", "") for t in spec.get("added_tokens") or [] if t.get("special")]


def plain_added(spec: dict[str, Any]) -> list[str]:
    """The contents of a parsed tokenizer.json's non-special added tokens."""
    return [t.get("content", "") for t in spec.get("added_tokens") or [] if not t.get("special")]
