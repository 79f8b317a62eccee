"""Does a fast back end (tiktoken, fastokens) encode this tokenizer as `tokenizers` does?
Checked, not assumed.

Four comparisons, all deterministic and together well under a second for a 50k vocabulary:

1. every token a merge makes, alone as a word: for tiktoken, `tokenizers` must give back
   that one token, as tiktoken does (it looks whole pieces up first), so neither can emit
   what the other cannot; for fastokens, both must give the same ids for it;
2. built-in strings where tokenizers tend to disagree (contractions, digits, runs of spaces
   and newlines, tabs, CJK, emoji, combining marks, control characters, special-token text
   inside a document, very long words) and strings glued from random vocabulary entries;
3. a fuzz set: strings drawn at random (fixed seed) from Unicode whitespace (U+0085, U+180E
   among them), contractions and quotes next to each other, letters and digits; and runs
   of 500 to 3,000 of one character (where a native BPE's fast paths are most likely to
   part from the reference);
4. the run's first documents (each cut to a few thousand characters).

Any difference is reported with the first string that shows it. Passing is strong evidence,
not a proof: a run's later documents are not compared, which is why the structural rules in
`pipeline.encoding.tiktoken_backend.convert` exclude every known way the two algorithms part.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.encoding.backend import TokenizersEncoder, library_versions
from pipeline.encoding.byte_level import (
    NotEquivalent,
    check_fast_shape,
    is_sentencepiece_bpe,
    merge_pairs,
    plain_added,
    sentencepiece_text,
    special_added,
    split_patterns,
    to_bytes,
)
from pipeline.encoding.normalizing import added_tokens_it_changes, run_ahead, without_normalizer
from pipeline.encoding.tokenizer import read_spec
from pipeline.format.errors import TokshardError

SAMPLE_DOCS = 64
SAMPLE_DOC_CHARS = 4096
BLENDS = 512
FUZZ = 2048

_SHORT: tuple[str, ...] = (
    # contractions, and near misses of the patterns' apostrophe rules
    "I'm sure they'll say we've done what she'd do; it's 'yours', you're right, don't.",
    "DON'T SHOUT, It'S fine, rock 'n' roll, the '90s, o'clock, y'all'll'd've",
    "it’s a curly apostrophe, ‘quoted’, ''double'' and 's alone at the start",
    # digits
    "1 12 123 1234 12345 1234567890 3.14159 1,000,000 -42 +7 1e-9 0x1F 0b1010 v1.2.3",
    "2024-06-01T12:34:56Z, ٣٤٥ Arabic-Indic, १२३ Devanagari, ①②③, x²+y³, Ⅻ, ½ ¾",
    "phone +1 (555) 010-9999, ip 192.168.0.1, 100% of $3.50, €4,99",
    # spaces, newlines, tabs
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "\n",
    " ",
    "\n\n\n",
    "para one.\n\npara two.\n\n\n\npara three.\n",
    " \n \n  \n",
    "windows\r\nline\r\nends\r\n\r\n",
    "old mac\rline\r",
    "\tindented\n\t\tdeeper\n\t\n",
    "a\tb\t\tc \t d",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "nbsp\u00a0here, thin\u2009space, ideographic\u3000space, en\u2002em\u2003",
    "line\u2028separator\u2029paragraph, next\u0085line, zero\u200bwidth, bom\ufeff",
    "  \u00a0 \u3000\u3000 x",
    # CJK and other scripts
    "日本語のテキストです。漢字かなカナ混じり文。",
    "中文文本，包括标点符号！还有“引号”。",
    "한국어 문장입니다. 띄어쓰기 포함.",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "Ελληνικά κείμενα, Русский ТЕКСТ, العربية النص, עברית, ภาษาไทย, Tiếng Việt",
    # emoji
    "🙂 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇩🇪🇫🇷 ❤️ a🙂b 🙂🙂🙂",
    # combining marks
    "cafe\u0301 A\u030a n\u0303 e\u0301\u0301\u0301",
    "नमस्ते दुनिया, ক্ষমা, ﷺ",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "\u0301 a mark with nothing to sit on",
    # control characters
    "\x00",
    "nul\x00inside",
    "bell\x07 esc\x1b[31mred\x1b[0m del\x7f bs\x08",
    "info separators\x1c\x1d\x1e\x1f between",
    "vertical\x0btab and form\x0cfeed",
    # odd code points
    "\U0010ffff \ufffd \ue000 \ufdd0 𝐀𝐁𝐂 ǅ ß İ ﬁ",
    # markup and code
    '<div class="x">&amp;</div> <!-- c --> <br/>',
    "SELECT * FROM t WHERE id = 1; -- comment",
    "https://example.com/a/b?q=1&r=two#frag user@example.com C:\\Users\\x ~/.bashrc $HOME",
    '#!/bin/sh\nset -eu\nfor f in *.txt; do echo "$f"; done\n',
    "Title\n=====\n\nSection\n-------\n\n* item\n* item\n\n.. note::\n\n   text\n",
    "if (a && b || !c) { x[i] = y->z; return -1; }",
)


def _long_words() -> tuple[str, ...]:
    rng = random.Random(0)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(20_000))
    return (
        "a" * 20_000,
        "ab" * 10_000,
        letters,
        "x" * 5_000 + " " + "y" * 5_000,
        " " * 20_000,
        "\n" * 5_000,
        " \n" * 5_000,
        "0123456789" * 2_000,
        "日本" * 5_000,
        "🙂" * 3_000,
        "=" * 10_000,
        "e\u0301" * 5_000,
    )


#: The built-in probe strings (special-token text is added per tokenizer).
TRICKY: tuple[str, ...] = (*_SHORT, "".join(_SHORT), " ".join(_SHORT), *_long_words())

#: every character Unicode or one of the regex engines calls white space, and near misses
WHITESPACE = (
    "\t", "\n", "\x0b", "\x0c", "\r", " ", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0",
    "\u1680", "\u180e", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005",
    "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u200b", "\u200c", "\u200d",
    "\u2028", "\u2029", "\u202f", "\u205f", "\u2060", "\u3000", "\ufeff",
)  # fmt: skip
_QUOTES = ("'", '"', "\u2019", "\u2018", "`", "''", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL")
_WORDS = ("a", "b", "x", "it", "don", "I", "é", "日", "1", "42", "-", ".", "\n\n", "  ", "🙂")


def fuzz(count: int = FUZZ, seed: int = 0) -> list[str]:
    """Deterministic random strings where pre-tokenizer regexes part most easily: Unicode
    whitespace, contractions next to quotes, words; and long runs of one character."""
    rng = random.Random(seed)
    atoms = (*WHITESPACE, *_QUOTES, *_WORDS)
    out = ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 10))) for _ in range(count)]
    for ch in ("a", " ", "\n", "'", "\x85", "\u180e", "\u3000", "1", ".", "é", "日", "🙂"):
        n = rng.randint(500, 3000)
        out += [ch * n, f"x{ch * n}y", f" {ch * n} "]
    return out


EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


@dataclass(frozen=True)
class Verdict:
    equivalent: bool
    reason: str
    #: the run-independent comparisons' pass was read from the node's check cache
    kept: bool = False


def show(text: str, limit: int = 60) -> str:
    """A string as a user can recognise it in one line of an error message."""
    shown = repr(text[:limit]) + ("…" if len(text) > limit else "")
    return shown + (f" ({len(text):,} characters)" if len(text) > limit else "")


def special_texts(specials: Sequence[str]) -> list[str]:
    """Added-token text where documents have it: alone, repeated, glued inside words."""
    texts = []
    for s in sorted({*specials, "<|endoftext|>"}):
        texts += [s, f"{s}{s}", f"a web page quoting {s} in its text", f"x{s}y", f"{s}\n\nnext"]
    return texts


def blends(pieces: Sequence[bytes], count: int = BLENDS, seed: int = 0) -> list[str]:
    """Strings glued from random vocabulary entries: they probe how merges meet."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        raw = b"".join(rng.choice(pieces) for _ in range(rng.randint(2, 5)))
        out.append(raw.decode("utf-8", errors="replace"))
    return out


