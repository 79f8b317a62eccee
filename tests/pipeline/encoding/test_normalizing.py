"""A normalizer before a byte-level BPE (Qwen2's NFC) runs ahead of fastokens, by `tokenizers`
itself: the run keeps the fast back end, and its ids stay those of `tokenizers` on the file.

The vocabulary is Qwen's real one (the ranks Alibaba's `dashscope` wheel ships, converted to a
tokenizer.json with Qwen2's NFC normalizer; `published_vocabs`); the reference for ordinary
text is tiktoken built from those ranks, on the text in NFC as Qwen's own tokenizer does.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from published_vocabs import EOS, reference, tokenizer_json
from support import cli, english_documents, write_jsonl

from pipeline.encoding.backend import TokenizersEncoder, library_version
from pipeline.encoding.documents import LONG_DOC_CHARS
from pipeline.encoding.fastokens_backend import FastokensEncoder
from pipeline.encoding.normalizing import (
    NFC_PROVEN,
    code_point_ranges,
    nfc_disagreements,
    normalizing,
    python_proves_nfc,
    run_ahead,
)
from pipeline.encoding.selection import decide
from pipeline.encoding.spec import worker_encoder
from pipeline.encoding.tokenizer import read_spec
from pipeline.format import manifest

QWEN = "qwen2"
#: text whose NFC differs from it: decomposed accents, Hangul jamo, a singleton (Ohm sign),
#: marks out of canonical order, and a compatibility character NFC keeps (the fi ligature)
NOT_NFC = [
    "e\u0301cole, cafe\u0301, na\u0308ive",
    "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "10 \u2126 and 5 \u212b",
    "a\u0323\u0307 q\u0307\u0323",
    "\ufb01le ﬁnal",
]


@pytest.fixture(scope="module")
def qwen() -> str:
    return str(tokenizer_json(QWEN))


@pytest.fixture(scope="module")
def prose() -> list[str]:
    return english_documents(60)


def qwen_reference(texts: list[str]) -> list[list[int]]:
    """tiktoken from Qwen's ranks, on the texts in NFC (as Qwen's tokenizer does)."""
    ref = reference(QWEN)
    return [ref.encode_ordinary(unicodedata.normalize("NFC", t)) for t in texts]


def test_ascii_text_is_passed_through_and_other_text_normalized_as_tokenizers_does():
    nfc = normalizing({"type": "NFC"})
    ascii_text = "plain ASCII, kept as the very same object"
    assert nfc(ascii_text) is ascii_text
    assert nfc("e\u0301") == "\u00e9" and nfc("\u2126") == "\u03a9"


def tokenizers_nfc(text: str) -> str:
    from tokenizers import normalizers

    return normalizers.NFC().normalize_str(text)


def test_python_and_tokenizers_nfc_part_only_on_the_kept_code_points():
    """The proof `NFC_PROVEN` keeps, made again over every code point (for other versions
    than the kept ones, no text is passed through on Python's word)."""
    from tokenizers import normalizers

    found = code_point_ranges(
        nfc_disagreements(normalizers.NFC().normalize_str, normalizers.NFD().normalize_str)
    )
    key = (library_version("tokenizers"), unicodedata.unidata_version)
    if key in NFC_PROVEN:
        assert found == NFC_PROVEN[key]
    else:
        assert python_proves_nfc() is None


def test_the_scan_finds_nothing_where_both_sides_are_the_same_tables():
    """No false alarm: Python's tables against themselves, over marks of many classes, Hangul,
    the code points `NFC_PROVEN` names for tokenizers and compositions of every kind."""
    probe = [*range(0x0300, 0x0370), *range(0x0890, 0x08D4), *range(0x11930, 0x11940), 0xAC00, 0x212B, 0x0958]
    same = nfc_disagreements(
        lambda t: unicodedata.normalize("NFC", t), lambda t: unicodedata.normalize("NFD", t), probe
    )
    assert same == []


def test_text_python_proves_in_nfc_is_passed_through_and_text_with_a_later_mark_is_not():
    nfc = normalizing({"type": "NFC"})
    if python_proves_nfc() is None:
        pytest.skip("no proof kept for these versions: every non-ASCII text goes to tokenizers")
    cjk = "中文文本，日本語のテキスト、한국어 문장, Ελληνικά, café"
    assert nfc(cjk) is cjk  # the very same object: tokenizers was not called
    later_mark = "ب࢘ and café"  # U+0898: a mark of Unicode 14, after tokenizers' tables
    assert unicodedata.is_normalized("NFC", later_mark)
    assert nfc(later_mark) is not later_mark and nfc(later_mark) == tokenizers_nfc(later_mark)
    assert nfc("e\u0301") == "\u00e9"


#: code points of both kinds: those Python's and tokenizers' tables agree on, and marks and a
#: composition of later Unicode versions (`NFC_PROVEN`)
NFC_EDGE = (
    "ae\u0300\u0301\u0316\u0345\u1100\u1161\u11ab\u0898\u08ca\u1ac0\U00011935\U00011930\U00011938\u07fd 日"
)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=NFC_EDGE, max_size=30))
def test_the_nfc_run_ahead_is_tokenizers_nfc_on_any_text(text):
    assert normalizing({"type": "NFC"})(text) == tokenizers_nfc(text)


