"""The EOS id comes only from the pipeline's separators, for every kind of tokenizer: a
literal EOS in a document is ordinary text; where a tokenizer's EOS is an entry its model
reaches from text, the run is refused in one line before any work. And SentencePiece-family
tokenizers (Metaspace with byte fallback as Llama 2 and Mistral ship, a Unigram model) run
exactly through `tokenizers`.

Every tokenizer here is a real one, trained with `tokenizers` on real prose."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import numpy as np
import pytest
from support import cli, english_documents, write_jsonl

from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.documents import DocumentEncoder
from pipeline.encoding.tokenizer import configured_eos, load
from pipeline.format import manifest
from pipeline.format.errors import DataError
from pipeline.sources.base import Record

SPECIALS = ["<unk>", "<s>", "</s>"]


@pytest.fixture(scope="module")
def prose() -> list[str]:
    return english_documents(150)


def save(tok, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def llama2_style(tmp_path_factory, prose) -> Path:
    """A SentencePiece-style BPE as Llama 2 and Mistral ship it: ``▁`` for spaces by a
    normalizer, byte fallback to ``<0xXX>`` tokens, ``</s>`` a special token at id 2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS + bytes_, show_progress=False)
    tok.train_from_iterator(prose, trainer)
    return save(tok, tmp_path_factory.mktemp("llama2") / "tokenizer.json")


@pytest.fixture(scope="module")
def no_prepend_style(tmp_path_factory, llama2_style) -> Path:
    """Llama 2's shape without the "▁" before the text, as InternLM2 and Yi ship it."""
    spec = json.loads(llama2_style.read_text())
    spec["normalizer"] = {"type": "Sequence", "normalizers": spec["normalizer"]["normalizers"][1:]}
    path = tmp_path_factory.mktemp("no-prepend") / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def metaspace_bpe(tmp_path_factory, prose) -> Path:
    """`tokenizers`' own SentencePieceBPETokenizer: a Metaspace pre-tokenizer."""
    from tokenizers import SentencePieceBPETokenizer

    tok = SentencePieceBPETokenizer()
    tok.train_from_iterator(prose, vocab_size=1500, special_tokens=SPECIALS, show_progress=False)
    return save(tok, tmp_path_factory.mktemp("spbpe") / "tokenizer.json")


@pytest.fixture(scope="module")
def unigram(tmp_path_factory, prose) -> Path:
    """A SentencePiece Unigram model (T5 / ALBERT style): ``</s>`` is one of its pieces."""
    from tokenizers import SentencePieceUnigramTokenizer

    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(
        prose, vocab_size=1500, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False
    )
    return save(tok, tmp_path_factory.mktemp("unigram") / "tokenizer.json")