def as_list(ids: Sequence[int]) -> list[int]:
    """Ids as a plain list, whether a back end returned a list or an array."""
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def first_difference(
    texts: Sequence[str], reference: EncodeBatch, candidate: EncodeBatch, name: str = "tiktoken"
) -> str | None:
    """Describe the first text ``candidate`` (the back end ``name``) and `tokenizers` disagree on, or None."""
    texts = list(texts)
    for text, want_ids, got_ids in zip(texts, reference(texts), candidate(texts), strict=True):
        want, got = as_list(want_ids), as_list(got_ids)
        if want != got:
            at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
            at = min(len(want), len(got)) if at is None else at
            return (
                f"{name} and tokenizers give different ids for {show(text)} "
                f"(from token {at}: tokenizers {want[at : at + 3]}, {name} {got[at : at + 3]})"
            )
    return None


def merged_token_difference(tokenizer, merged: dict[int, str]) -> str | None:
    """A merge result `tokenizers` cannot produce from its own text, which tiktoken would."""
    tokenize = tokenizer.model.tokenize
    for tid, token in sorted(merged.items()):
        ids = [t.id for t in tokenize(token)]
        if ids != [tid]:
            text = to_bytes(token).decode("utf-8", errors="replace")
            return (
                f"tiktoken and tokenizers give different ids for {show(text)}: tokenizers splits "
                f"vocabulary entry {tid} into {ids}, tiktoken keeps it whole"
            )
    return None


