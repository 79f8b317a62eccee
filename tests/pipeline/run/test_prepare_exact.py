"""The foundation's promise: shards concatenate to exactly the plain tokenizer's stream."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import EOS, cli, plain_encode, run_prepare, stream_of, validate_manifest, write_jsonl

from pipeline.format import manifest
from pipeline.format.shard_reader import Shard


def files_recipe(tokenizer_path, paths, **extra) -> dict:
    source = {"type": "files", "paths": [str(p) for p in paths], **extra.pop("source", {})}
    return {"tokenizer": str(tokenizer_path), "sources": {"data": source}, **extra}


@pytest.mark.parametrize(
    ("partition_bytes", "shard_tokens"),
    [(1 << 26, 1 << 27), (40_000, 5_000), (4096, 600)],
    ids=["one-partition", "many-partitions", "tiny-shards"],
)
def test_concatenated_shards_equal_reference(
    tmp_path, docs, tokenizer_path, dask_client, partition_bytes, shard_tokens
):
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    recipe = files_recipe(
        tokenizer_path, [data], shard_tokens=shard_tokens, source={"partition_bytes": partition_bytes}
    )
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, docs))
    m = manifest.load(path)
    assert all(s.tokens <= shard_tokens or s.documents == 1 for s in m.shards)


def test_one_worker_cli_run_equals_two_worker_run(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    two = run_prepare(
        files_recipe(tokenizer_path, [data], source={"partition_bytes": 50_000}),
        tmp_path / "two",
        dask_client,
    )
    proc = cli(
        "prepare",
        "--input",
        str(data),
        "--tokenizer",
        str(tokenizer_path),
        "--out",
        str(tmp_path / "one"),
        "--workers",
        "1",
        "--dashboard",
        "--partition-bytes",
        "50000",
        check=True,
    )
    assert "dashboard http" in proc.stderr
    one = tmp_path / "one" / "manifest.json"
    validate_manifest(one)
    a, b = manifest.load(one), manifest.load(two)
    assert [s.rel_path for s in a.shards] == [s.rel_path for s in b.shards]
    for sa, sb in zip(a.shards, b.shards, strict=True):
        assert sa.bin_path.read_bytes() == sb.bin_path.read_bytes()
        assert sa.idx_path.read_bytes() == sb.idx_path.read_bytes()
    strip = lambda d: {k: v for k, v in d.items() if k not in ("created", "checksum")}  # noqa: E731
    assert strip(a.data) == strip(b.data) or _same_but_paths(a.data, b.data)


def _same_but_paths(a: dict, b: dict) -> bool:
    """Manifests of two folders differ only where they name the input (same file here)."""
    return json.dumps(a["shards"]) == json.dumps(b["shards"]) and a["totals"] == b["totals"]


def test_rerun_from_scratch_is_byte_identical(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    recipe = files_recipe(tokenizer_path, [data], shard_tokens=20_000, source={"partition_bytes": 30_000})
    first = manifest.load(run_prepare(recipe, tmp_path / "a", dask_client))
    second = manifest.load(run_prepare(recipe, tmp_path / "b", dask_client))
    for sa, sb in zip(first.shards, second.shards, strict=True):
        assert sa.bin_path.read_bytes() == sb.bin_path.read_bytes()
    strip = lambda d: {k: v for k, v in d.items() if k not in ("created", "checksum")}  # noqa: E731
    assert strip(first.data) == strip(second.data)


def write_parquet(path, docs, row_group_size):
    pq.write_table(
        pa.table({"text": docs, "id": list(range(len(docs)))}), path, row_group_size=row_group_size
    )
    return path


@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst", "parquet", "txt"])
def test_every_file_format_gives_the_reference(tmp_path, docs, tokenizer_path, dask_client, fmt):
    subset = docs[:40]
    if fmt == "jsonl.gz":
        paths = [tmp_path / "in.jsonl.gz"]
        with gzip.open(paths[0], "wt") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in subset)
    elif fmt == "jsonl.zst":
        paths = [tmp_path / "in.jsonl.zst"]
        blob = "".join(json.dumps({"text": d}) + "\n" for d in subset).encode()
        paths[0].write_bytes(zstandard.ZstdCompressor().compress(blob))
    elif fmt == "parquet":
        paths = [write_parquet(tmp_path / "in.parquet", subset, row_group_size=7)]
    else:
        paths = []
        for i, d in enumerate(subset):
            paths.append(tmp_path / f"doc{i:03d}.txt")
            paths[-1].write_text(d)
    recipe = files_recipe(tokenizer_path, paths, source={"partition_bytes": 8192})
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, subset))


def test_one_big_file_spreads_over_several_partitions(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "big.jsonl", docs)
    parquet = write_parquet(tmp_path / "big.parquet", docs, row_group_size=10)
    for p in (data, parquet):
        path = run_prepare(
            files_recipe(tokenizer_path, [p], source={"partition_bytes": 60_000}),
            tmp_path / f"out{p.suffix}",
            dask_client,
        )
        splits = manifest.load(path).data["sources"]["data"]["splits"]["train"]
        assert splits["partitions"] >= 5
        assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, docs))


def test_partitions_that_start_inside_lines_longer_than_a_scan_read_each_document_once(
    tmp_path, docs, tokenizer_path, dask_client
):
    long_one = "\n\n".join(docs[:40])  # JSON-escaped: far over the 256 KiB scan buffer
    texts = [docs[50], long_one, docs[51], docs[52], long_one[::-1], docs[53]]
    data = write_jsonl(tmp_path / "long-lines.jsonl", texts)
    path = run_prepare(
        files_recipe(tokenizer_path, [data], source={"partition_bytes": 70_000}),
        tmp_path / "out",
        dask_client,
    )
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, texts))


@pytest.mark.parametrize(
    ("content", "offset", "after"),
    [
        (b"ab\ncd\n", 0, 3),  # mid-line: past its newline
        (b"ab\ncd\n", 2, 3),  # on the newline itself
        (b"ab\ncd\n", 3, 6),  # on the second line's first byte: past its newline
        (b"ab\ncd", 3, 5),  # no newline to the end
        (b"x" * 700_000 + b"\ny\n", 5, 700_001),  # beyond several reads of the buffer
    ],
)
def test_the_next_line_start_is_found_without_reading_the_line(tmp_path, content, offset, after):
    from pipeline.sources.files.readers.jsonl import after_newline

    (tmp_path / "f").write_bytes(content)
    with open(tmp_path / "f", "rb") as f:
        assert after_newline(f, offset) == after


@pytest.mark.parametrize("head", [16, 1 << 20])
def test_lines_longer_than_the_first_read_come_back_whole_and_in_order(tmp_path, head):
    from pipeline.sources.files.readers.jsonl import read_line_at

    lines = [b"a\n", b"b" * 2_500_000 + b"\n", b"\n", b"c" * 40 + b"\n", b"d" * 17]  # the last unended
    (tmp_path / "f").write_bytes(b"".join(lines))
    got, pos = [], 0
    with open(tmp_path / "f", "rb") as f:
        while line := read_line_at(f, pos, head):
            got.append(line)
            pos += len(line)
    assert got == lines


def test_special_token_text_inside_a_document_is_ordinary_text(tmp_path, tokenizer_path, dask_client):
    docs = [f"a web page quoting {EOS} in its text", f"{EOS}", "plain"]
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    path = run_prepare(files_recipe(tokenizer_path, [data]), tmp_path / "out", dask_client)
    m = manifest.load(path)
    shard = Shard(m.shards[0].bin_path)
    for i in range(len(shard)):
        doc = shard.document(i)
        assert doc[-1] == m.eos_id
        assert m.eos_id not in doc[:-1].tolist()
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, docs))


def test_empty_and_whitespace_documents_are_dropped_and_counted(tmp_path, tokenizer_path, dask_client):
    docs = ["first", "", "   \n\t ", "second"]
    data = write_jsonl(tmp_path / "in.jsonl", docs)
    path = run_prepare(files_recipe(tokenizer_path, [data]), tmp_path / "out", dask_client)
    stats = manifest.load(path).data["sources"]["data"]["splits"]["train"]
    assert stats["documents"] == 2
    assert stats["dropped_empty"] == 2
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, ["first", "second"]))


def test_splits_of_a_files_source_get_their_own_shards(tmp_path, docs, tokenizer_path, dask_client):
    train = write_jsonl(tmp_path / "train.jsonl", docs[:30])
    val = write_jsonl(tmp_path / "val.jsonl", docs[30:40])
    recipe = files_recipe(tokenizer_path, [], source={})
    recipe["sources"]["data"] = {"type": "files", "splits": {"train": [str(train)], "validation": [str(val)]}}
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    assert np.array_equal(stream_of(path, "data", "train"), plain_encode(tokenizer_path, docs[:30]))
    assert np.array_equal(stream_of(path, "data", "validation"), plain_encode(tokenizer_path, docs[30:40]))
    assert manifest.load(path).splits("data") == ["train", "validation"]


def test_manifest_paths_are_relative_so_the_folder_can_move(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:10])
    path = run_prepare(files_recipe(tokenizer_path, [data]), tmp_path / "out", dask_client)
    moved = tmp_path / "elsewhere"
    (tmp_path / "out").rename(moved)
    assert np.array_equal(stream_of(moved / "manifest.json"), plain_encode(tokenizer_path, docs[:10]))
    assert (moved / "tokenizer.json").is_file()
    assert not path.exists()


def test_auto_partitions_follow_the_input_size_not_the_workers(tmp_path, docs, tokenizer_path):
    from pipeline.sources.files import FilesSource
    from pipeline.sources.files.planning import AUTO_FEW

    data = write_jsonl(tmp_path / "in.jsonl", docs * 30)  # about 20 MB: a small split
    cfg = FilesSource.normalize("d", {"paths": [str(data)]}, "test")
    assert cfg["partition_bytes"] == "auto"
    parts = FilesSource("d", cfg).partitions()
    assert len(parts) == AUTO_FEW  # spread over a few workers, however many there are
    assert [p.key for p in parts] == [p.key for p in FilesSource("d", cfg).partitions()]


@pytest.mark.parametrize(
    ("size", "step"),
    [
        (3 << 20, 1 << 20),
        (40 << 20, 5 << 20),
        (100 << 20, 8 << 20),
        (600 << 20, 8 << 20),
        (8 << 30, 32 << 20),
        (40 << 30, 64 << 20),
    ],
)
def test_auto_partition_size_grows_with_the_split_within_bounds(tmp_path, size, step):
    from pipeline.sources.files import FilesSource

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:  # sparse: only its size is read
        f.truncate(size)
    source = FilesSource("d", FilesSource.normalize("d", {"paths": [str(big)]}, "test"))
    assert source.partition_bytes(sum(f.size for f in source.files("train"))) == step