def test_a_normalizer_that_changes_ascii_is_always_called():
    """Only the Unicode normalization forms skip ASCII text: a lowercasing one must see it."""
    assert normalizing({"type": "Lowercase"})("ABC") == "abc"


def test_qwen2_runs_on_fastokens_with_its_nfc_run_ahead(qwen, prose):
    """`auto` keeps fastokens for Qwen2's file and says the normalizer runs ahead of it; its
    ids are tiktoken's on NFC text, also for text that is not in NFC."""
    decision = decide("auto", qwen, lambda: prose)
    assert decision.name == "fastokens", decision.reason
    assert "after its NFC normalizer (run by tokenizers itself)" in decision.reason
    texts = [*prose[:20], *NOT_NFC, " ".join(NOT_NFC)]
    got = worker_encoder(decision.spec).encode_batch(texts)
    assert [list(ids) for ids in got] == qwen_reference(texts)


#: characters NFC composes, reorders or maps, with the letters, digits, spaces and
#: apostrophes the split pattern tells apart, for strings in which they meet in any order
NFC_MIX = (
    "aAeEiIoOuUnNsStTdDlLvVmM'’ .,!?0123456789\t\n\r"
    "\u0300\u0301\u0302\u0303\u0308\u030a\u0323\u0327\u0331\u0345\u05b7\u093c\u0f71\u3099"  # marks
    "\u1100\u1112\u1161\u1173\u11ab\u11af\uac00"  # Hangul jamo and a syllable
    "\u2126\u212b\u1e9b\u0344\u0958\ufb01\u00e9\u0130\u0131\u017f"  # singletons, exclusions, others
    "か日本語한🙂"
)


@pytest.fixture(scope="module")
def fast_and_tokenizers(qwen):
    return FastokensEncoder(qwen, confirm=False), TokenizersEncoder(qwen)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=NFC_MIX, max_size=40), min_size=1, max_size=8))
def test_fastokens_after_nfc_gives_tokenizers_ids_on_any_mix(fast_and_tokenizers, texts):
    fast, tokenizers = fast_and_tokenizers
    assert [list(ids) for ids in fast.encode_batch(texts)] == tokenizers.encode_batch(texts)


def test_a_normalizer_fastokens_does_not_take_leaves_the_run_on_tokenizers(qwen, prose, tmp_path):
    """NFKC is not run ahead: `auto` names it and falls back to `tokenizers`."""
    spec = json.loads(Path(qwen).read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "NFKC"}
    other = tmp_path / "tokenizer.json"
    other.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    decision = decide("auto", str(other), lambda: prose)
    assert decision.name == "tokenizers"
    assert "normalizer NFKC" in decision.reason