@dataclass(frozen=True)
class Vocabulary:
    """What the probes need of a tokenizer: its special tokens' text, its entries as bytes,
    the tokens its merges make (byte-level strings, by id), and where they are not byte-level
    strings (a SentencePiece-style vocabulary), the text each merged token stands for; and its
    added tokens that are not special (`tokenizers` finds them in text before anything else)."""

    specials: tuple[str, ...]
    pieces: tuple[bytes, ...]
    merged: dict[int, str]
    merged_text: dict[int, str] | None = None
    plain_added: tuple[str, ...] = ()


def vocabulary_of(conversion) -> Vocabulary:
    """The vocabulary as tiktoken's conversion states it."""
    return Vocabulary(tuple(conversion.special_tokens), tuple(sorted(conversion.ranks)), conversion.merged)


def vocabulary_from_spec(spec: dict) -> Vocabulary:
    """The vocabulary as the tokenizer.json states it (for back ends that read it themselves)."""
    model = spec.get("model") or {}
    vocab: dict[str, int] = model.get("vocab") or {}
    if is_sentencepiece_bpe(spec):
        return _sentencepiece_vocabulary(spec, vocab)
    pieces = []
    for token in vocab:
        try:
            pieces.append(to_bytes(token))
        except ValueError:
            continue
    merged = {vocab[a + b]: a + b for a, b in merge_pairs(model.get("merges") or []) if a + b in vocab}
    specials = tuple(special_added(spec))
    return Vocabulary(specials, tuple(sorted(pieces)), merged, plain_added=tuple(plain_added(spec)))


def _sentencepiece_vocabulary(spec: dict, vocab: dict[str, int]) -> Vocabulary:
    merged = {
        vocab[a + b]: a + b for a, b in merge_pairs(spec["model"].get("merges") or []) if a + b in vocab
    }
    specials = tuple(special_added(spec))
    pieces = tuple(sorted({sentencepiece_text(t).encode("utf-8") for t in vocab if t not in specials}))
    texts = {tid: sentencepiece_text(t) for tid, t in merged.items()}
    return Vocabulary(specials, pieces, merged, texts, tuple(plain_added(spec)))


def probes(vocab: Vocabulary) -> list[str]:
    """The built-in strings for one tokenizer: TRICKY, its special tokens' text, blends, fuzz."""
    added = special_texts([*vocab.specials, *vocab.plain_added])
    return [*TRICKY, *added, *blends(vocab.pieces), *fuzz()]


