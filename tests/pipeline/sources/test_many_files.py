"""Many small inputs: they share partitions and shards in every format, locally and in a bucket,
a kill inside such a partition resumes inside it, and a folder planned before this layout
still resumes with its own plan.

Every input is a real file (or object on the real S3 API server the tests start), written by
its format's own library; every run is compared with the plain encoding of the same documents
or, after kills, byte for byte with an uninterrupted run."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from faulty_store import faulty_store
from support import (
    assert_same_output,
    checkpoints,
    cli,
    files_recipe,
    kill_group,
    one_error_line,
    output_files,
    plain_encode,
    reference,
    run_prepare,
    start_prepare,
    stream_of,
    wait_for,
    write_jsonl,
)

from pipeline.format import manifest
from pipeline.format.atomic import json_bytes
from pipeline.format.errors import DataError
from pipeline.format.manifest import content_hash
from pipeline.format.provenance import Origin
from pipeline.run.records import Plan
from pipeline.run.run_state import STATE_DIR
from pipeline.sources.files import FilesSource
from pipeline.sources.files.listing import list_files
from pipeline.sources.files.pieces import FileTable, Piece, partition_spec, pieces_of

#: one of each format the files source reads, in the order the test's file names sort
FORMATS = (".jsonl", ".json", ".jsonl.gz", ".json.zst", ".parquet", ".txt")


def write_input(path: Path, texts: list[str]) -> Path:
    """``texts`` in the format ``path``'s name says, written by that format's own library (a
    .txt file holds one document: the first text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    name = path.name
    if name.endswith(".txt"):
        path.write_text(texts[0])
    elif name.endswith(".parquet"):
        pq.write_table(pa.table({"text": texts}), path, row_group_size=2)
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    else:
        path.write_bytes(lines)
    return path


def mixed_folder(folder: Path, docs: list[str], files: int) -> list[str]:
    """``files`` small inputs cycling through every format; returns their documents in order."""
    expected: list[str] = []
    for i in range(files):
        suffix = FORMATS[i % len(FORMATS)]
        texts = [docs[(3 * i) % len(docs)], docs[(3 * i + 1) % len(docs)], docs[(3 * i + 2) % len(docs)]]
        write_input(folder / f"part-{i:04d}{suffix}", texts)
        expected += texts[:1] if suffix == ".txt" else texts
    return expected


def source_of(patterns: list[str], partition_bytes: int | str = "auto") -> FilesSource:
    cfg = FilesSource.normalize("d", {"paths": patterns, "partition_bytes": partition_bytes}, "test")
    return FilesSource("d", cfg)


def test_small_files_of_every_format_share_partitions_and_shards(tmp_path, docs, tokenizer_path, dask_client):
    """120 small files (JSON Lines plain, .json, gzip, zstd, parquet, .txt) become a few
    partitions of about the partition size, one shard each, holding exactly the documents of
    the files in order."""
    expected = mixed_folder(tmp_path / "in", docs, 120)
    total = sum(p.stat().st_size for p in (tmp_path / "in").iterdir())
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {
            "d": {"type": "files", "paths": [str(tmp_path / "in" / "*")], "partition_bytes": 64 << 10}
        },
    }
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    m = manifest.load(path)
    partitions = m.data["sources"]["d"]["splits"]["train"]["partitions"]
    assert partitions <= total // (32 << 10) + 1, (partitions, total)  # pieces fill each one past half
    assert len(m.shards) == partitions
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, expected))


def test_a_shard_is_cut_by_tokens_across_the_files_of_a_partition(
    tmp_path, docs, tokenizer_path, dask_client
):
    """With small shards, a partition of many files writes shards full to ``shard_tokens``
    (a document never split), not one shard per file."""
    expected = mixed_folder(tmp_path / "in", docs, 60)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 40_000,
        "sources": {
            "d": {"type": "files", "paths": [str(tmp_path / "in" / "*")], "partition_bytes": 1 << 20}
        },
    }
    path = run_prepare(recipe, tmp_path / "out", dask_client)
    m = manifest.load(path)
    assert m.data["sources"]["d"]["splits"]["train"]["partitions"] == 1
    sizes = [s.tokens for s in m.shards]
    assert 1 < len(sizes) < 60 and all(t <= 40_000 for t in sizes)
    assert all(t > 40_000 - max(map(len, docs)) for t in sizes[:-1]), sizes  # each filled to a document
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, expected))