#: Qwen2.5's added tokens after Qwen2's three, as its tokenizer_config.json lists them: the
#: tool-call and fill-in-the-middle markers are not special, so they are found in any text
QWEN25_ADDED = [
    *((t, True) for t in ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                          "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                          "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")),
    *((t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                           "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")),
]  # fmt: skip


@pytest.fixture(scope="module")
def qwen25(qwen, tmp_path_factory) -> str:
    """Qwen's ranks and NFC with Qwen2.5's added tokens."""
    spec = json.loads(Path(qwen).read_text(encoding="utf-8"))
    first = 1 + max(t["id"] for t in spec["added_tokens"])
    for i, (content, special) in enumerate(QWEN25_ADDED):
        spec["added_tokens"].append({"id": first + i, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": special})  # fmt: skip
    path = tmp_path_factory.mktemp("qwen25") / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_with_added_tokens_that_are_not_special_the_texts_nfc_changes_go_to_tokenizers(qwen25, prose):
    """`tokenizers` finds such tokens before it normalizes, so the text cannot be normalized
    first: fastokens takes the texts NFC leaves as they are, `tokenizers` the others, and the
    ids are `tokenizers`' for both, a marker that NFC would join to a mark included."""
    assert run_ahead(read_spec(qwen25)).route_changed
    decision = decide("auto", qwen25, lambda: prose)
    assert decision.name == "fastokens", decision.reason
    assert "documents its NFC normalizer changes go to tokenizers" in decision.reason
    texts = [
        prose[0],
        "<tool_call>{}</tool_call> <|fim_prefix|>x",
        *NOT_NFC,
        "a <tool_call>\u0338 b",
        prose[1],
    ]
    encoder = worker_encoder(decision.spec)
    got = encoder.encode_batch(texts)
    assert [list(ids) for ids in got] == TokenizersEncoder(qwen25).encode_batch(texts)
    assert encoder.routed == sum(unicodedata.normalize("NFC", t) != t for t in texts) == 5
    assert decision.manifest_entry(routed_documents=6)["routed"] == {
        "class": "text its NFC normalizer changes", "to": "tokenizers", "documents": 6}  # fmt: skip


def qwen_with_added(qwen: str, folder: Path, content: str) -> str:
    """Qwen2's file with one more non-special added token, matched in normalized text."""
    spec = json.loads(Path(qwen).read_text(encoding="utf-8"))
    spec["added_tokens"].append({"id": 1 + max(t["id"] for t in spec["added_tokens"]), "content": content,
                                 "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
                                 "special": False})  # fmt: skip
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_an_added_token_nfc_changes_keeps_the_run_on_tokenizers_whatever_its_documents(qwen, prose, tmp_path):
    """`tokenizers` finds a normalized added token by its NFC form (``nai\u0308ve`` in the
    NFC text ``na\u00efve``), fastokens without the normalizer by its content: a document
    holding the NFC form past the check's first 64 was written with other ids."""
    path = qwen_with_added(qwen, tmp_path, "nai\u0308ve")
    decision = decide("auto", path, lambda: prose)
    assert decision.name == "tokenizers"
    assert "added token 'nai\\u0308ve' in NFC-normalized text, as 'na\\xefve'" in decision.reason
    texts = ["I am na\u00efve.", "nai\u0308ve"]
    assert [list(ids) for ids in worker_encoder(decision.spec).encode_batch(texts)] == TokenizersEncoder(
        path
    ).encode_batch(texts)


def test_an_added_token_nfc_leaves_as_it_is_keeps_fastokens_exact(qwen, prose, tmp_path):
    path = qwen_with_added(qwen, tmp_path, "na\u00efve")
    decision = decide("auto", path, lambda: prose)
    assert decision.name == "fastokens", decision.reason
    texts = ["I am na\u00efve.", "I am nai\u0308ve.", prose[0]]
    assert [list(ids) for ids in worker_encoder(decision.spec).encode_batch(texts)] == TokenizersEncoder(
        path
    ).encode_batch(texts)


def test_prepare_with_qwen2_writes_tiktokens_ids_of_the_nfc_text_on_fastokens(tmp_path, prose):
    """The whole command on Qwen2's real vocabulary: uint32 by itself, fastokens, and the ids
    of the text in NFC, whether the documents came in NFC or not, a long document too."""
    joined = " ".join(prose)
    long_doc = (joined * (LONG_DOC_CHARS // len(joined) + 2))[: LONG_DOC_CHARS + 20_000] + " e\u0301nd"
    docs = [prose[0], *NOT_NFC, prose[1], long_doc, "ordinary ascii text " * 50, prose[2]]
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "out"
    cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_json(QWEN)), "--out", str(out),
        "--workers", "1", check=True)  # fmt: skip
    m = manifest.load(out / "manifest.json")
    assert m.dtype == "uint32"
    assert m.data["encoder"]["name"] == "fastokens"
    assert "NFC normalizer" in m.data["encoder"]["reason"]
    got = np.concatenate([np.fromfile(e.bin_path, dtype="<u4") for e in m.shards])
    assert m.eos_id == reference(QWEN)._special_tokens[EOS[QWEN]] == 151643
    assert got.tolist() == [i for ids in qwen_reference(docs) for i in (*ids, m.eos_id)]
