"""The shard pair: what the writer produces is what the reader (and Megatron) reads."""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import pytest

from pipeline.format.content_hash import file_hash
from pipeline.format.errors import TokshardError
from pipeline.format.shard_reader import Shard, read_index
from pipeline.format.shard_writer import OpenShard, ShardSequence, ShardWriter, finalize, shard_problem

EOS = 0


def docs_to_stream(docs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.array([t for d in docs for t in [*d, EOS]], dtype=np.uint16)
    return tokens, np.array([len(d) + 1 for d in docs], dtype=np.int32)


def test_closed_shard_reads_back_document_by_document(tmp_path):
    docs = [[5, 6, 7], [65535], [1, 2, 3, 4, 5]]
    w = ShardWriter(tmp_path, "a/s-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream(docs))
    rec = w.close()
    shard = Shard(tmp_path / rec.path)
    assert len(shard) == 3
    assert [shard.document(i).tolist() for i in range(3)] == [[*d, EOS] for d in docs]
    assert np.memmap(tmp_path / rec.path, dtype=np.uint16).tolist() == shard.tokens.tolist()
    assert rec.hash == file_hash(tmp_path / rec.path)
    assert shard.problems(eos_id=EOS) == []
    assert not list(tmp_path.rglob("*.tmp"))


def test_index_has_megatron_layout_byte_for_byte(tmp_path):
    w = ShardWriter(tmp_path, "s-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream([[1, 2], [3]]))
    w.close()
    raw = (tmp_path / "s-0000.idx").read_bytes()
    expected = (
        b"MMIDIDX\x00\x00"
        + (1).to_bytes(8, "little")
        + bytes([8])
        + (2).to_bytes(8, "little")
        + (3).to_bytes(8, "little")
        + np.array([3, 2], "<i4").tobytes()
        + np.array([0, 6], "<i8").tobytes()
        + np.array([0, 1, 2], "<i8").tobytes()
    )
    assert raw == expected
    assert read_index(tmp_path / "s-0000.idx").lengths.tolist() == [3, 2]


def test_megatron_core_indexed_dataset_reads_our_shards(tmp_path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    docs = [[10, 11, 12], [13], list(range(100, 400))]
    w = ShardWriter(tmp_path, "m-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream(docs))
    w.close()
    ds = indexed.IndexedDataset(str(tmp_path / "m-0000"), mmap=True)
    assert len(ds) == 3
    assert [ds[i].tolist() for i in range(3)] == [[*d, EOS] for d in docs]
    assert ds[0].dtype == np.uint16


def test_sequence_rotates_without_splitting_a_document(tmp_path):
    docs = [[1] * 4, [2] * 4, [3] * 20, [4] * 2]
    seq = ShardSequence(tmp_path, "src/train/00000", "uint16", shard_tokens=10)
    seq.add(*docs_to_stream(docs))
    records = seq.finish()
    # 5+5 fit in 10; the 21-token document gets a shard of its own; then the last one
    assert [r.tokens for r in records] == [10, 21, 3]
    assert [r.path for r in records] == [f"src/train/00000-{i:04d}.bin" for i in range(3)]


@pytest.mark.parametrize("how", ["parts", "spooled"])
def test_a_document_in_pieces_or_a_spool_file_is_written_as_the_same_document_whole(tmp_path, how):
    docs = [[1] * 4, [2] * 4, list(range(100, 120)), [4] * 2]
    whole = ShardSequence(tmp_path / "whole", "s/t/0", "uint16", shard_tokens=10)
    whole.add(*docs_to_stream(docs))
    pieces = ShardSequence(tmp_path / how, "s/t/0", "uint16", shard_tokens=10)
    pieces.add(*docs_to_stream(docs[:2]))
    big = np.array([*docs[2], EOS], np.uint16)
    if how == "parts":
        pieces.add_parts([big[:7], big[7:19], big[19:]])
    else:
        (tmp_path / "spool").write_bytes(big.tobytes())
        pieces.add_spooled(tmp_path / "spool", len(big))
    pieces.add(*docs_to_stream(docs[3:]))
    assert [(r.tokens, r.documents, r.hash, r.idx_hash) for r in pieces.finish()] == [
        (r.tokens, r.documents, r.hash, r.idx_hash) for r in whole.finish()
    ]


def test_resume_from_commit_truncates_uncommitted_tokens(tmp_path):
    seq = ShardSequence(tmp_path, "p", "uint16", shard_tokens=1000)
    seq.add(*docs_to_stream([[1, 2, 3]]))
    committed = seq.commit()
    seq.add(*docs_to_stream([[9, 9, 9, 9]]))  # written but never committed: a crash
    seq.current.abandon()
    again = ShardSequence(tmp_path, "p", "uint16", 1000, closed=seq.closed, open_shard=committed)
    again.add(*docs_to_stream([[4, 5]]))
    (rec,) = again.finish()
    assert Shard(tmp_path / rec.path).tokens.tolist() == [1, 2, 3, EOS, 4, 5, EOS]
    assert rec.hash == file_hash(tmp_path / rec.path)


def test_problems_names_a_truncated_bin(tmp_path):
    w = ShardWriter(tmp_path, "t-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream([[1, 2, 3], [4]]))
    w.close()
    with open(tmp_path / "t-0000.bin", "r+b") as f:
        f.truncate(4)
    (problem,) = Shard(tmp_path / "t-0000.bin").problems(EOS)
    assert "t-0000.bin" in problem and "4 bytes" in problem


def test_a_shard_given_its_final_names_while_it_is_checked_is_not_called_missing(tmp_path, monkeypatch):
    """`tokshard status` checks the shards of a folder a live run is writing: one renamed to its
    final names between two looks is found under them (a clean run met a traceback here)."""
    seq = ShardSequence(tmp_path, "p", "uint16", shard_tokens=1000)
    seq.add(*docs_to_stream([[1, 2, 3], [4, 5]]))
    (rec,) = seq.finish(finalize=False)  # sealed, still under its temporary names
    real_stat = os.stat

    def renamed_just_before(path, *args, **kwargs):
        if str(path).endswith(".tmp"):
            finalize(tmp_path, [rec])  # the run's worker gives the final names now
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", renamed_just_before)
    assert shard_problem(tmp_path, rec) is None
    assert (tmp_path / rec.path).is_file()


def test_a_bin_takes_its_final_name_after_everything_else_of_its_shard(tmp_path, monkeypatch):
    """A kill inside `finalize` leaves either the .bin under its temporary name (a rerun
    finishes the shard) or nothing of the shard to clean up: a rerun that finds every .bin of a
    finished partition does not look for the open shard's logs (one run left an .inputs.tmp)."""
    seq = ShardSequence(tmp_path, "p", "uint16", shard_tokens=1000)
    seq.add(*docs_to_stream([[1, 2, 3], [4, 5]]))
    (rec,) = seq.finish(finalize=False)
    steps: list[str] = []
    real_replace, real_unlink = os.replace, os.unlink
    monkeypatch.setattr(os, "replace", lambda a, b: (steps.append(f"name {b}"), real_replace(a, b))[1])
    monkeypatch.setattr(os, "unlink", lambda p, **k: (steps.append(f"delete {p}"), real_unlink(p, **k))[1])
    finalize(tmp_path, [rec])
    assert steps[-1] == f"name {tmp_path / rec.path}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-0000.bin", "p-0000.idx", "p-0000.origin"]


def _mmap_fails(monkeypatch, code: int) -> None:
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(mmap, "mmap", refuse)  # what numpy.memmap calls


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (errno.ENODEV, r"this filesystem cannot memory-map files \(No such device\).* copy the folder"),
        (errno.ENOMEM, r"cannot memory-map another shard: .*vm\.max_map_count.*--shard-tokens"),
    ],
)
def test_a_shard_the_machine_cannot_map_is_one_line_saying_why(tmp_path, monkeypatch, code, said):
    """Some FUSE mounts cannot memory-map at all; a process at the kernel's limit of maps cannot
    map one more: neither is the data's fault, and neither is said as if it were."""
    w = ShardWriter(tmp_path, "a/s-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream([[5, 6, 7]]))
    shard = Shard(tmp_path / w.close().path)
    _mmap_fails(monkeypatch, code)
    with pytest.raises(TokshardError, match=said) as refused:
        shard.document(0)
    assert str(shard.bin_path) in str(refused.value)


def test_a_shard_that_fails_to_map_for_another_reason_keeps_its_error(tmp_path, monkeypatch):
    w = ShardWriter(tmp_path, "a/s-0000.bin", "uint16", OpenShard(0))
    w.append(*docs_to_stream([[5, 6, 7]]))
    shard = Shard(tmp_path / w.close().path)
    _mmap_fails(monkeypatch, errno.EIO)
    with pytest.raises(OSError, match="Input/output error"):
        shard.document(0)