def test_large_files_keep_one_partition_per_range_or_row_group_run(tmp_path, docs):
    """Files larger than the partition size are cut as before packing existed: JSON Lines into
    ranges of that size from each file's start, parquet into runs of row groups, each its own
    partition (their shards do not change); the small files between them share partitions."""
    big = write_jsonl(tmp_path / "a.jsonl", docs[:60])
    for i in range(4):
        write_jsonl(tmp_path / f"b{i}.jsonl", docs[60 + i : 61 + i])
    pq.write_table(pa.table({"text": docs[:80]}), tmp_path / "c.parquet", row_group_size=10)
    step = 64 << 10
    parts = source_of([str(tmp_path / "*")], step).partitions()
    size = big.stat().st_size
    ranges = [f"{big}@{s}-{min(size, s + step)}" for s in range(0, size, step)]
    assert [p.key for p in parts][: len(ranges)] == ranges
    small = parts[len(ranges)]
    assert [os.path.basename(p.path) for p in pieces_of(small.spec, small.size)] == [
        f"b{i}.jsonl" for i in range(4)
    ]
    runs = parts[len(ranges) + 1 :]
    assert len(runs) > 1 and all(len(p.spec["pieces"]) == 1 for p in runs)
    groups = [g for p in runs for g in range(*_groups(p.key))]
    assert groups == list(range(pq.read_metadata(tmp_path / "c.parquet").num_row_groups))


def test_the_plan_names_each_input_file_once_and_reads_back_the_same(tmp_path, docs):
    """run.json's pieces refer to the origin's entries by index: each file's path is written
    once (its entry); the plan read back holds the very same partitions, and so does a plan
    of version 1, whose pieces were written whole."""
    write_jsonl(tmp_path / "a.jsonl", docs[:60])
    for i in range(40):
        write_jsonl(tmp_path / f"b{i:02d}.jsonl", docs[60 + i : 61 + i])
    pq.write_table(pa.table({"text": docs[:80]}), tmp_path / "c.parquet", row_group_size=10)
    (tmp_path / "d.txt").write_text(docs[0])
    source = source_of([str(tmp_path / "*")], 64 << 10)
    plan = Plan({}, "", {"sources": {"d": source.config}}, {}, {"d": source.origin()}, {"d": ["train"]},
                source.partitions())  # fmt: skip
    data = json_bytes(plan.to_json(), compact=True)
    unkeyed = json.dumps([{k: v for k, v in p.items() if k != "key"} for p in json.loads(data)["partitions"]])
    assert not any(f.path in unkeyed for f in source.files("train"))  # (a key names its first piece)
    assert Plan.parse(data, "run.json", "out").partitions == plan.partitions
    older = json.loads(data)
    for written, part in zip(older["partitions"], plan.partitions, strict=True):
        written["spec"] = {"pieces": [p.to_json() for p in pieces_of(part.spec, part.size)]}
    older["version"] = 1
    assert Plan.parse(json.dumps(older).encode(), "run.json", "out").partitions == plan.partitions


