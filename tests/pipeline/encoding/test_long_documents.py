"""Long documents: encoded in pieces cut at pre-tokenizer boundaries, same ids as whole."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tokenizers
from support import plain_encode, run_prepare, stream_of

from pipeline.encoding.backend import TokenizersEncoder
from pipeline.encoding.byte_level import SPACE_CUT_PATTERNS
from pipeline.encoding.documents import (
    SPOOL_BYTES,
    DocumentEncoder,
    Held,
    LongProgress,
    SpaceCuts,
    Spooled,
    byte_level_pre_tokenizer,
    pieces,
)
from pipeline.sources.base import Record


def general_cutter(tokenizer_path):
    """The tokenizer's own pre-tokenizer: what cuts where `SpaceCuts` does not apply."""
    from pipeline.encoding.tokenizer import load

    return load(str(tokenizer_path)).pre_tokenizer.pre_tokenize_str


def long_encoder(encoder, tok, tmp_path, eos_id: int = 0, **settings) -> DocumentEncoder:
    """A `DocumentEncoder` writing uint16 ids, cutting at ``tok``'s pre-token boundaries."""
    return DocumentEncoder(
        encoder,
        eos_id=eos_id,
        dtype=np.dtype("<u2"),
        spool_path=tmp_path / "spool.tmp",
        pre_tokenizer=lambda: byte_level_pre_tokenizer(str(tok)),
        **settings,
    )


def gpt2_fastokens_long_encoder(tok, tmp_path, **settings) -> DocumentEncoder:
    """GPT-2 on fastokens, documents over 50,000 characters cut into pieces of about 8,000."""
    from pipeline.encoding.fastokens_backend import FastokensEncoder

    return long_encoder(
        FastokensEncoder(str(tok)),
        tok,
        tmp_path,
        eos_id=50256,
        long_doc_chars=50_000,
        piece_chars=8_000,
        **settings,
    )


def nasty_text(docs: list[str], seed: int, chars: int) -> str:
    """Real prose interleaved with what makes cutting hard: long space and newline runs,
    words with no space for thousands of characters, CJK, emoji, combining marks."""
    rng = random.Random(seed)
    oddities = [
        " " * 5000,
        "\n" * 3000,
        "\t \n " * 700,
        "x" * 9000,
        "日本語のテキスト" * 500,
        "🙂👍🏽" * 800,
        "e\u0301" * 2000,
        "1234567890" * 600,
        "don't won't it's " * 300,
    ]
    parts = []
    total = 0
    while total < chars:
        part = rng.choice(docs) if rng.random() < 0.7 else rng.choice(oddities)
        parts.append(part)
        total += len(part)
    return "".join(parts)


@pytest.mark.parametrize("space_cuts", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_encode_to_the_same_ids_as_the_whole(docs, tokenizer_path, seed, space_cuts):
    text = nasty_text(docs, seed, 600_000)
    pre = byte_level_pre_tokenizer(str(tokenizer_path))
    assert isinstance(pre, SpaceCuts)
    cutter = pre if space_cuts else general_cutter(tokenizer_path)
    enc = TokenizersEncoder(str(tokenizer_path))
    cut = list(pieces([text[i : i + 50_000] for i in range(0, len(text), 50_000)], 20_000, cutter))
    assert len(cut) > 10
    assert "".join(cut) == text
    joined = [i for ids in enc.encode_batch(cut) for i in ids]
    assert joined == enc.encode_batch([text])[0]


def test_space_cuts_are_exact_for_gpt2_and_the_llama3_pattern(docs, gpt2_tokenizer_path, tmp_path):
    from support import LLAMA3_PATTERN, train_tokenizer_json

    llama3 = train_tokenizer_json(tmp_path / "llama3" / "tokenizer.json", docs[:80], split=LLAMA3_PATTERN)
    text = nasty_text(docs, 11, 400_000) + " 'quoted' don't \u0085 x\u180e y \u3000 z"
    for path in (gpt2_tokenizer_path, llama3):
        pre = byte_level_pre_tokenizer(str(path))
        assert isinstance(pre, SpaceCuts), path
        enc = TokenizersEncoder(str(path))
        cut = list(pieces([text], 10_000, pre))
        assert len(cut) > 20 and "".join(cut) == text
        assert [i for ids in enc.encode_batch(cut) for i in ids] == enc.encode_batch([text])[0]


@pytest.mark.parametrize("patterns", SPACE_CUT_PATTERNS, ids=range(len(SPACE_CUT_PATTERNS)))
def test_every_space_cut_is_a_boundary_of_tokenizers_own_split_on_each_space_cut_pattern(docs, patterns):
    """The pieces, each split alone by `tokenizers`' Splits on the patterns (one after another),
    give the whole text's pre-tokens (and so its ids): for every pattern set `SpaceCuts` is used
    with, o200k_base's folded spelling (Xenova's GPT-4o file) and DeepSeek V3's three among them."""
    split = tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Split(tokenizers.Regex(p), behavior="isolated") for p in patterns]
    )
    text = nasty_text(docs, 11, 400_000) + " 'quoted' don't \u0085 x\u180e y \u3000 z/ ABCdef's 'LL \u017fs"
    text += " 日本語のテキスト123456 中文，数字７８９ and .com 'x ٣٤٥٦"
    cut = list(pieces([text], 10_000, SpaceCuts()))
    assert len(cut) > 20 and "".join(cut) == text
    whole = [p for p, _ in split.pre_tokenize_str(text)]
    assert [p for piece in cut for p, _ in split.pre_tokenize_str(piece)] == whole


