"""One typed decision: `decide` returns the `EncoderSpec` every worker builds and the reason the
manifest gives; a spec is plain data that travels to workers and keys their one encoder."""

from __future__ import annotations

import pickle

import pytest
from published_vocabs import tokenizer_json

from pipeline.encoding.backend import library_versions
from pipeline.encoding.documents import SpaceCuts, byte_level_pre_tokenizer
from pipeline.encoding.routing import RoutedEncoder, fastokens_class
from pipeline.encoding.selection import decide, warm_likely
from pipeline.encoding.spec import EncoderSpec, routed_class, worker_encoder
from pipeline.format.errors import TokshardError


def test_the_decision_holds_what_workers_build_and_what_the_manifest_says(docs):
    path = str(tokenizer_json("cl100k_base"))
    decision = decide("auto", path, lambda: docs, sha256="sha-cl100k", threads=2)
    spec = decision.spec
    assert (spec.backend, spec.tokenizer, spec.sha256, spec.threads) == ("fastokens", path, "sha-cl100k", 2)
    assert spec.checked_with == library_versions()
    assert spec.route == fastokens_class(path) == routed_class(path)
    entry = decision.manifest_entry(routed_documents=3)
    assert entry["name"] == "fastokens" and entry["reason"] == decision.reason and entry["threads"] == 2
    if spec.route:
        assert entry["routed"]["documents"] == 3


def test_a_spec_travels_as_data_and_keys_one_encoder_per_worker(gpt2_tokenizer_path, tmp_path):
    spec = EncoderSpec.checked_here("fastokens", str(gpt2_tokenizer_path), "sha-gpt2")
    travelled = pickle.loads(pickle.dumps(spec))
    assert travelled == spec and hash(travelled) == hash(spec)
    assert worker_encoder(travelled) is worker_encoder(spec)
    copy = tmp_path / "tokenizer.json"  # a worker's own copy (a store run's scratch)
    copy.write_bytes(gpt2_tokenizer_path.read_bytes())
    elsewhere = spec.reading(str(copy))
    assert (elsewhere.tokenizer, elsewhere.sha256, elsewhere.route) == (str(copy), spec.sha256, spec.route)
    assert worker_encoder(elsewhere) is not worker_encoder(spec)


def test_a_routed_spec_builds_the_routed_encoder_and_an_empty_class_the_plain_one(gpt2_tokenizer_path):
    path = str(gpt2_tokenizer_path)
    plain = worker_encoder(EncoderSpec("fastokens", path, "sha", checked_with=library_versions()))
    routed = worker_encoder(
        EncoderSpec("fastokens", path, "sha", checked_with=library_versions(), route=frozenset({0x180E}))
    )
    assert not isinstance(plain, RoutedEncoder)
    assert isinstance(routed, RoutedEncoder) and routed.route == frozenset({0x180E})
    texts = ["plain text", "a\u180eb"]
    assert [list(x) for x in routed.encode_batch(texts)] == [list(x) for x in plain.encode_batch(texts)]
    assert routed.routed == 1


def test_a_fast_spec_says_how_long_documents_are_cut_so_no_worker_parses_the_file_for_it(
    gpt2_tokenizer_path, tmp_path, monkeypatch
):
    """The driver finds whether space cuts apply (a worker at its first long document parsed a
    100k-200k vocabulary's file for that one answer); a worker given the spec opens nothing."""
    from pipeline.encoding import tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # nothing kept from other runs
    path = str(gpt2_tokenizer_path)
    spec = EncoderSpec.checked_here("fastokens", path, "sha-gpt2")
    assert spec.space_cuts is True
    assert EncoderSpec.checked_here("tokenizers", path, "sha-gpt2").space_cuts is None  # not looked up

    def refuse(path):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(tokenizer, "read_spec", refuse)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-node"))  # nor is it kept there
    travelled = pickle.loads(pickle.dumps(spec))
    assert isinstance(byte_level_pre_tokenizer(travelled.tokenizer, travelled.space_cuts), SpaceCuts)


def test_a_spec_says_space_cuts_do_not_apply_to_another_split_pattern(docs, tmp_path):
    from support import train_tokenizer_json

    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r" ?\p{L}+| ?[^\s\p{L}]+|\s+")
    spec = EncoderSpec.checked_here("tiktoken", str(tok), "sha-other")
    assert spec.space_cuts is False
    assert callable(byte_level_pre_tokenizer(str(tok), spec.space_cuts))  # its own pre-tokenizer


def test_an_unknown_back_end_is_refused_in_one_line():
    with pytest.raises(TokshardError, match="encoder 'sentencepiece' is not available; use one of"):
        EncoderSpec("sentencepiece", "tokenizer.json", "sha")


class WarmedSpecs:
    """The `Workers` hook of `decide` as a record of what it was asked to build (no workers)."""

    def __init__(self) -> None:
        self.warmed: list[EncoderSpec] = []

    def warm(self, spec: EncoderSpec) -> None:
        self.warmed.append(spec)

    def probe(self, spec: EncoderSpec, texts: list[str]) -> list | None:
        return None


def test_workers_warmed_before_the_decision_build_the_spec_it_returns(gpt2_tokenizer_path, docs):
    """`warm_likely`, called while a run plans, asks the workers for the very spec `decide`
    then asks for and returns: each worker's one encoder for it is built once, early."""
    path = str(gpt2_tokenizer_path)
    workers = WarmedSpecs()
    warm_likely("auto", path, "sha-gpt2", 2, workers)
    decision = decide("auto", path, lambda: docs, sha256="sha-gpt2", threads=2, workers=workers)
    assert workers.warmed == [decision.spec, decision.spec]
    warm_likely("no-such-encoder", path, "sha-gpt2", 2, workers)  # `decide` refuses it by name
    assert len(workers.warmed) == 2


@pytest.mark.parametrize(
    ("backend", "libraries"),
    [
        ("tokenizers", ("tokenizers",)),
        ("fastokens", ("fastokens", "tokenizers")),
        ("tiktoken", ("tiktoken", "tokenizers")),
    ],
)
def test_a_spec_names_the_libraries_its_ids_depend_on(backend, libraries):
    """What a worker must share with the driver: the back end's library and the reference's."""
    assert EncoderSpec(backend, "tokenizer.json", "sha").libraries == libraries