def test_every_shape_of_piece_is_written_against_the_file_table_and_read_back():
    """An object's piece (its version tag, or its sample), runs of row groups, a .txt file, and
    a piece of a file the table does not hold: each written as the plan writes it and read back
    equal; a whole file as listed is written as its index alone."""
    entries = [
        {"path": "s3://b/x.jsonl", "size": 10, "etag": "e1"},
        {"path": "s3://b/y.jsonl", "size": 10, "sample": "abc"},
        {"path": "/l/z.parquet", "size": 900, "mtime": 5, "sample": "s"},
        {"path": "/l/w.txt", "size": 3, "mtime": 7},
    ]
    pieces = [
        Piece("s3://b/x.jsonl", ".jsonl", 10, etag="e1"),
        Piece("s3://b/y.jsonl", ".jsonl", 10, sample="abc"),
        Piece("/l/z.parquet", ".parquet", 400, row_groups=(0, 1), mtime=5),
        Piece("/l/z.parquet", ".parquet", 500, row_groups=(2,), mtime=5),
        Piece("/l/w.txt", ".txt", 3, mtime=7),
        Piece("/elsewhere.jsonl", ".jsonl", 4, 0, 4, sample="q"),
    ]
    written = json.loads(json.dumps(FileTable(entries).spec_json(partition_spec(pieces))))
    assert written["pieces"][0] == 0 and written["pieces"][2]["file"] == 2
    assert pieces_of(FileTable(entries).spec_of_json(written), 0) == pieces


def test_a_folder_listing_records_each_file_as_its_own_stat_says(tmp_path, docs):
    """Listing a folder of many files (one lstat each; whether the folder is an output of
    `prepare`, and its resolved path, found once) records each match as a stat of it alone
    does: regular files, a file only its owner may read, a symbolic link (its target's size,
    resolved path), through a folder reached by a link and directly; an output is left out."""
    real = tmp_path / "real"
    real.mkdir()
    for i in range(5):
        write_jsonl(real / f"a{i}.jsonl", docs[i : i + 1])
    (real / "a2.jsonl").chmod(0o600)
    (real / "z.jsonl").symlink_to(real / "a0.jsonl")
    (tmp_path / "via").symlink_to(real)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / STATE_DIR).mkdir()
    write_jsonl(tmp_path / "out" / "x.jsonl", docs[:1])
    listed = list_files([str(tmp_path / "via" / "*.jsonl"), str(tmp_path / "*" / "*.jsonl")], ".")
    names = [*(f"a{i}.jsonl" for i in range(5)), "z.jsonl"]
    expected = []
    for name in names:
        st = os.stat(real / name)
        expected.append(
            (os.path.realpath(tmp_path / "via" / name), st.st_size, st.st_mtime_ns, None, ".jsonl")
        )
    assert [tuple(f) for f in listed] == sorted(set(expected))


def test_hard_links_of_one_file_are_listed_once_by_their_first_name(tmp_path, docs):
    """A file's hard links (one device and inode) are one input, as its symbolic links are:
    listed once, by the first of its names in sorted order, whether a glob or a name given
    itself reaches each; a rerun lists the same files its plan holds."""
    data = tmp_path / "d"
    write_jsonl(data / "b.jsonl", docs[:2])
    os.link(data / "b.jsonl", data / "a.jsonl")
    (tmp_path / "e").mkdir()
    os.link(data / "b.jsonl", tmp_path / "e" / "c.jsonl")
    write_jsonl(data / "c.jsonl", docs[2:3])
    (data / "z.jsonl").symlink_to("b.jsonl")
    patterns = [str(data / "*.jsonl"), str(tmp_path / "e" / "c.jsonl")]
    assert [f.path for f in list_files(patterns, ".")] == [str(data / "a.jsonl"), str(data / "c.jsonl")]
    source_of(patterns).check_unchanged(source_of(patterns).origin())


def _groups(key: str) -> tuple[int, int]:
    first, last = key.rsplit("#rg", 1)[1].split("-")
    return int(first), int(last) + 1


def test_every_cursor_of_a_partition_of_many_files_resumes_at_the_next_document(tmp_path, docs):
    """Reading a packed partition from the cursor after any of its documents gives exactly the
    documents after it: the cursor names the piece and the position in it, in every format."""
    mixed_folder(tmp_path / "in", docs, 24)
    (part,) = source_of([str(tmp_path / "in" / "*")], 1 << 30).partitions()
    source = source_of([str(tmp_path / "in" / "*")], 1 << 30)
    records = list(source.read(part, None))
    assert len({r.cursor["piece"] for r in records}) > 12
    for i, rec in enumerate(records):
        assert [r.text for r in source.read(part, rec.cursor)] == [r.text for r in records[i + 1 :]], (
            rec.cursor
        )
    assert [r.progress for r in records] == sorted(r.progress for r in records)
    assert records[-1].progress == part.size


