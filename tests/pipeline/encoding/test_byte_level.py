"""Reading fewer merges changes no ids: `applied_merges` keeps only the merges BPE can apply,
checked with `tokenizers` itself on the real published vocabularies."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import tokenizers
from background import Command, background_job
from published_vocabs import tokenizer_json
from support import REPO, english_documents

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


def first_difference(name: str) -> int | None:
    """The first text on which `tokenizers` with only the applied merges gives other ids than
    with all of them (its index), None where it gives the same on every text."""
    spec = read_spec(str(tokenizer_json(name)))
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
    return next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g.ids != w.ids), None)


CONVERTED = ("o200k_base", "llama3")
COMPARE = "import json, sys\nfrom test_byte_level import first_difference\n" + (
    "print(json.dumps({name: first_difference(name) for name in sys.argv[1:]}))"
)


@background_job
def applied_merges_comparison(folder: Path) -> Command:
    """Both vocabularies' every token through `tokenizers` twice (CPU-bound, a process of its own)."""
    paths = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    return Command(
        [sys.executable, "-c", COMPARE, *CONVERTED], {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    )


@pytest.mark.parametrize("name", CONVERTED)
def test_tokenizers_with_only_the_applied_merges_gives_the_same_ids(name, applied_merges_comparison):
    done = applied_merges_comparison
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.splitlines()[-1])[name]
    assert first is None, f"{name}: text {first} encodes to other ids with only the applied merges"


def test_a_vocabulary_with_one_merge_per_token_keeps_its_file(gpt2_tokenizer_path):
    assert applied_merges(read_spec(str(gpt2_tokenizer_path))["model"]) is None
    assert rewritten_text(str(gpt2_tokenizer_path)) == ""


def test_fastokens_reads_the_fewer_merges_of_a_vocabulary_converted_from_ranks():
    path = str(tokenizer_json("o200k_base"))
    built_from = json.loads(rewritten_text(path))
    assert len(built_from["model"]["merges"]) < len(read_spec(path)["model"]["merges"]) / 2