@pytest.fixture(scope="module")
def wordlevel(tmp_path_factory, prose) -> Path:
    """A WordLevel vocabulary whose ``</s>`` is an ordinary word of it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(prose, trainers.WordLevelTrainer(vocab_size=1500, special_tokens=SPECIALS))
    return save(tok, tmp_path_factory.mktemp("wordlevel") / "tokenizer.json")


def prepare(tmp_path: Path, tok: Path, docs: list[str], *extra: str):
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    out = tmp_path / "out"
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tok), "--out", str(out), "--workers", "1", *extra
    )
    return proc, out


def documents_in(out: Path) -> list[list[int]]:
    """The shards cut at each EOS: one list of ids per document."""
    m = manifest.load(out / "manifest.json")
    ids = np.concatenate([np.fromfile(e.bin_path, dtype=m.dtype) for e in m.shards]).tolist()
    docs, cur = [], []
    for i in ids:
        if i == m.eos_id:
            docs.append(cur)
            cur = []
        else:
            cur.append(i)
    assert not cur
    return docs


def reference_ids(tok: Path, docs: list[str]) -> list[list[int]]:
    """The plain tokenizer on each document, special-token text as text (`load` sets that up)."""
    return [e.ids for e in load(tok).encode_batch(docs, add_special_tokens=False)]


@pytest.mark.parametrize("kind", ["llama2_style", "no_prepend_style", "metaspace_bpe", "unigram"])
def test_sentencepiece_family_runs_exactly_through_tokenizers_and_a_literal_eos_is_text(
    kind, request, tmp_path, prose
):
    """Each document comes out as `tokenizers` encodes it alone; a document quoting ``</s>``
    (or ``<s>``) stays one document (the EOS id appears only between documents), byte fallback
    included; `auto` takes fastokens only for Llama 2's shape (with or without its "▁" before
    the text), where the check passes, and says why not for the others."""
    tok = request.getfixturevalue(kind)
    docs = [
        prose[0],
        "a web page quoting </s> and <s> in its text",
        "emoji 🙂 and 日本語 fall back to bytes",
        prose[1],
    ]
    proc, out = prepare(tmp_path, tok, docs)
    assert proc.returncode == 0, proc.stderr
    m = manifest.load(out / "manifest.json")
    assert m.eos_id == 2
    if kind in ("llama2_style", "no_prepend_style"):  # the SentencePiece shapes fastokens is checked on
        assert m.data["encoder"]["name"] == "fastokens"
        assert m.data["encoder"]["reason"].startswith("auto: SentencePiece-style BPE with byte fallback, and")
    else:
        assert m.data["encoder"]["name"] == "tokenizers"
        assert "fastokens not used" in m.data["encoder"]["reason"]
    got = documents_in(out)
    assert len(got) == len(docs)
    assert got == reference_ids(tok, docs)
    assert "its text inside a document is encoded as ordinary text" in m.data["tokenizer"]["eos_found"] or (
        "is scored below all others for this run, so document text takes another segmentation "
        "(tokenizers on the file as it is gives a literal '</s>' the EOS id)"
        in m.data["tokenizer"]["eos_found"]
    )


def test_a_unigram_models_eos_piece_is_out_of_reach_of_text(unigram):
    """Unigram hands ``</s>`` in text to the model, whose best piece for it was the EOS itself
    (score 0): now no special token's id comes from text, and ordinary text is unchanged."""
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(str(unigram))
    plain.encode_special_tokens = True
    eos = plain.token_to_id("</s>")
    assert eos in plain.encode("x</s>y", add_special_tokens=False).ids  # what a plain load does
    ours = load(unigram)
    for text in ("x</s>y", "</s>", "a </s> b <s> <unk>"):
        assert eos not in ours.encode(text, add_special_tokens=False).ids
    prose = english_documents(30)
    same = [e.ids for e in plain.encode_batch(prose, add_special_tokens=False)]
    assert [e.ids for e in ours.encode_batch(prose, add_special_tokens=False)] == same


def test_an_eos_that_text_reaches_as_a_word_is_refused_in_one_line_before_any_work(wordlevel, tmp_path):
    proc, out = prepare(tmp_path, wordlevel, ["hello </s> world"], "--encoder", "tokenizers")
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "'</s>' is an entry of the WordLevel vocabulary that document text reaches" in proc.stderr
    assert not (out / "manifest.json").exists()


def test_an_eos_added_but_not_special_is_refused_in_one_line(metaspace_bpe, tmp_path):
    spec = json.loads(metaspace_bpe.read_text())
    for t in spec["added_tokens"]:
        t["special"] = False
    tok = tmp_path / "plain-eos.json"
    tok.write_text(json.dumps(spec))
    proc, _ = prepare(tmp_path, tok, ["hello </s> world"])
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1
    assert "is an added token not marked special" in proc.stderr


def test_a_batch_whose_text_encodes_to_the_eos_id_stops_naming_the_document(wordlevel, tmp_path):
    """The last guard, for any back end: ids are checked before they are written."""
    encoder = TokenizersEncoder(str(wordlevel))
    eos = encoder.tokenizer.token_to_id("</s>")
    docs = DocumentEncoder(encoder, eos, np.dtype("<u2"), tmp_path / "spool", lambda: None)
    records = [Record("fine words", None, "in.jsonl:1"), Record("a </s> inside", None, "in.jsonl:2")]
    with pytest.raises(DataError, match=r"in.jsonl:2: the document's text encodes to the EOS id"):
        list(docs.run(records))