def written_to(path: Path) -> None:
    """``path`` rewritten in place with bytes of its size (here its own) and a new modification
    time (a second on: two writes within a clock tick may share one)."""
    st = path.stat()
    path.write_bytes(path.read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_a_file_written_to_while_its_partition_is_read_is_named_before_the_file_after_it(tmp_path, docs):
    """A file of a packed partition written to in place while it is read: asked before a commit
    (`check_read`), the source names it at once, and its reader names it once the file is read
    to its end, before any document of the file after it; in every format, and a file gone
    while it was read too (one stat per file and per commit, none per document)."""
    mixed_folder(tmp_path / "in", docs, 2 * len(FORMATS))
    pattern = str(tmp_path / "in" / "*")
    files = [Path(f.path) for f in source_of([pattern]).files("train")]
    for edited, after in itertools.pairwise(files[: len(FORMATS) + 1]):
        source = source_of([pattern], 1 << 30)  # planned as the files are now
        (part,) = source.partitions()
        records = source.read(part, None)
        seen = [next(records).input.name]
        while seen[-1] != str(edited):
            seen.append(next(records).input.name)
        source.check_read()  # as planned so far
        written_to(edited)
        says = (
            rf"input {re.escape(str(edited))} changed since this run started \(written to while it was read"
        )
        with pytest.raises(DataError, match=says):
            source.check_read()
        with pytest.raises(DataError, match=says):
            for rec in records:
                seen.append(rec.input.name)
        assert str(after) not in seen
    source = source_of([pattern], 1 << 30)
    (part,) = source.partitions()
    records = source.read(part, None)
    next(records)
    files[0].unlink()
    with pytest.raises(
        DataError, match=rf"input {re.escape(str(files[0]))} changed since this run started \(removed while"
    ):
        list(records)


@pytest.fixture(scope="module")
def many_files_setup(tmp_path_factory, docs, tokenizer_path, dask_client):
    """400 small JSON Lines files (about 3 MB of real text) in 3 partitions, small shards, a
    commit after nearly every batch and the reference encoder (the slowest): a kill lands
    inside a partition of many files."""
    d = tmp_path_factory.mktemp("many")
    for i in range(400):
        write_jsonl(d / "in" / f"day-{i:04d}.jsonl", [docs[(2 * i + k) % len(docs)] for k in range(2)])
    recipe = files_recipe(
        d / "many.toml",
        tokenizer_path,
        d / "in" / "*.jsonl",
        partition_bytes=1_200_000,
        shard_tokens=50_000,
        commit_seconds=0.05,
        encoder="tokenizers",
    )
    ref = reference(recipe, d / "ref", dask_client)
    return recipe, ref.parent


def inside_a_later_piece(out: Path) -> bool:
    """Some partition has committed a cursor past its first file and is not finished."""
    return any(not ck["complete"] and (ck.get("cursor") or {}).get("piece", 0) > 0 for ck in checkpoints(out))


def test_a_kill_inside_a_partition_of_many_files_resumes_inside_it(many_files_setup, tmp_path):
    recipe, ref = many_files_setup
    out = tmp_path / "out"
    proc = start_prepare(recipe, out, "--workers", "2")
    found = wait_for(
        lambda: inside_a_later_piece(out), 120, "a commit inside a partition of many files", proc
    )
    kill_group(proc)
    assert found, "the run finished before a commit inside a partition of many files"
    resumed = [ck["cursor"] for ck in checkpoints(out) if not ck["complete"] and ck.get("cursor")]
    assert any(c.get("piece", 0) > 0 for c in resumed), resumed
    done = cli("prepare", str(recipe), "--out", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert "to resume" in done.stderr
    assert_same_output(ref, out)


def test_a_folder_planned_before_packing_resumes_with_its_own_plan(tmp_path, docs, tokenizer_path):
    """A folder whose plan an older tokshard wrote (one range per partition, cursors without a
    piece, the recipe's globs in its identity), stopped inside a partition by a bad record,
    resumes there with ``--on-bad-record skip`` and gives the shards of an uninterrupted run."""
    lines = [json.dumps({"text": d}) + "\n" for d in docs * 4]
    lines.insert(len(lines) * 3 // 5, '{"text": "broken\n')
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.jsonl").write_text("".join(lines))
    pattern = str(tmp_path / "in" / "*.jsonl")
    recipe = files_recipe(tmp_path / "r.toml", tokenizer_path, pattern, partition_bytes=500_000,
                          shard_tokens=50_000, commit_seconds=0.05)  # fmt: skip
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert cli("prepare", str(recipe), "--out", str(ref), "--on-bad-record", "skip").returncode == 0
    stopped = cli("prepare", str(recipe), "--out", str(out))
    assert stopped.returncode == 1 and "bad record" in stopped.stderr
    assert any(not ck["complete"] and ck.get("cursor") for ck in checkpoints(out))
    as_older_tokshard(out, pattern)
    done = cli("prepare", str(recipe), "--out", str(out), "--on-bad-record", "skip")
    assert done.returncode == 0, done.stderr
    assert "to resume" in done.stderr
    shards = [f for f in output_files(ref) if f != "manifest.json"]
    assert shards == [f for f in output_files(out) if f != "manifest.json"]
    assert all((ref / f).read_bytes() == (out / f).read_bytes() for f in shards)


def as_older_tokshard(out: Path, glob_written: str) -> None:
    """Rewrite a folder's plan and checkpoints as the tokshard before packing wrote them."""
    plan_path = out / STATE_DIR / "run.json"
    plan = json.loads(plan_path.read_text())
    files = plan["origins"]["text"]["files"]["train"]
    for part in plan["partitions"]:
        (piece,) = part["spec"]["pieces"]  # a range: {"file": its index in the origin, and the rest}
        part["spec"] = {"kind": ".jsonl", "path": files[piece["file"]]["path"], "start": piece.get("start", 0),
                        "end": piece.get("end", piece["size"]), "sample": piece["sample"]}  # fmt: skip
    plan["version"] = 1
    identity = plan["identity"]
    identity["sources"]["text"]["splits"] = {"train": [glob_written]}
    plan["identity_hash"] = content_hash(identity)
    plan_path.write_text(json.dumps(plan))
    for ck_path in (out / STATE_DIR / "parts").rglob("*.json"):
        ck = json.loads(ck_path.read_text())
        if ck.get("cursor"):
            ck["cursor"] = {"offset": ck["cursor"]["offset"]}
        ck_path.write_text(json.dumps(ck))


def test_records_carry_their_location_in_the_input(tmp_path, docs):
    """Each document names its file and where in it it starts: the byte offset of its line
    (plain JSON Lines), its line number (compressed), its row (parquet), offset 0 (.txt)."""
    for suffix in FORMATS:
        write_input(tmp_path / f"x{suffix}", docs[:5])
    source = source_of([str(tmp_path / "x*")], 1 << 30)
    records = [r for p in source.partitions() for r in source.read(p, None)]
    by_file: dict[str, list[Origin]] = {}
    for r in records:
        by_file.setdefault(os.path.basename(r.origin.input), []).append(r.origin)
    lines = (tmp_path / "x.jsonl").read_bytes().splitlines(keepends=True)
    offsets = [sum(map(len, lines[:i])) for i in range(5)]
    path = str(tmp_path / "x")
    assert by_file["x.jsonl"] == [Origin(path + ".jsonl", "offset", at) for at in offsets]
    assert by_file["x.jsonl.gz"] == [Origin(path + ".jsonl.gz", "line", n) for n in range(1, 6)]
    assert by_file["x.parquet"] == [Origin(path + ".parquet", "row", n) for n in range(5)]
    assert by_file["x.txt"] == [Origin(path + ".txt", "offset", 0)]
    with open(tmp_path / "x.jsonl", "rb") as f:
        f.seek(by_file["x.jsonl"][3].place)
        assert json.loads(f.readline())["text"] == docs[3]


def test_the_first_record_of_a_jsonl_with_a_byte_order_mark_is_placed_after_the_mark(tmp_path, docs):
    """Its place was offset 0, the mark inside the "line": a reader seeking there and parsing
    the line as JSON failed. It is offset 3 (the JSON's first byte); the other lines as before."""
    body = "".join(json.dumps({"text": d}) + "\n" for d in docs[:3]).encode()
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + body)
    source = source_of([str(tmp_path / "bom.jsonl")], 1 << 30)
    places = [r.origin.place for p in source.partitions() for r in source.read(p, None)]
    assert places[0] == 3 and places[1] == 3 + body.index(b"\n") + 1
    with open(tmp_path / "bom.jsonl", "rb") as f:
        for place, doc in zip(places, docs, strict=False):
            f.seek(place)
            assert json.loads(f.readline())["text"] == doc


# --- objects in a bucket ------------------------------------------------------------------------


@contextmanager
def s3_calls(bucket: str) -> Iterator[Counter[str]]:
    """Every S3 operation this process's s3fs sends for one bucket, counted by name (botocore's
    own events; another test's fetch still running in this process is not counted). The
    filesystem is taken as tokshard takes it (`url_filesystem` sets fsspec's s3 options first,
    and another set of options is another s3fs instance, whose calls would go uncounted)."""
    from pipeline.storage.object_store import url_filesystem

    calls: Counter[str] = Counter()

    def count(model, params, **_) -> None:
        if urlsplit(params["url"]).path.split("/")[1] == bucket:
            calls.update([model.name])

    events = url_filesystem(f"s3://{bucket}")[0].s3.meta.events
    events.register("before-call.s3", count)
    try:
        yield calls
    finally:
        events.unregister("before-call.s3", count)


def test_planning_objects_costs_one_listing_and_no_request_per_object(s3_server, docs):
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for i in range(300):
        s3.put_object(
            Bucket=bucket,
            Key=f"in/day-{i:04d}.jsonl",
            Body=json.dumps({"text": docs[i % 50]}).encode() + b"\n",
        )
    with s3_calls(bucket) as calls:
        source = source_of([f"s3://{bucket}/in/*.jsonl"])
        origin, parts = source.origin(), source.partitions()
        source.check_unchanged(origin)
    assert len(origin["files"]["train"]) == 300 and len(parts) < 10
    assert set(calls) == {"ListObjectsV2"} and calls["ListObjectsV2"] <= 2, calls  # planning, then the check


def test_small_objects_share_partitions_and_give_the_shards_of_the_same_local_files(
    s3_server, docs, tokenizer_path, tmp_path
):
    expected = mixed_folder(tmp_path / "in", docs, 48)
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for path in sorted((tmp_path / "in").iterdir()):
        s3.put_object(Bucket=bucket, Key=f"in/{path.name}", Body=path.read_bytes())
    common = ["--tokenizer", str(tokenizer_path), "--workers", "2", "--partition-bytes", str(64 << 10)]
    for given, out in ((f"s3://{bucket}/in/*", "from-s3"), (str(tmp_path / "in" / "*"), "from-disk")):
        cli("prepare", "--input", given, "--out", out, *common, cwd=tmp_path, check=True)
    ms = [manifest.load(tmp_path / o / "manifest.json") for o in ("from-s3", "from-disk")]
    assert [s.hash for s in ms[0].shards] == [s.hash for s in ms[1].shards]
    assert len(ms[0].shards) < 12
    assert np.array_equal(
        stream_of(tmp_path / "from-s3" / "manifest.json"), plain_encode(tokenizer_path, expected)
    )


def test_a_store_listing_etags_without_their_quotes_reads_its_objects(
    s3_server, docs, tokenizer_path, tmp_path
):
    """Some S3-compatible stores (NetApp ONTAP) list an ETag without the quotes their HEAD
    answer gives it: the same version, so each object is read, not refused as changed."""
    expected = mixed_folder(tmp_path / "in", docs, 12)
    bucket = s3_server.new_bucket()
    for path in sorted((tmp_path / "in").iterdir()):
        s3_server.client().put_object(Bucket=bucket, Key=f"in/{path.name}", Body=path.read_bytes())
    with faulty_store(s3_server.endpoint, every=0, bare_listed_tags=True) as endpoint:
        done = cli(
            "prepare",
            *("--input", f"s3://{bucket}/in/*", "--out", "out", "--tokenizer", str(tokenizer_path)),
            cwd=tmp_path,
            env={"AWS_ENDPOINT_URL": endpoint},
        )
    assert done.returncode == 0, done.stderr
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tokenizer_path, expected)
    )


