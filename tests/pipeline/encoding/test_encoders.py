"""Encoder back ends: tiktoken built from tokenizer.json gives exactly `tokenizers`' ids, and
`auto` takes it only where a check says so, falling back (or refusing) with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import (
    EOS,
    cli,
    plain_encode,
    run_prepare,
    stream_of,
    train_tokenizer_json,
    validate_manifest,
    write_jsonl,
)

from pipeline.encoding.backend import TokenizersEncoder, library_versions
from pipeline.encoding.documents import LONG_DOC_CHARS
from pipeline.encoding.equivalence import TRICKY, as_list, show
from pipeline.encoding.selection import cached_encoder, choose
from pipeline.encoding.tiktoken_backend import TiktokenEncoder
from pipeline.format import manifest
from pipeline.format.errors import TokshardError

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def converted_from_tiktoken(gpt2: Path, dest: Path) -> Path:
    """GPT-2's vocabulary in the shape of files converted from tiktoken (Llama-3's): every
    split of a token listed as a merge, ignore_merges, a Split regex + ByteLevel(use_regex=False)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads(gpt2.read_text())["model"]["vocab"]
    merges = []
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if len(token) > 1 and token != EOS:
            splits = [(token[:i], token[i:]) for i in range(1, len(token))]
            merges += sorted(
                ((a, b) for a, b in splits if a in vocab and b in vocab),
                key=lambda ab: (vocab[ab[0]], vocab[ab[1]]),
            )
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True)])
    dest.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest))
    return dest


def ids(encoder, texts: list[str]) -> list[list[int]]:
    return [as_list(x) for x in encoder.encode_batch(texts)]


def edited(src: Path, dest: Path, edit) -> Path:
    """A copy of a tokenizer.json changed by ``edit(spec)``, as a hand-edited file would be."""
    spec = json.loads(src.read_text())
    edit(spec)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(spec, ensure_ascii=False))
    return dest


@pytest.fixture(scope="module")
def shapes(tmp_path_factory, docs, tokenizer_path, gpt2_tokenizer_path) -> dict[str, Path]:
    """Byte-level BPEs of every shape the fast path must match."""
    d = tmp_path_factory.mktemp("shapes")
    return {
        "trained": tokenizer_path,
        "gpt2": gpt2_tokenizer_path,
        "llama3-split": train_tokenizer_json(
            d / "llama3" / "tokenizer.json", docs[:80], split=LLAMA3_PATTERN
        ),
        "roberta-style": train_tokenizer_json(
            d / "roberta" / "tokenizer.json", docs[:80], specials=("<s>", "<pad>", "</s>")
        ),
        "tiktoken-converted": converted_from_tiktoken(
            gpt2_tokenizer_path, d / "converted" / "tokenizer.json"
        ),
    }


SHAPES = ["trained", "gpt2", "llama3-split", "roberta-style", "tiktoken-converted"]


@pytest.mark.parametrize("shape", SHAPES)
def test_fast_path_gives_tokenizers_ids_on_real_text_and_tricky_strings(shapes, docs, shape):
    texts = [*docs[:60], *TRICKY]
    fast = TiktokenEncoder(str(shapes[shape]))
    assert ids(fast, texts) == ids(TokenizersEncoder(str(shapes[shape])), texts)


def test_gpt2_built_from_its_files_gives_openais_ids(gpt2_tokenizer_path):
    fast = TiktokenEncoder(str(gpt2_tokenizer_path))
    assert ids(fast, ["hello world", "goodbye world"]) == [[31373, 995], [11274, 16390, 995]]
    assert fast.encoding.decode([31373, 995]) == "hello world"


def test_special_token_text_inside_a_document_is_ordinary_on_the_fast_path(gpt2_tokenizer_path):
    text = f"a web page quoting {EOS} in its text{EOS}"
    (fast,) = ids(TiktokenEncoder(str(gpt2_tokenizer_path)), [text])
    assert 50256 not in fast
    assert [fast] == ids(TokenizersEncoder(str(gpt2_tokenizer_path)), [text])


