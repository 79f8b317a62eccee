"""Encoder back ends: tiktoken and fastokens built from tokenizer.json give exactly
`tokenizers`' ids, and `auto` takes the fastest only where a check says so, falling back (or
refusing) with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import (
    EOS,
    LLAMA3_PATTERN,
    cli,
    edited,
    gpt2_through_from_tiktoken,
    plain_added_token,
    plain_encode,
    run_prepare,
    stream_of,
    train_tokenizer_json,
    validate_manifest,
    write_jsonl,
)

from pipeline.encoding.backend import TokenizersEncoder, library_version, library_versions
from pipeline.encoding.documents import LONG_DOC_CHARS
from pipeline.encoding.equivalence import TRICKY, as_list, difference, fuzz, show, vocabulary_from_spec
from pipeline.encoding.fastokens_backend import FastokensEncoder
from pipeline.encoding.selection import decide
from pipeline.encoding.spec import EncoderSpec, worker_encoder
from pipeline.encoding.tiktoken_backend import TiktokenEncoder
from pipeline.encoding.tokenizer import read_spec
from pipeline.format import manifest
from pipeline.format.errors import TokshardError

FAST = {"tiktoken": TiktokenEncoder, "fastokens": FastokensEncoder}


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


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_path_gives_tokenizers_ids_on_real_text_tricky_and_fuzz_strings(shapes, docs, shape, backend):
    texts = [*docs[:60], *TRICKY, *fuzz()]
    fast = FAST[backend](str(shapes[shape]))
    assert ids(fast, texts) == ids(TokenizersEncoder(str(shapes[shape])), texts)


@pytest.mark.parametrize("backend", FAST)
def test_flat_ids_are_the_batch_ids_joined(gpt2_tokenizer_path, docs, backend):
    fast = FAST[backend](str(gpt2_tokenizer_path))
    flat_ids, offsets = fast.encode_flat(docs[:30])
    per_doc = ids(fast, docs[:30])
    assert offsets.tolist() == np.cumsum([0, *map(len, per_doc)]).tolist()
    assert flat_ids.tolist() == [i for d in per_doc for i in d]


def test_the_check_refuses_fastokens_inexact_from_tiktoken_route_by_its_fuzz_set(
    tmp_path, gpt2_tokenizer_path
):
    inexact = gpt2_through_from_tiktoken(gpt2_tokenizer_path, tmp_path)
    reference = TokenizersEncoder(str(gpt2_tokenizer_path))
    vocab = vocabulary_from_spec(read_spec(gpt2_tokenizer_path))
    found = difference(inexact, reference, vocab, [])
    assert found and found.startswith("fastokens and tokenizers give different ids for ")
    first = next(t for t in fuzz() if as_list(reference.encode_batch([t])[0]) != ids(inexact, [t])[0])
    assert show(first) in found and "\u180e" in first
    assert not any(
        as_list(r) != f
        for r, f in zip(reference.encode_batch(list(TRICKY)), ids(inexact, list(TRICKY)), strict=False)
    )


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
def test_auto_takes_fastokens_for_every_byte_level_shape_and_says_why(shapes, docs, shape):
    decision = decide("auto", str(shapes[shape]), lambda: docs)
    name, reason = decision.name, decision.reason
    assert name == "fastokens", reason
    assert reason.startswith("auto: byte-level BPE, and fastokens gave the same ids as tokenizers")
    assert "fuzz strings" in reason and "first 64 documents" in reason


@pytest.mark.parametrize("shape", ["gpt2", "tiktoken-converted"])
def test_requesting_tiktoken_checks_tiktoken(shapes, docs, shape):
    decision = decide("tiktoken", str(shapes[shape]), lambda: docs)
    name, reason = decision.name, decision.reason
    assert name == "tiktoken" and reason.startswith(
        "requested with --encoder tiktoken: byte-level BPE, and tiktoken"
    )


def test_auto_falls_back_to_tiktoken_where_fastokens_cannot_be_imported(
    monkeypatch, gpt2_tokenizer_path, docs
):
    import sys

    monkeypatch.setitem(sys.modules, "fastokens", None)  # what a platform without its wheel gives
    decision = decide("auto", str(gpt2_tokenizer_path), lambda: docs)
    name, reason = decision.name, decision.reason
    assert name == "tiktoken", reason
    assert "fastokens not used, fastokens is not installed" in reason
    with pytest.raises(
        TokshardError, match="--encoder fastokens would change the ids: fastokens is not installed"
    ):
        decide("fastokens", str(gpt2_tokenizer_path), lambda: docs)


def test_a_check_that_had_no_document_of_the_run_says_so(gpt2_tokenizer_path):
    """A --text-field the records lack gave the run no text to compare: the line read "the
    run's first 0 documents" before the run's refusal."""
    decision = decide("auto", str(gpt2_tokenizer_path), lambda: [])
    assert decision.reason.endswith("none of the run's documents (its first records held no text)")
    assert decide("auto", str(gpt2_tokenizer_path), lambda: ["one"]).reason.endswith(
        "the run's first 1 document"
    )


def test_requesting_tokenizers_skips_the_check(tmp_path):
    never_read = str(tmp_path / "never-read.json")
    decision = decide("tokenizers", never_read, lambda: 1 / 0, sha256="sha-of-the-plan")
    assert decision.spec == EncoderSpec("tokenizers", never_read, "sha-of-the-plan")


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
        for backend, encoder in FAST.items():
            decision = decide(backend, str(path), lambda: docs[:5])
            name, reason = decision.name, decision.reason
            assert name == backend, reason
            assert ids(encoder(str(path)), texts) == ids(TokenizersEncoder(str(path)), texts)
    assert "left out 1 vocabulary entries" in decide("tiktoken", str(junk), lambda: []).reason


def _merges_out_of_id_order(spec):
    vocab = spec["model"]["vocab"]
    a, b = (m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"][:2])
    ta, tb = a.replace(" ", ""), b.replace(" ", "")
    vocab[ta], vocab[tb] = vocab[tb], vocab[ta]


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


def _tokenizer_of_kind(kind: str, path: Path, small: list[str], tokenizer_path: Path) -> Path:
    from tokenizers import normalizers

    if kind == "nfkc-normalizer":
        return train_tokenizer_json(path, small, normalizer=normalizers.NFKC())
    if kind in ("wordpiece", "unigram"):
        return train_tokenizer_json(path, small, model=kind)
    if kind == "bytes-missing":
        return train_tokenizer_json(path, small, full_alphabet=False)
    if kind == "merge-order":
        return edited(tokenizer_path, path, _merges_out_of_id_order)
    if kind == "plain-added-token":
        return edited(tokenizer_path, path, plain_added_token)
    return _bpe_with_unreachable_merge(path)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nfkc-normalizer", "normalizer NFKC"),
        ("wordpiece", "model WordPiece is not BPE"),
        ("unigram", "model Unigram is not BPE"),
        ("bytes-missing", "vocabulary lacks"),
    ],
)
def test_auto_falls_back_to_tokenizers_and_names_the_reason(tmp_path, docs, tokenizer_path, kind, reason):
    path = _tokenizer_of_kind(kind, tmp_path / "tokenizer.json", docs[:40], tokenizer_path)
    decision = decide("auto", str(path), lambda: docs[:40])
    name, why = decision.name, decision.reason
    assert name == "tokenizers"
    assert why.startswith("auto: fastokens not used, ") and "; tiktoken not used, " in why
    assert why.count(reason) == 2


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("merge-order", "merge order is not id order"),
        ("plain-added-token", "added token 'hello world' is not special"),
        ("unreachable-merge", "tokenizers splits vocabulary entry"),
    ],
)
def test_where_only_tiktoken_parts_from_tokenizers_auto_takes_fastokens(
    tmp_path, docs, tokenizer_path, kind, reason
):
    path = _tokenizer_of_kind(kind, tmp_path / "tokenizer.json", docs[:40], tokenizer_path)
    with pytest.raises(TokshardError, match=f"--encoder tiktoken would change the ids: .*{reason}"):
        decide("tiktoken", str(path), lambda: docs[:40])
    decision = decide("auto", str(path), lambda: docs[:40])
    name, why = decision.name, decision.reason
    assert name == "fastokens", why
    texts = [*docs[:20], "hello world", "abc abcabc bc"]
    assert ids(FastokensEncoder(str(path)), texts) == ids(TokenizersEncoder(str(path)), texts)


def _special_token_at_the_largest_id(spec):
    """tokenizers renumbers it to the next free id; fastokens panics (a Rust index out of bounds)."""
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
    spec["added_tokens"].append({"id": 2**32 - 1, "content": "<|max|>", **flags, "special": True})


def test_a_panic_inside_fastokens_refuses_it_and_auto_goes_on_to_the_next(
    tmp_path, docs, gpt2_tokenizer_path
):
    """pyo3's PanicException is a BaseException: it went past every `except Exception` as a traceback."""
    path = edited(gpt2_tokenizer_path, tmp_path / "tokenizer.json", _special_token_at_the_largest_id)
    with pytest.raises(TokshardError, match=r"fastokens cannot read this tokenizer \(PanicException: "):
        decide("fastokens", str(path), lambda: docs[:5])
    decision = decide("auto", str(path), lambda: docs[:5])
    assert decision.name == "tiktoken", decision.reason
    assert "fastokens not used, fastokens cannot read this tokenizer (PanicException: " in decision.reason