def test_space_cuts_do_not_depend_on_how_the_text_arrives(docs, tokenizer_path):
    text = nasty_text(docs, 4, 300_000)
    pre = byte_level_pre_tokenizer(str(tokenizer_path))
    whole = list(pieces([text], 8_000, pre))
    for step in (1_000, 7_919, 65_536):
        assert list(pieces([text[i : i + step] for i in range(0, len(text), step)], 8_000, pre)) == whole


def test_a_worker_learns_that_space_cuts_apply_without_parsing_the_file_again(
    gpt2_tokenizer_path, tmp_path, monkeypatch
):
    """The answer is kept beside the checks: a later process (a run's worker) reads it back."""
    from pipeline.encoding import tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert isinstance(byte_level_pre_tokenizer(str(gpt2_tokenizer_path)), SpaceCuts)

    def refuse(path):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(tokenizer, "read_spec", refuse)
    assert isinstance(byte_level_pre_tokenizer(str(gpt2_tokenizer_path)), SpaceCuts)


def test_an_unknown_split_pattern_gets_the_general_cutter(docs, tmp_path):
    from support import train_tokenizer_json

    tok = train_tokenizer_json(tmp_path / "tokenizer.json", docs[:40], split=r" ?\p{L}+| ?[^\s\p{L}]+|\s+")
    assert callable(byte_level_pre_tokenizer(str(tok)))


def test_aplain_added_token_spanning_a_boundary_is_never_cut(tmp_path, tokenizer_path):
    from support import edited, plain_added_token

    tok = edited(tokenizer_path, tmp_path / "tokenizer.json", plain_added_token)  # "hello world"
    assert byte_level_pre_tokenizer(str(tok)) is None
    text = "hello world " * 5_000
    enc = long_encoder(TokenizersEncoder(str(tok)), tok, tmp_path, long_doc_chars=10_000, piece_chars=1_000)
    (item,) = enc.run([Record(text, {"i": 1}, "test")])  # encoded whole, without cuts
    assert isinstance(item, Held) and len(item.parts) == 2  # its ids, then EOS
    assert np.array_equal(np.concatenate(item.parts), plain_encode(tok, [text]))


def test_a_word_longer_than_a_piece_is_kept_whole(tokenizer_path):
    text = "start " + "y" * 100_000 + " end"
    pre = byte_level_pre_tokenizer(str(tokenizer_path))
    cut = list(pieces([text], 10_000, pre))
    assert "".join(cut) == text
    assert any("y" * 100_000 in c for c in cut)


def test_long_document_spools_to_disk_and_matches_reference(tmp_path, docs, tokenizer_path):
    text = nasty_text(docs, 7, 300_000)
    enc = DocumentEncoder(
        TokenizersEncoder(str(tokenizer_path)),
        eos_id=0,
        dtype=np.dtype("<u2"),
        spool_path=tmp_path / "spool.tmp",
        pre_tokenizer=lambda: byte_level_pre_tokenizer(str(tokenizer_path)),
        long_doc_chars=50_000,
        piece_chars=8_000,
        spool_tokens=10_000,
    )
    (item,) = enc.run([Record(text, {"i": 1}, "test")])
    assert isinstance(item, Spooled)
    assert np.array_equal(np.fromfile(item.path, dtype="<u2"), plain_encode(tokenizer_path, [text]))


def test_long_document_through_fastokens_spools_the_reference_ids(tmp_path, docs, gpt2_tokenizer_path):

    text = nasty_text(docs, 8, 400_000)
    enc = gpt2_fastokens_long_encoder(gpt2_tokenizer_path, tmp_path, spool_tokens=10_000, batch_chars=50_000)
    items = list(enc.run([Record(text, {"i": 1}, "test")], commit_points=True))
    assert isinstance(items[-1], Spooled) and len(items) > 3  # commit points inside the document
    assert np.array_equal(np.fromfile(items[-1].path, dtype="<u2"), plain_encode(gpt2_tokenizer_path, [text]))