def test_a_document_encoding_to_the_eos_id_is_named_by_its_place(wordlevel, tmp_path):
    """A good record's ``where`` is its file alone (its line costs a read): its place is named too."""
    from pipeline.format.provenance import Input

    encoder = TokenizersEncoder(str(wordlevel))
    docs = DocumentEncoder(
        encoder, encoder.tokenizer.token_to_id("</s>"), np.dtype("<u2"), tmp_path, lambda: None
    )
    at = Input("in.jsonl", "offset")
    records = [
        Record("fine words", None, "in.jsonl", input=at),
        Record("a </s> inside", None, "in.jsonl", input=at, place=25),
    ]
    with pytest.raises(
        DataError, match=r"^in.jsonl \(offset 25\): the document's text encodes to the EOS id"
    ):
        list(docs.run(records))


def test_a_unigram_piece_that_is_no_special_token_is_never_taken_for_the_eos(unigram, tmp_path):
    """A Unigram model may choose any piece for text: a learned ``<|endoftext|>`` piece (web text
    quotes it) was taken as the EOS, said to be out of text's reach, and the run stopped at the
    first document quoting it. The special ``</s>`` is taken instead."""
    spec = json.loads(unigram.read_text())
    spec["model"]["vocab"].append(["<|endoftext|>", -8.0])
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps(spec))
    proc, out = prepare(tmp_path, tok, ["a doc quoting <|endoftext|> as text", "another"])
    assert proc.returncode == 0, proc.stderr
    facts = manifest.load(out / "manifest.json").data["tokenizer"]
    assert facts["eos_token"] == "</s>"
    assert "(not '<|endoftext|>', which text reaches)" in facts["eos_found"]


def test_a_single_character_named_as_the_eos_of_a_bpe_is_refused_before_any_work(own_eos, tmp_path):
    proc, out = prepare(tmp_path, own_eos, ["a b c"], "--eos-token", "a")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "its EOS 'a' is an entry of the BPE vocabulary that document text reaches (a single character" in (
        proc.stderr
    )
    assert not out.exists()


