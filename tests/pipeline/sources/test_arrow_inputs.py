"""Arrow IPC inputs as `datasets` writes them: a ``save_to_disk`` folder of
``data-0000K-of-0000N.arrow`` files (the stream format) beside its own .json records, a
DatasetDict's split folders, and Feather v2 files; each made by its own library."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from support import cli, one_error_line, plain_encode, run_prepare, stream_of

from pipeline.format import manifest
from pipeline.format.errors import DataError, TokshardError
from pipeline.sources.files import iter_texts
from pipeline.sources.files.formats import kind_of
from pipeline.sources.files.pieces import Piece, partition_spec
from pipeline.sources.files.readers import read_partition
from pipeline.sources.files.readers.arrow import ArrowReader
from pipeline.sources.files.readers.base import Place


@pytest.fixture
def saved(tmp_path, docs):
    """A `datasets` Dataset of 60 documents (an id column beside the text) saved in 3 shards."""
    rows = [{"id": i, "text": d} for i, d in enumerate(docs[:60])]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    return tmp_path / "ds", docs[:60]


def test_a_save_to_disk_folder_prepares_as_its_rows_would_as_json_lines(saved, tokenizer_path, tmp_path):
    folder, texts = saved
    assert sorted(p.name for p in folder.glob("*.arrow")) == [
        f"data-0000{i}-of-00003.arrow" for i in range(3)
    ]
    proc = cli("prepare", "--input", str(folder / "*.arrow"), "--tokenizer", str(tokenizer_path), "--out", "o",
               "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(stream_of(tmp_path / "o" / "manifest.json"), plain_encode(tokenizer_path, texts))
    m = manifest.load(tmp_path / "o" / "manifest.json")
    assert m.data["totals"]["documents"] == 60


def test_the_folder_itself_is_answered_with_its_arrow_glob(saved, tokenizer_path, tmp_path):
    """Its dataset_info.json and state.json are `datasets`' records, not JSON Lines."""
    proc = cli("prepare", "--input", "ds", "--tokenizer", str(tokenizer_path), "--out", "o", cwd=tmp_path)
    assert proc.returncode == 2 and "name the files in it, e.g. 'ds/*.arrow'" in one_error_line(proc)


def test_a_dataset_dict_folder_is_answered_with_its_splits(tmp_path, docs, tokenizer_path):
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": docs[:8]}),
            "test": datasets.Dataset.from_dict({"text": docs[8:10]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    proc = cli("prepare", "--input", "dd", "--tokenizer", str(tokenizer_path), "--out", "o", cwd=tmp_path)
    line = one_error_line(proc)
    assert proc.returncode == 2 and "dd holds the `datasets` splits train, test" in line
    assert 'splits = { train = ["dd/train/*.arrow"], test = ["dd/test/*.arrow"] }' in line
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {
            "d": {"type": "files", "splits": {s: [str(tmp_path / "dd" / s / "*.arrow")] for s in dd}}
        },
    }
    out = run_prepare(recipe, tmp_path / "out")
    for split, texts in (("train", docs[:8]), ("test", docs[8:10])):
        assert np.array_equal(stream_of(out, "d", split), plain_encode(tokenizer_path, texts))


def test_a_feather_file_and_a_stream_file_read_the_same(tmp_path, docs):
    table = pa.table({"text": docs[:20], "n": list(range(20))})
    feather.write_feather(table, tmp_path / "a.arrow", chunksize=7)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    assert list(iter_texts([str(tmp_path / "a.arrow")])) == docs[:20]
    assert list(iter_texts([str(tmp_path / "b.arrow")])) == docs[:20]


def test_a_resume_continues_at_the_row_after_the_cursor(saved):
    folder, _ = saved
    path = str(folder / "data-00001-of-00003.arrow")
    piece = Piece(path, kind_of(path), (folder / "data-00001-of-00003.arrow").stat().st_size)
    first = list(iter_texts([path]))
    records = list(ArrowReader("text").read(piece, Place(0, 0), {"row": 5}))
    assert [r.text for r in records] == first[5:]
    assert records[0].cursor == {"piece": 0, "row": 6}
    assert [
        r.text for r in read_partition(partition_spec([piece]), piece.size, {"piece": 0, "row": 5}, "text")
    ] == first[5:]


def test_a_missing_or_non_text_column_is_one_line_naming_the_columns(tmp_path, docs):
    feather.write_feather(pa.table({"content": docs[:3], "n": [1, 2, 3]}), tmp_path / "a.arrow")
    with pytest.raises(
        TokshardError,
        match=r"a\.arrow: no column 'text' \(columns: content, n\); name the text.s field with --text-field \(text_field in a recipe\)",
    ):
        list(iter_texts([str(tmp_path / "a.arrow")]))
    with pytest.raises(TokshardError, match=r"column 'n' is int64, not text"):
        list(iter_texts([str(tmp_path / "a.arrow")], field="n"))
    assert list(iter_texts([str(tmp_path / "a.arrow")], field="content")) == docs[:3]


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_a_cut_arrow_file_is_a_corrupt_file_not_fewer_documents(saved, keep):
    """A broken download: the stream ends inside a batch."""
    folder, _ = saved
    path = folder / "data-00000-of-00003.arrow"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DataError, match=r"data-00000-of-00003\.arrow: corrupt Arrow file"):
        list(iter_texts([str(path)]))


