"""Windows over memory-mapped shards, and the manifest guards that run before training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from support import SCHEMA, cached_manifest

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError, TokshardError
from pipeline.format.shard_reader import Shard
from pipeline.format.shard_writer import ShardSequence
from trainer.data import ModelLimits, TokenStream, WindowDataset, check_manifest

TINY = ModelLimits("tiny", 2048, 1024)


@pytest.fixture(scope="module")
def manifest_path(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


@pytest.fixture
def manifest_copy(manifest_path, tmp_path) -> Path:
    shutil.copytree(manifest_path.parent, tmp_path / "m")
    return tmp_path / "m" / "manifest.json"


def test_helper_manifest_follows_the_schema_and_has_real_text(manifest_path):
    data = json.loads(manifest_path.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    m = manifest_mod.load(manifest_path)
    assert m.sources() == ["stdlib", "asyncio"]
    assert set(m.splits()) == {"train", "validation"}
    assert len(m.select("stdlib", "train")) > 2  # several shards, so windows cross boundaries
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(m.tokenizer_path))
    first = Shard(m.select("stdlib", "train")[0].bin_path).document(0)
    assert first[-1] == m.eos_id
    assert "email" in tok.decode(first[:-1].tolist())


def test_stream_reads_equal_the_concatenated_shards(manifest_path):
    m = manifest_mod.load(manifest_path)
    entries = m.select("stdlib", "train")
    whole = np.concatenate([np.fromfile(e.bin_path, dtype=np.uint16) for e in entries]).astype(np.int64)
    stream = TokenStream("stdlib", "train", entries, m.dtype)
    assert stream.tokens == len(whole)
    boundary = entries[0].tokens
    for start, n in [(0, 10), (boundary - 5, 11), (boundary, 3), (len(whole) - 7, 7), (123, 5000)]:
        assert stream.read(start, n).tolist() == whole[start : start + n].tolist()


def test_windows_overlap_by_one_token_and_cover_the_stream(manifest_path):
    m = manifest_mod.load(manifest_path)
    ds = WindowDataset(m, "train", seq_len=64)
    s = ds.sources.index("asyncio")
    stream = ds.streams[s]
    assert ds.windows[s] == (stream.tokens - 1) // 64
    last = ds.windows[s] - 1
    batch = ds.batch(np.array([s, s, s]), np.array([0, 1, last]))
    assert batch.shape == (3, 65)
    assert batch[0, -1] == batch[1, 0]  # window i's last target is window i+1's first input
    assert batch[2].tolist() == stream.read(last * 64, 65).tolist()


def test_opening_reads_no_tokens(manifest_path):
    m = manifest_mod.load(manifest_path)
    ds = WindowDataset(m, "train", seq_len=64)
    assert all(not s._arrays for s in ds.streams)  # no memory map opened yet
    ds.batch(np.array([0]), np.array([0]))
    assert len(ds.streams[0]._arrays) == 1


def test_a_consistent_manifest_passes_the_guards(manifest_path):
    check_manifest(manifest_mod.load(manifest_path), TINY, seq_len=64, verify=True)


def test_vocabulary_larger_than_the_embedding_is_refused(manifest_path):
    m = manifest_mod.load(manifest_path)
    with pytest.raises(
        TokshardError, match=r"1024 ids but model tiny embeds only 512; pass --vocab-size 1024"
    ):
        check_manifest(m, ModelLimits("tiny", 512, 1024), seq_len=64)


def test_sequence_longer_than_the_model_positions_is_refused(manifest_path):
    with pytest.raises(TokshardError, match="exceeds model tiny's 1024 positions"):
        check_manifest(manifest_mod.load(manifest_path), TINY, seq_len=2048)


def test_truncated_shard_is_refused_by_size(manifest_copy):
    m = manifest_mod.load(manifest_copy)
    victim = m.select("asyncio", "train")[1].bin_path
    with open(victim, "r+b") as f:
        f.truncate(100)
    with pytest.raises(TokshardError, match=rf"{victim.name}: 100 bytes on disk, the manifest says"):
        check_manifest(manifest_mod.load(manifest_copy), TINY, seq_len=64)


def test_a_shard_deleted_or_cut_after_the_start_is_one_line_when_first_read(manifest_copy):
    """Shards open on first use, after the start's checks: a shard deleted since was a
    FileNotFoundError traceback from inside the training loop."""
    m = manifest_mod.load(manifest_copy)
    entries = m.select("stdlib", "train")
    stream = TokenStream("stdlib", "train", entries, m.dtype)
    gone, cut = entries[1].bin_path, entries[2].bin_path
    gone.unlink()
    with open(cut, "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError, match=rf"{gone}: the shard is gone since the run started .*restore it"):
        stream.read(entries[0].tokens, 3)
    with pytest.raises(DataError, match=rf"{cut}: the shard changed size \(50 tokens, the manifest says"):
        stream.read(entries[0].tokens + entries[1].tokens, 3)


def test_shards_of_another_dtype_are_refused(tmp_path):
    """Shards written as uint32 under a manifest that says uint16 (mixed-up runs)."""
    tokens = np.arange(1, 301, dtype=np.int64)
    tokens[99::100] = 0
    seq = ShardSequence(tmp_path, "src/train/00000", "uint32", shard_tokens=1000)
    seq.add(tokens, np.array([100, 100, 100], dtype=np.int32))
    (rec,) = seq.finish()
    entry = {**rec.to_json(), "bytes": rec.tokens * 2, "source": "src", "split": "train"}
    doc = manifest_mod.build(
        recipe={"sources": {}},
        recipe_hash="sha256:" + "0" * 64,
        dtype="uint16",
        tokenizer={"path": "tokenizer.json", "sha256": "0" * 64, "vocab_size": 400, "eos_id": 0,
                   "eos_token": "<|endoftext|>", "origin": "test"},
        encoder={"name": "tokenizers", "reason": "test"},
        sources={"src": {"type": "files", "origin": {}, "splits": {}}},
        shards=[entry],
    )  # fmt: skip
    path = manifest_mod.write(tmp_path, doc)
    with pytest.raises(TokshardError, match="holds uint32 tokens but the manifest says uint16"):
        check_manifest(manifest_mod.load(path), TINY, seq_len=8)


def test_verify_catches_a_changed_byte_that_keeps_the_size(manifest_copy):
    m = manifest_mod.load(manifest_copy)
    victim = m.select("stdlib", "validation")[0].bin_path
    raw = bytearray(victim.read_bytes())
    raw[10] ^= 0xFF
    victim.write_bytes(bytes(raw))
    check_manifest(manifest_mod.load(manifest_copy), TINY, seq_len=64)  # stat-only: same size
    with pytest.raises(TokshardError, match="content hash"):
        check_manifest(manifest_mod.load(manifest_copy), TINY, seq_len=64, verify=True)


def test_source_shorter_than_one_window_is_refused(manifest_path):
    with pytest.raises(TokshardError, match="fewer than one window"):
        WindowDataset(manifest_mod.load(manifest_path), "validation", seq_len=100_000)