@pytest.fixture(scope="module")
def own_eos(tmp_path_factory, prose) -> Path:
    """A byte-level BPE whose only special token, ``<|doc_end|>``, is none of the usual EOS
    spellings (as a model family that names its own would ship it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=["<|doc_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(prose, trainer)
    return save(tok, tmp_path_factory.mktemp("own-eos") / "tokenizer.json")


def test_an_eos_named_only_by_the_tokenizer_config_beside_it_ends_each_document(own_eos, tmp_path, prose):
    """As a hub folder holds it: tokenizer_config.json names the EOS (here as an AddedToken)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(own_eos.read_bytes())
    config = {"eos_token": {"__type": "AddedToken", "content": "<|doc_end|>", "special": True}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    proc, out = prepare(tmp_path, folder, prose[:20])
    assert proc.returncode == 0, proc.stderr
    m = manifest.load(out / "manifest.json")
    assert m.data["tokenizer"]["eos_token"] == "<|doc_end|>"
    assert m.eos_id == load(own_eos).token_to_id("<|doc_end|>")
    assert m.data["tokenizer"]["eos_found"].startswith("named by the tokenizer_config.json beside it")
    assert documents_in(out) == reference_ids(own_eos, prose[:20])


def test_a_tokenizer_config_saved_with_a_byte_order_mark_still_names_the_eos(tmp_path):
    """Not taken for "no config" (which would leave the EOS to a guess or a refusal)."""
    (tmp_path / "tokenizer_config.json").write_bytes(codecs.BOM_UTF8 + b'{"eos_token": "<|doc_end|>"}')
    assert configured_eos(tmp_path / "tokenizer.json") == "<|doc_end|>"


def test_a_config_that_does_not_read_is_named_where_it_would_name_the_eos(own_eos, tmp_path):
    """It was taken for no config: the line said none names an EOS, not that the one there is broken."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(own_eos.read_bytes())
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<|doc_end|>",')
    proc, out = prepare(tmp_path, folder, ["hello world"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{folder / 'tokenizer_config.json'} is not JSON (" in proc.stderr
    assert proc.stderr.rstrip().endswith("fix or remove it, or name the EOS with --eos-token TEXT")
    assert not out.exists()


def test_no_known_eos_and_no_config_is_refused_in_one_line_naming_the_flag(own_eos, tmp_path):
    proc, out = prepare(tmp_path, own_eos, ["hello world"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "has no EOS token" in proc.stderr and "--eos-token" in proc.stderr
    assert not out.exists()


def test_eos_token_on_the_command_line_names_the_eos(own_eos, tmp_path, prose):
    proc, out = prepare(tmp_path, own_eos, prose[:5], "--eos-token", "<|doc_end|>")
    assert proc.returncode == 0, proc.stderr
    m = manifest.load(out / "manifest.json")
    assert m.data["tokenizer"]["eos_found"].startswith("named by eos_token")
    assert documents_in(out) == reference_ids(own_eos, prose[:5])


def _rerun(tmp_path: Path, tok: Path, *extra: str):
    """`prepare` again on the input the first call wrote (written again, it would be changed)."""
    return cli("prepare", "--input", str(tmp_path / "in.jsonl"), "--tokenizer", str(tok), "--out",
               str(tmp_path / "out"), "--workers", "1", *extra)  # fmt: skip


def test_a_rerun_naming_by_hand_the_eos_the_config_named_is_the_same_run(own_eos, tmp_path, prose):
    """--eos-token added to the command, naming the EOS the default found, writes the same
    bytes: the rerun was refused as "a different recipe" (eos_token: None -> '<|doc_end|>')."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(own_eos.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|doc_end|>"}))
    assert prepare(tmp_path, folder, prose[:5])[0].returncode == 0
    proc = _rerun(tmp_path, folder, "--eos-token", "<|doc_end|>")
    assert proc.returncode == 0, proc.stderr
    assert "is already complete" in proc.stderr


def test_a_rerun_naming_another_eos_by_hand_is_refused_naming_both(own_eos, tmp_path, prose):
    from tokenizers import AddedToken

    tok = load(own_eos)
    tok.add_special_tokens([AddedToken("<|other_end|>", special=True)])
    two = save(tok, tmp_path / "two" / "tokenizer.json")
    assert prepare(tmp_path, two, prose[:5], "--eos-token", "<|doc_end|>")[0].returncode == 0
    proc = _rerun(tmp_path, two, "--eos-token", "<|other_end|>")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "holds a run whose tokenizer framed documents otherwise (" in proc.stderr
    assert "eos_token: '<|doc_end|>' -> '<|other_end|>'" in proc.stderr


@pytest.mark.parametrize("eos", ["<|absent|>", ""])
def test_an_eos_token_the_tokenizer_lacks_or_an_empty_one_is_refused_in_one_line(own_eos, tmp_path, eos):
    proc, out = prepare(tmp_path, own_eos, ["hello world"], "--eos-token", eos)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert ("has no token '<|absent|>'" if eos else "--eos-token: must not be empty") in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "eos", "skipped"),
    [("gemma2", "<eos>", "'</s>'"), ("deepseek_v3", "<\uff5cend\u2581of\u2581sentence\uff5c>", None)],
)
def test_a_published_models_folder_ends_documents_with_its_own_eos(name, eos, skipped):
    """Gemma 2 has a plain (not special) ``</s>`` that text reaches, passed over for its
    ``<eos>``; DeepSeek V3 spells its end of sentence with fullwidth bars."""
    from published_vocabs import hub_folder

    from pipeline.encoding.tokenizer import inspect_file

    path = hub_folder(name) / "tokenizer.json"
    info = inspect_file(path, name, None, "auto")
    assert info.eos_token == eos and info.eos_id == load(path).token_to_id(eos)
    assert info.eos_found.startswith("the first of the usual EOS spellings it has")
    assert (f"(not {skipped}, which text reaches)" in info.eos_found) == (skipped is not None)