def test_a_file_named_arrow_that_is_not_arrow_is_named(tmp_path, docs, tokenizer_path):
    (tmp_path / "a.arrow").write_text(json.dumps({"text": docs[0]}) + "\n")
    proc = cli("prepare", "--input", "a.arrow", "--tokenizer", str(tokenizer_path), "--out", "o", "--workers", "1",
               cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1 and "a.arrow: corrupt Arrow file" in one_error_line(proc)


def test_arrow_files_in_a_bucket_read_as_the_local_ones(saved, s3_server):
    folder, texts = saved
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for p in sorted(folder.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"ds/{p.name}", Body=p.read_bytes())
    urls = [f"s3://{bucket}/ds/data-0000{i}-of-00003.arrow" for i in range(3)]
    assert list(iter_texts(urls)) == texts


@pytest.fixture(params=["stream", "file"])
def one_big_file(request, tmp_path, docs):
    """One Arrow file of 240 documents in batches of 8 rows, far larger than a task: a saved
    dataset's stream, or a Feather v2 file."""
    texts = [d for _ in range(4) for d in docs[:60]]
    table = pa.table({"text": texts})
    path = tmp_path / "big" / "data-00000-of-00001.arrow"
    path.parent.mkdir()
    if request.param == "file":
        feather.write_feather(table, path, chunksize=8, compression="uncompressed")
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=8)
    return path, texts


def test_a_large_arrow_file_spreads_over_tasks_by_its_batches_with_rows_in_the_file(
    one_big_file, tokenizer_path, tmp_path
):
    """A save_to_disk shard (up to 500 MB by default) is read by several workers, each from
    its run of record batches; the tokens are the file's, and each document's origin is its row."""
    from pipeline.format import provenance

    path, texts = one_big_file
    size = path.stat().st_size
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(path)], "partition_bytes": size // 5}},
    }
    out = run_prepare(recipe, tmp_path / "out")
    m = manifest.load(out)
    assert len(m.shards) >= 4  # a shard or more per task
    assert np.array_equal(stream_of(out), plain_encode(tokenizer_path, texts))
    rows = np.concatenate([provenance.read(s.bin_path.with_suffix(".origin")).place for s in m.shards])
    assert rows.tolist() == list(range(len(texts)))


def test_a_run_of_batches_resumes_at_the_row_after_its_cursor(one_big_file):
    path, texts = one_big_file
    piece = Piece(str(path), ".arrow", 1000, row_groups=(3, 4, 5))  # rows 24..47 of the file
    records = list(ArrowReader("text").read(piece, Place(0, 0), {"row": 10}))
    assert [r.text for r in records] == texts[34:48]
    assert records[0].cursor == {"piece": 0, "row": 11}
    assert [r.where for r in records[:1]] == [f"{path} row 35 of the file"]


def test_a_stream_with_dictionary_batches_is_one_task(tmp_path, docs):
    """Later batches of such a stream depend on its dictionary batches: it is not cut."""
    from pipeline.sources.files.planning import group_runs

    texts = pa.array([d for _ in range(3) for d in docs[:40]]).dictionary_encode()
    table = pa.table({"text": texts})
    path = tmp_path / "d.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=8)
    assert group_runs(str(path), ".arrow", 1000) is None
    assert list(iter_texts([str(path)])) == texts.to_pylist()


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_field_of_a_struct_column_is_named_as_nested_not_as_a_column_to_name(tmp_path, kind):
    """``--text-field meta.text`` over a ``meta`` struct column advised naming the field with
    --text-field, which the user had done."""
    table = pa.table({"meta": pa.array([{"text": "x"}]), "n": [1]})
    path = tmp_path / f"a.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        feather.write_feather(table, path)
    with pytest.raises(TokshardError) as refused:
        list(iter_texts([str(path)], field="meta.text"))
    assert str(refused.value) == (
        f"{path}: no column 'meta.text': nested fields are not read, --text-field names a top-level column "
        "('meta' here); flatten the table first (pyarrow's Table.flatten() makes 'meta.text' a column of its "
        "own) and name the flattened files"
    )
