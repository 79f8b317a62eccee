"""The EOS id comes only from the pipeline's separators, for every kind of tokenizer: a
literal EOS in a document is ordinary text; where a tokenizer's EOS is an entry its model
reaches from text, the run is refused in one line before any work. And SentencePiece-family
tokenizers (Metaspace with byte fallback as Llama 2 and Mistral ship, a Unigram model) run
exactly through `tokenizers`.

Every tokenizer here is a real one, trained with `tokenizers` on real prose."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import cli, english_documents, write_jsonl

from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.documents import DocumentEncoder
from pipeline.encoding.tokenizer import load
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


@pytest.mark.parametrize("kind", ["llama2_style", "metaspace_bpe", "unigram"])
def test_sentencepiece_family_runs_exactly_through_tokenizers_and_a_literal_eos_is_text(
    kind, request, tmp_path, prose
):
    """Each document comes out as `tokenizers` encodes it alone; a document quoting ``</s>``
    (or ``<s>``) stays one document (the EOS id appears only between documents), byte fallback
    included; `auto` takes fastokens only for Llama 2's shape, where the check passes, and says
    why not for the others."""
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
    if kind == "llama2_style":  # the one SentencePiece shape fastokens is checked on, and passes
        assert m.data["encoder"]["name"] == "fastokens"
        assert m.data["encoder"]["reason"].startswith("auto: SentencePiece-style BPE with byte fallback, and")
    else:
        assert m.data["encoder"]["name"] == "tokenizers"
        assert "fastokens not used" in m.data["encoder"]["reason"]
    got = documents_in(out)
    assert len(got) == len(docs)
    assert got == reference_ids(tok, docs)
    assert "its text inside a document is encoded as ordinary text" in m.data["tokenizer"]["eos_found"] or (
        "out of reach of text" in m.data["tokenizer"]["eos_found"]
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