def test_threads_do_not_change_the_ids(tokenizer_path, docs):
    one = ids(TiktokenEncoder(str(tokenizer_path), threads=1), docs)
    assert ids(TiktokenEncoder(str(tokenizer_path), threads=3), docs) == one


@pytest.mark.parametrize("shape", SHAPES)
def test_auto_takes_tiktoken_for_every_byte_level_shape_and_says_why(shapes, docs, shape):
    name, reason = choose("auto", str(shapes[shape]), lambda: docs)
    assert name == "tiktoken", reason
    assert (
        reason.startswith("auto: ") and "same ids as tokenizers" in reason and "first 64 documents" in reason
    )


def test_requesting_tokenizers_skips_the_check(tmp_path):
    assert choose("tokenizers", str(tmp_path / "never-read.json"), lambda: 1 / 0)[0] == "tokenizers"


def _with_gap(spec):
    spec["added_tokens"].append(
        {"id": 5000, "content": "<|gap|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
    )  # fmt: skip


def _with_unmerged_entry(spec):
    spec["model"]["vocab"]["Ġhelloworld"] = 50257  # junk a vocab file may hold: no merge makes it


def test_ids_with_gaps_and_entries_no_merge_makes_still_match(
    tmp_path, tokenizer_path, gpt2_tokenizer_path, docs
):
    gap = edited(tokenizer_path, tmp_path / "gap.json", _with_gap)
    junk = edited(gpt2_tokenizer_path, tmp_path / "junk.json", _with_unmerged_entry)
    texts = [*docs[:20], "<|gap|> hello world helloworld", " helloworld"]
    for path in (gap, junk):
        name, reason = choose("auto", str(path), lambda: docs[:5])
        assert name == "tiktoken", reason
        assert ids(TiktokenEncoder(str(path)), texts) == ids(TokenizersEncoder(str(path)), texts)
    assert "left out 1 vocabulary entries" in choose("auto", str(junk), lambda: [])[1]


def _merges_out_of_id_order(spec):
    vocab = spec["model"]["vocab"]
    a, b = (m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"][:2])
    ta, tb = a.replace(" ", ""), b.replace(" ", "")
    vocab[ta], vocab[tb] = vocab[tb], vocab[ta]


def _plain_added_token(spec):
    spec["added_tokens"].append(
        {"id": 1024, "content": "hello world", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False}
    )  # fmt: skip


def _bpe_with_unreachable_merge(path: Path) -> Path:
    """'abc' is a merge result, but 'b'+'c' merges first, so tokenizers never builds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = [("b", "c"), ("a", "b"), ("ab", "c")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
    return path


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nfkc-normalizer", "normalizer NFKC"),
        ("wordpiece", "model WordPiece is not BPE"),
        ("unigram", "model Unigram is not BPE"),
        ("bytes-missing", "vocabulary lacks"),
        ("merge-order", "merge order is not id order"),
        ("plain-added-token", "added token 'hello world' is not special"),
        ("unreachable-merge", "tokenizers splits vocabulary entry"),
    ],
)
def test_auto_falls_back_to_tokenizers_and_names_the_reason(tmp_path, docs, tokenizer_path, kind, reason):
    from tokenizers import normalizers

    path = tmp_path / "tokenizer.json"
    small = docs[:40]
    if kind == "nfkc-normalizer":
        train_tokenizer_json(path, small, normalizer=normalizers.NFKC())
    elif kind in ("wordpiece", "unigram"):
        train_tokenizer_json(path, small, model=kind)
    elif kind == "bytes-missing":
        train_tokenizer_json(path, small, full_alphabet=False)
    elif kind == "merge-order":
        edited(tokenizer_path, path, _merges_out_of_id_order)
    elif kind == "plain-added-token":
        edited(tokenizer_path, path, _plain_added_token)
    else:
        _bpe_with_unreachable_merge(path)
    name, why = choose("auto", str(path), lambda: small)
    assert name == "tokenizers"
    assert why.startswith("auto: tiktoken not used, ") and reason in why


def test_tiktoken_on_a_non_equivalent_tokenizer_stops_naming_the_first_differing_string(tmp_path, docs):
    # letters and spaces only: tiktoken drops the text between matches, tokenizers keeps it
    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / "out"),
               "--encoder", "tiktoken")  # fmt: skip
    first = next(t for t in TRICKY if any(not (c.isalpha() or c == " ") for c in t))
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert line.startswith("tokshard: error: --encoder tiktoken would change the ids: ")
    assert show(first) in line and "--encoder tokenizers" in line


def test_a_worker_whose_fast_path_differs_refuses_to_encode(tmp_path, docs):
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    with pytest.raises(TokshardError, match="different library versions"):
        TiktokenEncoder(str(tok))


def test_a_worker_with_other_library_versions_than_the_driver_re_checks(tmp_path, docs):
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    other = tuple((lib, "0.0.1") for lib, _ in library_versions())
    with pytest.raises(TokshardError, match="different library versions"):
        cached_encoder("tiktoken", str(tok), "sha-other", 1, other)


def test_a_worker_with_the_driver_s_library_versions_trusts_its_check(tmp_path, docs):
    # a tokenizer the check would refuse: built without error only because nothing re-checks
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    encoder = cached_encoder("tiktoken", str(tok), "sha-same", 1, library_versions())
    assert encoder.name == "tiktoken"


def long_document(docs: list[str]) -> str:
    """Over the long-document threshold, so it is cut at pre-tokenizer boundaries."""
    odd = [
        " " * 3000,
        "\n" * 2000,
        "日本語のテキスト" * 300,
        "🙂👍🏽" * 400,
        "x" * 6000,
        f"quoting {EOS} here",
    ]
    parts, total, i = [], 0, 0
    while total <= LONG_DOC_CHARS + 100_000:
        part = docs[i % len(docs)] if i % 3 else odd[i % len(odd)]
        parts.append(part)
        total += len(part)
        i += 1
    return "\n\n".join(parts)


@pytest.mark.parametrize("encoder", ["tokenizers", "tiktoken"])
def test_prepare_equals_the_reference_with_each_encoder(tmp_path, docs, tokenizer_path, dask_client, encoder):
    texts = [docs[0], f"a web page quoting {EOS} in its text", long_document(docs), *docs[1:]]
    data = write_jsonl(tmp_path / "in.jsonl", texts)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "encoder": encoder,
        "shard_tokens": 200_000,
        "sources": {"data": {"type": "files", "paths": [str(data)], "partition_bytes": 300_000}},
    }
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    m = manifest.load(path)
    assert m.data["encoder"]["name"] == encoder
    stream = stream_of(path)
    assert np.array_equal(stream, plain_encode(tokenizer_path, texts))
    assert int((stream == m.eos_id).sum()) == len(texts)


def test_manifest_records_a_fallback_and_its_reason(tmp_path, docs, dask_client):
    from tokenizers import normalizers

    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40], normalizer=normalizers.NFKC())
    data = write_jsonl(tmp_path / "in.jsonl", docs[:10])
    recipe = {"tokenizer": str(tok), "sources": {"data": {"type": "files", "paths": [str(data)]}}}
    encoder = manifest.load(run_prepare(recipe, tmp_path / "out", dask_client)).data["encoder"]
    assert encoder["name"] == "tokenizers"
    assert "normalizer NFKC" in encoder["reason"]
    assert np.array_equal(stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tok, docs[:10]))


def test_cli_logs_the_choice_and_threads_reach_the_manifest(tmp_path, docs, gpt2_tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:30])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(gpt2_tokenizer_path),
               "--out", str(tmp_path / "out"), "--workers", "1", "--threads", "2", check=True)  # fmt: skip
    assert "tokshard: encoder: tiktoken (auto: byte-level BPE" in proc.stderr
    data_ = validate_manifest(tmp_path / "out" / "manifest.json")
    assert data_["encoder"]["name"] == "tiktoken" and data_["encoder"]["threads"] == 2
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(gpt2_tokenizer_path, docs[:30])
    )