def test_tiktoken_on_a_non_equivalent_tokenizer_stops_naming_the_first_differing_string_and_leaves_no_out(
    tmp_path, docs
):
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
    assert not (tmp_path / "out").exists(), "the refused run left its plan and tokenizer behind"


def test_a_worker_whose_fast_path_differs_refuses_to_encode(tmp_path, docs):
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    with pytest.raises(TokshardError, match="different library versions"):
        TiktokenEncoder(str(tok))


def test_a_worker_with_other_library_versions_than_the_driver_re_checks(tmp_path, docs):
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    other = tuple((lib, "0.0.1") for lib, _ in library_versions())
    with pytest.raises(TokshardError, match="different library versions"):
        worker_encoder(EncoderSpec("tiktoken", str(tok), "sha-other", checked_with=other))


def test_a_worker_with_the_driver_s_library_versions_trusts_its_check(tmp_path, docs):
    # a tokenizer the check would refuse: built without error only because nothing re-checks
    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r"\p{L}+| +")
    encoder = worker_encoder(EncoderSpec("tiktoken", str(tok), "sha-same", checked_with=library_versions()))
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


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(out)): f.read_bytes()
        for f in sorted(out.rglob("*"))
        if f.suffix in (".bin", ".idx")
    }


def test_prepare_writes_byte_identical_shards_with_each_encoder(tmp_path, docs, tokenizer_path, dask_client):
    texts = [docs[0], f"a web page quoting {EOS} in its text", long_document(docs), *docs[1:]]
    data = write_jsonl(tmp_path / "in.jsonl", texts)
    shards = {}
    for encoder in ("tokenizers", "tiktoken", "fastokens"):
        recipe = {
            "tokenizer": str(tokenizer_path),
            "encoder": encoder,
            "shard_tokens": 200_000,
            "sources": {"data": {"type": "files", "paths": [str(data)], "partition_bytes": 300_000}},
        }
        path = run_prepare(recipe, tmp_path / encoder, dask_client)
        m = manifest.load(path)
        assert m.data["encoder"]["name"] == encoder
        shards[encoder] = shard_bytes(tmp_path / encoder)
        stream = stream_of(path)
        assert np.array_equal(stream, plain_encode(tokenizer_path, texts)), encoder
        assert int((stream == m.eos_id).sum()) == len(texts)
    assert len(shards["tokenizers"]) >= 4
    assert shards["tiktoken"] == shards["tokenizers"] and shards["fastokens"] == shards["tokenizers"]