def test_a_hub_tokenizer_s_eos_comes_from_the_config_in_its_snapshot(own_eos, tmp_path, prose):
    """A hub name resolved from the hub cache (offline, in the cache's own layout): its
    tokenizer_config.json is taken from the same snapshot and names the EOS."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--doc-end"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "tokenizer.json").write_bytes(own_eos.read_bytes())
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|doc_end|>"}))
    data = write_jsonl(tmp_path / "in.jsonl", prose[:5])
    out = tmp_path / "out"
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    proc = cli("prepare", "--input", str(data), "--tokenizer", "acme/doc-end", "--out", str(out), "--workers", "1",
               env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    m = manifest.load(out / "manifest.json")
    assert m.data["tokenizer"]["eos_token"] == "<|doc_end|>"
    assert m.data["tokenizer"]["eos_found"].startswith("named by the tokenizer_config.json beside it")


def test_the_kept_facts_of_a_tokenizer_follow_the_config_beside_it(own_eos, tmp_path):
    """The facts kept for a tokenizer's content (`check_cache.resolve_tokenizer`) are found
    again when the tokenizer_config.json beside it changes."""
    from pipeline.encoding import check_cache
    from pipeline.format.errors import TokshardError

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(own_eos.read_bytes())
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": "<|doc_end|>"}))
    _, info = check_cache.resolve_tokenizer(str(folder), None, "auto")
    assert info.eos_token == "<|doc_end|>"
    config.write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(TokshardError, match=r"names '<\|im_end\|>', which it lacks\); .*--eos-token"):
        check_cache.resolve_tokenizer(str(folder), None, "auto")


def test_gemma2_as_published_runs_on_fastokens_exactly(prose):
    """Gemma's shape: spaces made "▁" by a lone Replace, then a Split on " " that finds none;
    243 added tokens that are not special, which `tokenizers` finds in text first."""
    from published_vocabs import hub_folder

    from pipeline.encoding.byte_level import plain_added
    from pipeline.encoding.selection import decide
    from pipeline.encoding.tokenizer import read_spec

    tok = hub_folder("gemma2") / "tokenizer.json"
    plain = plain_added(read_spec(tok))
    docs = [
        prose[0],
        "日本語のテキスト、中文文本，한국어 and emoji 🙂 fall back to bytes",
        "quoting its added tokens: " + " ".join(plain[:40]) + "".join(plain[40:80]),
        "a literal </s> and <eos> and <bos> are text",
        "  two spaces,\n\nnew lines\t\ttabs " + prose[1][:500],
    ]
    decision = decide("auto", str(tok), lambda: docs)  # its check compares these documents' ids
    assert decision.name == "fastokens", decision.reason
    assert decision.reason.startswith("auto: SentencePiece-style BPE with byte fallback, and")
    assert decision.reason.endswith(f"and the run's first {len(docs)} documents")


def test_the_check_quotes_every_added_token_that_is_not_special():
    """`tokenizers` finds those in text before it normalizes: the check's strings hold each one
    inside a word and between texts, where a fast back end could find it otherwise."""
    from published_vocabs import hub_folder

    from pipeline.encoding.byte_level import plain_added
    from pipeline.encoding.equivalence import probes, vocabulary_from_spec
    from pipeline.encoding.tokenizer import read_spec

    spec = read_spec(hub_folder("gemma2") / "tokenizer.json")
    strings = set(probes(vocabulary_from_spec(spec)))
    assert len(plain_added(spec)) == 243
    assert all(f"x{t}y" in strings and f"{t}\n\nnext" in strings for t in plain_added(spec))
