"""Reading fewer merges changes no ids: `applied_merges` keeps only the merges BPE can apply,
checked with `tokenizers` itself on the real published vocabularies."""

from __future__ import annotations

import json

import pytest
import tokenizers
from published_vocabs import tokenizer_json
from support import english_documents

from pipeline.encoding.byte_level import applied_merges, to_bytes
from pipeline.encoding.equivalence import fuzz
from pipeline.encoding.fastokens_backend import rewritten_text
from pipeline.encoding.tokenizer import read_spec


def token_texts(vocab: dict[str, int]) -> list[str]:
    """Every vocabulary entry that is whole UTF-8, as text: each token's own BPE, and beside a
    neighbour (the merges inside a longer word)."""
    texts = []
    for token in vocab:
        try:
            texts.append(to_bytes(token).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    return texts + ["".join(texts[i : i + 7]) for i in range(0, len(texts), 7)]


@pytest.mark.parametrize("name", ["o200k_base", "llama3"])
def test_tokenizers_with_only_the_applied_merges_gives_the_same_ids(name):
    path = str(tokenizer_json(name))
    spec = read_spec(path)
    kept = applied_merges(spec["model"])
    assert kept is not None and len(kept) < len(spec["model"]["merges"])
    fewer = json.loads(json.dumps(spec))
    fewer["model"]["merges"] = kept
    fewer["model"]["ignore_merges"] = False  # every word through the merges, none looked up whole
    full = json.loads(json.dumps(spec))
    full["model"]["ignore_merges"] = False
    texts = english_documents(60) + fuzz() + token_texts(spec["model"]["vocab"])
    want = tokenizers.Tokenizer.from_str(json.dumps(full)).encode_batch(texts)
    got = tokenizers.Tokenizer.from_str(json.dumps(fewer)).encode_batch(texts)
    assert [e.ids for e in got] == [e.ids for e in want]


def test_a_vocabulary_with_one_merge_per_token_keeps_its_file(gpt2_tokenizer_path):
    assert applied_merges(read_spec(str(gpt2_tokenizer_path))["model"]) is None
    assert rewritten_text(str(gpt2_tokenizer_path)) == ""


def test_fastokens_reads_the_fewer_merges_of_a_vocabulary_converted_from_ranks():
    path = str(tokenizer_json("o200k_base"))
    built_from = json.loads(rewritten_text(path))
    assert len(built_from["model"]["merges"]) < len(read_spec(path)["model"]["merges"]) / 2