def _batch_shaped(spec):
    """Truncation and padding as a tokenizer.json saved from a model's input pipeline has them."""
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {
        "strategy": {"Fixed": 512}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
        "pad_type_id": 0, "pad_token": EOS,
    }  # fmt: skip


def test_a_tokenizer_saved_with_truncation_and_padding_encodes_whole_documents_with_each_encoder(
    tmp_path, docs, tokenizer_path, dask_client
):
    """They shape a model's batches: every document is still encoded whole, never cut at 8 ids or
    padded to 512, whichever encoder runs."""
    shaped = edited(tokenizer_path, tmp_path / "shaped" / "tokenizer.json", _batch_shaped)
    texts = ["short", *docs[:20]]
    data = write_jsonl(tmp_path / "in.jsonl", texts)
    for encoder in ("auto", "tokenizers", "tiktoken", "fastokens"):
        recipe = {
            "tokenizer": str(shaped),
            "encoder": encoder,
            "sources": {"d": {"type": "files", "paths": [str(data)]}},
        }
        path = run_prepare(recipe, tmp_path / encoder, dask_client)
        assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, texts)), encoder


def test_manifest_records_a_fallback_and_its_reason(tmp_path, docs, dask_client):
    from tokenizers import normalizers

    tok = train_tokenizer_json(tmp_path / "tok" / "tokenizer.json", docs[:40], normalizer=normalizers.NFKC())
    data = write_jsonl(tmp_path / "in.jsonl", docs[:10])
    recipe = {"tokenizer": str(tok), "sources": {"data": {"type": "files", "paths": [str(data)]}}}
    encoder = manifest.load(run_prepare(recipe, tmp_path / "out", dask_client)).data["encoder"]
    assert encoder["name"] == "tokenizers"
    assert "normalizer NFKC" in encoder["reason"]
    assert (encoder["library"], encoder["version"]) == ("tokenizers", library_version("tokenizers"))
    assert np.array_equal(stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tok, docs[:10]))


