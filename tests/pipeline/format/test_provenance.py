"""Provenance sidecars: one entry per document of the .idx, resumable byte for byte, verified."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.format import provenance
from pipeline.format.errors import TokshardError
from pipeline.format.provenance import Input, Origin, OriginColumns, sidecar_path
from pipeline.format.shard_reader import read_index
from pipeline.format.shard_writer import ShardSequence

EOS = 0
SHARD = 12


JSONL, PARQUET = Input("data/a.jsonl", "offset"), Input("s3://b/c.parquet", "row")


def docs(first: int, last: int) -> tuple[np.ndarray, np.ndarray, OriginColumns]:
    """Documents first..last-1 (three tokens and EOS each), from two inputs by turns."""
    tokens = np.array([t for i in range(first, last) for t in (i, i, i, EOS)], dtype=np.uint16)
    numbers = range(first, last)
    origins = OriginColumns(
        [JSONL if i % 3 else PARQUET for i in numbers], [100 * i if i % 3 else i for i in numbers]
    )
    return tokens, np.full(last - first, 4, dtype=np.int32), origins


def as_origins(columns: OriginColumns) -> list[Origin]:
    return [Origin(*inp, at) for inp, at in zip(columns.inputs, columns.places, strict=True)]


def folder_files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_each_document_of_the_index_has_its_origin_in_order(tmp_path):
    seq = ShardSequence(tmp_path, "p", "uint16", SHARD)
    tokens, lengths, places = docs(1, 8)
    seq.add(tokens, lengths, places)
    records = seq.finish()
    found = []
    for rec in records:
        side = provenance.read(sidecar_path(tmp_path / rec.path))
        assert len(side) == read_index((tmp_path / rec.path).with_suffix(".idx")).documents
        assert rec.origin_bytes == sidecar_path(tmp_path / rec.path).stat().st_size
        found += [side[d] for d in range(len(side))]
    assert found == as_origins(places)


def test_a_kill_between_commits_and_a_rerun_give_byte_identical_sidecars(tmp_path):
    seq = ShardSequence(tmp_path / "a", "p", "uint16", SHARD)
    seq.add(*docs(1, 5))
    committed = seq.commit()  # shard 0 sealed (3 documents), shard 1 open with 1
    closed = list(seq.closed)
    seq.add(*docs(5, 9))  # written after the commit ...
    seq.current.abandon()  # ... and lost to a kill
    again = ShardSequence(tmp_path / "a", "p", "uint16", SHARD, closed=closed, open_shard=committed)
    again.add(*docs(5, 20))
    resumed = again.finish()
    whole = ShardSequence(tmp_path / "b", "p", "uint16", SHARD)
    whole.add(*docs(1, 20))
    assert resumed == whole.finish()
    assert folder_files(tmp_path / "a") == folder_files(tmp_path / "b")
    assert any(name.endswith(".origin") for name in folder_files(tmp_path / "a"))


def test_a_sidecar_costs_a_few_bytes_per_document(tmp_path):
    n = 10_000
    tokens = np.tile(np.array([7, 8, EOS], np.uint16), n)
    part = Input("/data/corpus/part-00001.jsonl", "offset")
    origins = OriginColumns([part] * n, [517 * i for i in range(n)])
    seq = ShardSequence(tmp_path, "p", "uint16", 1 << 20)
    seq.add(tokens, np.full(n, 3, np.int32), origins)
    (rec,) = seq.finish()
    assert rec.origin_bytes < 1 * n


def test_a_document_from_each_of_many_small_files_still_costs_a_few_bytes(tmp_path):
    """The inputs table is compressed: thousands of files of one folder, a document each."""
    n = 10_000
    tokens = np.tile(np.array([7, 8, EOS], np.uint16), n)
    files = [Input(f"/data/news/2024-06-{i % 30:02d}/article-{i:06d}.jsonl", "line") for i in range(n)]
    seq = ShardSequence(tmp_path, "p", "uint16", 1 << 20)
    seq.add(tokens, np.full(n, 3, np.int32), OriginColumns(files, [1] * n))
    (rec,) = seq.finish()
    assert rec.origin_bytes < 12 * n  # the names alone are 41 bytes each
    assert provenance.read(sidecar_path(tmp_path / rec.path))[n - 1] == Origin(*files[-1], 1)


def test_a_version_1_sidecar_with_its_table_uncompressed_still_reads(tmp_path):
    """Sidecars written before the table was compressed keep their meaning."""
    origins = provenance.Origins([tuple(JSONL), tuple(PARQUET)], np.array([0, 1, 0]), np.array([5, 0, 90]))
    raw = provenance.encode(origins)
    _, _, size = provenance.HEADER.unpack_from(raw)
    table = zlib.decompress(raw[provenance.HEADER.size : provenance.HEADER.size + size])
    body = raw[provenance.HEADER.size + size :]
    old = provenance.HEADER.pack(provenance.MAGIC, 1, len(table)) + table + body
    assert [provenance.decode(old)[d] for d in range(3)] == [
        Origin(*JSONL, 5),
        Origin(*PARQUET, 0),
        Origin(*JSONL, 90),
    ]


def test_damage_is_named_not_misread(tmp_path):
    seq = ShardSequence(tmp_path, "p", "uint16", 1000)
    seq.add(*docs(1, 4))
    (rec,) = seq.finish()
    path = sidecar_path(tmp_path / rec.path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-3])
    try:
        provenance.read(path)
    except provenance.ProvenanceError as exc:
        assert str(path) in str(exc) and "damaged" in str(exc)
    else:
        raise AssertionError("a truncated sidecar was read")


def test_an_open_shard_begun_without_provenance_is_refused_not_given_unknown_places(tmp_path):
    seq = ShardSequence(tmp_path, "p", "uint16", 1000)
    seq.add(*docs(1, 4))
    committed = seq.commit()
    seq.current.abandon()
    for log in (provenance.LOG_SUFFIX, provenance.INPUTS_SUFFIX):  # an older tokshard wrote none
        (tmp_path / f"p-0000{log}").unlink()
    with pytest.raises(TokshardError) as refused:
        ShardSequence(tmp_path, "p", "uint16", 1000, open_shard=committed)
    line = str(refused.value)
    assert "p-0000.orig.tmp" in line and "no provenance" in line and "OUT/.tokshard/parts" in line
    assert "\n" not in line


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a.jsonl", "s3://b/ü.parquet", "c.txt"]),
            st.sampled_from(provenance.UNITS),
            st.integers(0, 2**40),
        ),
        max_size=200,
    )
)
def test_any_origins_read_back_as_written(entries):
    inputs = sorted({(name, unit) for name, unit, _ in entries})
    origins = provenance.Origins(
        inputs,
        np.array([inputs.index((n, u)) for n, u, _ in entries], np.int64),
        np.array([p for _, _, p in entries], np.int64),
    )
    back = provenance.decode(provenance.encode(origins))
    assert [back[d] for d in range(len(back))] == [Origin(*e) for e in entries]