def test_a_public_bucket_is_read_without_credentials_as_the_line_without_them_says(
    s3_server, docs, tokenizer_path, tmp_path
):
    """Open datasets sit in buckets anyone may read: with no credentials the line says how to
    read them anonymously, and so read they give the shards of the same files."""
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(
        Bucket=bucket,
        Key="in/a.jsonl",
        Body=write_jsonl(tmp_path / "a.jsonl", docs[:20]).read_bytes(),
        ACL="public-read",
    )
    nobody = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    args = ("prepare", "--input", f"s3://{bucket}/in/*.jsonl", "--tokenizer", str(tokenizer_path))
    refused = cli(*args, "--out", "refused", cwd=tmp_path, env=nobody)
    assert refused.returncode == 2 and "FSSPEC_S3_ANON=true" in one_error_line(refused), refused.stderr
    cli(*args, "--out", "out", cwd=tmp_path, env={**nobody, "FSSPEC_S3_ANON": "true"}, check=True)
    assert np.array_equal(
        stream_of(tmp_path / "out" / "manifest.json"), plain_encode(tokenizer_path, docs[:20])
    )


def test_an_object_rewritten_after_planning_is_refused_by_its_reader(s3_server, docs):
    """An object is planned with the version tag its listing gave; the reader compares the tag
    of the object it opens, so a rewrite after planning never joins the planned run."""
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for i in range(3):
        s3.put_object(
            Bucket=bucket, Key=f"in/d{i}.jsonl", Body=json.dumps({"text": docs[i]}).encode() + b"\n"
        )
    source = source_of([f"s3://{bucket}/in/*.jsonl"])
    (part,) = source.partitions()
    s3.put_object(Bucket=bucket, Key="in/d1.jsonl", Body=json.dumps({"text": "rewritten"}).encode() + b"\n")
    with pytest.raises(
        DataError, match=rf"input s3://{bucket}/in/d1\.jsonl changed since this run started \(its version"
    ):
        list(source.read(part, None))