def merged_texts(vocab: Vocabulary, per_line: int = 256) -> list[str]:
    """Every merge-made token that is whole UTF-8 text, one per line, ``per_line`` to a string
    (a string per token would cost `tokenizers` more in per-call overhead than in BPE)."""
    if vocab.merged_text is not None:
        texts = [t for _, t in sorted(vocab.merged_text.items())]
        return ["\n".join(texts[i : i + per_line]) for i in range(0, len(texts), per_line)]
    texts = []
    for _, token in sorted(vocab.merged.items()):
        try:
            texts.append(to_bytes(token).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    return ["\n".join(texts[i : i + per_line]) for i in range(0, len(texts), per_line)]


def static_difference(fast, reference, vocab: Vocabulary, every_token: bool = True) -> str | None:
    """The first difference on comparisons 1-3, which depend on the tokenizer and the libraries
    only, not on the run (``every_token``: with the pass over every merged token)."""
    name = fast.name
    if every_token:
        if name == "tiktoken":
            found = merged_token_difference(reference.tokenizer, vocab.merged)
        else:
            found = first_difference(merged_texts(vocab), reference.encode_batch, fast.encode_batch, name)
        if found:
            return found
    return first_difference(probes(vocab), reference.encode_batch, fast.encode_batch, name)


def static_summary(vocab: Vocabulary) -> str:
    """What a passed static check compared, as the manifest's reason states it."""
    return f"all {len(vocab.merged):,} merged tokens, {len(probes(vocab)):,} built-in and fuzz strings"


def difference(
    fast, reference, vocab: Vocabulary, docs: Sequence[str], every_token: bool = True
) -> str | None:
    """The first difference between a fast back end and the reference `TokenizersEncoder`
    on the comparisons above (``every_token``: with the pass over every merged token)."""
    return static_difference(fast, reference, vocab, every_token) or first_difference(
        docs, reference.encode_batch, fast.encode_batch, fast.name
    )


def byte_level_spec(tokenizer_path: str) -> dict:
    """The parsed tokenizer.json if it is a byte-level BPE of a shape tokshard checks fast back
    ends on (the rules tiktoken's conversion states, minus those about tiktoken's own merge
    order); `NotEquivalent` naming the rule otherwise."""
    spec = read_spec(tokenizer_path)
    check_fast_shape(spec)
    return spec


def fastokens_spec(tokenizer_path: str) -> tuple[dict, str]:
    """The parsed tokenizer.json and its shape, if fastokens is checked on that shape: a
    byte-level BPE (`byte_level_spec`), also after a normalizer that runs ahead of it
    (`pipeline.encoding.normalizing`), or a SentencePiece-style BPE in Llama 2's shape;
    `NotEquivalent` naming the byte-level rule broken otherwise."""
    spec = read_spec(tokenizer_path)
    if is_sentencepiece_bpe(spec):
        return spec, "SentencePiece-style BPE with byte fallback"
    ahead = run_ahead(spec)
    if ahead is None:
        check_fast_shape(spec)
        splits = len(split_patterns(spec.get("pre_tokenizer")))
        return spec, "byte-level BPE" + (f" with {splits} split patterns in a row" if splits > 1 else "")
    check_fast_shape(without_normalizer(spec))
    for content, found_as in added_tokens_it_changes(spec, ahead):
        raise NotEquivalent(
            f"tokenizers finds its added token {content!a} in {ahead.normalizer['type']}-normalized text, "
            f"as {found_as!a}, which a fast back end built without the normalizer would not find"
        )
    return spec, f"byte-level BPE after its {ahead.normalizer['type']} normalizer (run by tokenizers itself)"


def confirm_builtin(tokenizer_path: str, fast) -> None:
    """The built-in strings again, in a worker whose library versions differ from those the
    driver checked with, before it writes a single id (the pass over every merged token is
    left to the driver, to keep a worker's start-up short)."""
    if fast.name == "tiktoken":
        vocab = vocabulary_of(fast.conversion)
    else:
        vocab = vocabulary_from_spec(read_spec(tokenizer_path))
    found = difference(fast, TokenizersEncoder(tokenizer_path, threads=1), vocab, [], every_token=False)
    if found:
        here = ", ".join(f"{lib} {v}" for lib, v in library_versions())
        raise TokshardError(
            f"{found}, on this worker although the run's check passed: do the machines have "
            f"different library versions (here {here})? Install the same everywhere, or use --encoder tokenizers"
        )