def test_the_pre_tokenizer_is_loaded_only_when_a_long_document_comes(tmp_path, docs, tokenizer_path):
    loads = []

    def load():
        loads.append(1)
        return byte_level_pre_tokenizer(str(tokenizer_path))

    enc = DocumentEncoder(
        TokenizersEncoder(str(tokenizer_path)),
        eos_id=0,
        dtype=np.dtype("<u2"),
        spool_path=tmp_path / "spool.tmp",
        pre_tokenizer=load,
        long_doc_chars=50_000,
        piece_chars=8_000,
    )
    short = [Record(d, {"i": i}, "test") for i, d in enumerate(docs[:50])]
    assert list(enc.run(short)) and loads == []
    long_text = nasty_text(docs, 5, 120_000)
    for _ in range(2):
        assert isinstance(list(enc.run([Record(long_text, {"i": 99}, "test")]))[-1], Held)  # held in memory
    assert loads == [1]


def test_big_txt_document_streams_through_prepare(tmp_path, docs, tokenizer_path, dask_client, monkeypatch):
    text = nasty_text(docs, 3, 2_500_000)
    path = tmp_path / "book.txt"
    path.write_text(text)
    small = tmp_path / "small.txt"
    small.write_text(docs[0])
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 100_000,
        "sources": {"books": {"type": "files", "paths": [str(path), str(small)]}},
    }
    out = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, [text, docs[0]]))


@pytest.mark.parametrize("dtype", ["<u2", "<u4"])
def test_the_tokens_held_before_spooling_are_bounded_in_bytes(tmp_path, tokenizer_path, dtype):
    enc = DocumentEncoder(
        TokenizersEncoder(str(tokenizer_path)),
        eos_id=0,
        dtype=np.dtype(dtype),
        spool_path=tmp_path / "spool.tmp",
        pre_tokenizer=lambda: byte_level_pre_tokenizer(str(tokenizer_path)),
    )
    assert enc.spool_tokens * np.dtype(dtype).itemsize == SPOOL_BYTES


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_a_long_json_line_read_in_pieces_encodes_to_the_reference_ids(
    tmp_path, docs, gpt2_tokenizer_path, monkeypatch, ensure_ascii
):
    """The JSON Lines reader hands a long line's text over in pieces (cut between escapes and
    characters, not at pre-token boundaries); the encoder's cuts make the ids the whole text's."""
    import json

    from pipeline.sources.files.access import file_size
    from pipeline.sources.files.pieces import Piece, partition_spec
    from pipeline.sources.files.readers import jsonl, long_json, read_partition
    from pipeline.sources.files.readers.long_json import TextPieces

    monkeypatch.setattr(jsonl, "LONG_LINE_BYTES", 100_000)
    monkeypatch.setattr(long_json, "CHUNK_BYTES", 7_777)
    monkeypatch.setattr(long_json, "JOIN_CHARS", 100_000)
    text = nasty_text(docs, 9, 300_000) + ' "quoted" \\ back\\slashes \x01 \u2028 😀'
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"id": 1, "text": text, "meta": {"text": "no"}}, ensure_ascii=ensure_ascii) + "\n", "utf-8"
    )
    piece = Piece(str(path), ".jsonl", file_size(str(path)))
    (rec,) = read_partition(partition_spec([piece]), piece.size, None, "text")
    assert isinstance(rec.text, TextPieces) and len(rec.text) > 10 and "".join(rec.text) == text
    enc = gpt2_fastokens_long_encoder(gpt2_tokenizer_path, tmp_path)
    (item,) = enc.run([rec])
    assert isinstance(item, Held)
    assert np.array_equal(np.concatenate(item.parts), plain_encode(gpt2_tokenizer_path, [text]))


@pytest.mark.parametrize("stop_after", [1, 3])
def test_a_long_document_resumed_from_a_commit_point_keeps_its_bos_once(
    tmp_path, docs, gpt2_tokenizer_path, stop_after
):
    """The BOS is the first token of the spool, so a commit point inside the document counts it
    and a resume from there neither writes it again nor loses it."""
    text = nasty_text(docs, 9, 200_000)
    want = [50255, *plain_encode(gpt2_tokenizer_path, [text]).tolist()]

    def encoder():
        return gpt2_fastokens_long_encoder(gpt2_tokenizer_path, tmp_path, spool_tokens=5_000, bos_id=50255)

    record = Record(text, {"i": 1}, "test")
    first = encoder()
    points = []
    for item in first.run([record], commit_points=True):
        if isinstance(item, LongProgress):
            first.sync_spool()
            points.append(item)
            if len(points) == stop_after:
                break  # the worker is killed here, after its commit
    (item,) = [i for i in encoder().run([record], resume=points[-1]) if not isinstance(i, LongProgress)]
    assert isinstance(item, Spooled)
    assert np.fromfile(item.path, dtype="<u2").tolist() == want