def test_cli_logs_the_choice_and_threads_reach_the_manifest(tmp_path, docs, gpt2_tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:30])
    proc = cli("prepare", "--input", str(data), "--tokenizer", str(gpt2_tokenizer_path),
               "--out", str(tmp_path / "out"), "--workers", "1", "--threads", "2", check=True)  # fmt: skip
    assert (
        "tokshard: encoder: fastokens (auto: byte-level BPE, and fastokens gave the same ids" in proc.stderr
    )
    data_ = validate_manifest(tmp_path / "out" / "manifest.json")
    assert data_["encoder"]["name"] == "fastokens" and data_["encoder"]["threads"] == 2
    assert (data_["encoder"]["library"], data_["encoder"]["version"]) == (
        "fastokens",
        library_version("fastokens"),
    )
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(gpt2_tokenizer_path, docs[:30])
    )


def command_r_shape(individual: bool):
    """Command R's pre-tokenizer: each digit alone, then ByteLevel with GPT-2's split; and its
    NFC normalizer."""

    def edit(spec):
        spec["normalizer"] = {"type": "NFC"}
        spec["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": individual},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }

    return edit


def test_auto_takes_fastokens_for_each_digit_alone_then_gpt2s_split(tokenizer_path, docs, tmp_path):
    path = edited(tokenizer_path, tmp_path / "command-r" / "tokenizer.json", command_r_shape(True))
    decision = decide("auto", str(path), lambda: docs)
    assert decision.name == "fastokens", decision.reason
    assert "after its NFC normalizer" in decision.reason
    texts = [*docs[:30], "call 555-0199, ١٢٣ and ⅷ or ½ at 12:30", "e\u0301cole 2024 x² 10\u2126"]
    got = worker_encoder(decision.spec).encode_batch(texts)
    assert [as_list(g) for g in got] == TokenizersEncoder(str(path)).encode_batch(texts)


def test_digit_runs_kept_together_before_gpt2s_split_stay_on_tokenizers(tokenizer_path, docs, tmp_path):
    path = edited(tokenizer_path, tmp_path / "digit-runs" / "tokenizer.json", command_r_shape(False))
    decision = decide("auto", str(path), lambda: docs)
    assert decision.name == "tokenizers"
    assert "Digits+ByteLevel other than each digit alone" in decision.reason