def test_a_partition_size_that_plans_a_task_per_small_file_says_so_in_one_note(
    tmp_path, docs, tokenizer_path
):
    """--partition-bytes 4KiB over many small files planned a task per file, each paying its
    fixed cost (a 50x slower run), without a word: the plan now says so in one note with the
    count and the default to use, and the run goes on."""
    for i in range(150):
        write_jsonl(tmp_path / "in" / f"{i:03d}.jsonl", [docs[i % len(docs)][:3000]])
    proc = cli(
        "prepare", "--input", str(tmp_path / "in" / "*.jsonl"), "--tokenizer", str(tokenizer_path),
        "--out", str(tmp_path / "out"), "--workers", "2", "--partition-bytes", "4KiB",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "fixed cost" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "tokshard: note: source data: partition_bytes 4,096 plans 1"
    ), notes
    assert "where the default plans about 1: " in notes[0] and "--partition-bytes" in notes[0]
    assert (tmp_path / "out" / "manifest.json").exists()


def test_a_partition_size_of_a_megabyte_or_the_default_plans_without_a_note(tmp_path, docs):
    for i in range(150):
        write_jsonl(tmp_path / f"{i:03d}.jsonl", [docs[i % len(docs)][:3000]])
    for size in ("auto", 1 << 20, 64 << 10):
        src = source_of([str(tmp_path / "*.jsonl")], size)
        assert src.plan_note(src.partitions()) is None, size
