"""Rerunning `prepare` on a folder: finished work is kept, a changed recipe or a second run is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import as_an_older_tokshard_left_it, cli, plain_encode, run_prepare, stream_of, write_jsonl

from pipeline import recipe
from pipeline.format import manifest
from pipeline.format.errors import TokshardError
from pipeline.run.driver import RunOptions, prepare
from pipeline.run.folder_layout import run_lock


def files_recipe(tokenizer_path, data, **settings):
    return {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(data)], "partition_bytes": 20_000}},
        **settings,
    }


def test_bad_record_stops_the_run_and_a_skip_rerun_keeps_finished_partitions(
    tmp_path, docs, tokenizer_path, dask_client
):
    data = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": d}) for d in docs[:60]]
    lines[45] = '{"text": "broken'
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(TokshardError, match=r"in\.jsonl:46: bad record \(malformed JSON\)"):
        run_prepare(files_recipe(tokenizer_path, data), out, dask_client)
    assert not (out / "manifest.json").exists()
    done = sorted(out.glob(".tokshard/parts/d/train/*.json"))
    finished = {p: p.stat().st_mtime_ns for p in done if json.loads(p.read_text())["complete"]}
    assert finished, "other partitions finished before the failure"
    path = run_prepare(files_recipe(tokenizer_path, data, on_bad_record="skip"), out, dask_client)
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items()), "finished partitions were redone"
    kept = [d for i, d in enumerate(docs[:60]) if i != 45]
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, kept))
    assert manifest.load(path).data["sources"]["d"]["splits"]["train"]["skipped"] == {"malformed JSON": 1}


def test_changed_recipe_is_refused_naming_the_change(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:10])
    out = tmp_path / "out"
    run_prepare(files_recipe(tokenizer_path, data), out, dask_client)
    with pytest.raises(TokshardError, match=r"shard_tokens: 134217728 -> 1000"):
        run_prepare(files_recipe(tokenizer_path, data, shard_tokens=1000), out, dask_client)


def test_changed_input_file_is_refused(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:10])
    out = tmp_path / "out"
    run_prepare(files_recipe(tokenizer_path, data), out, dask_client)
    (out / "manifest.json").unlink()
    write_jsonl(data, docs[:11])
    with pytest.raises(TokshardError, match="changed since this run started"):
        run_prepare(files_recipe(tokenizer_path, data), out, dask_client)


def test_second_concurrent_prepare_on_one_folder_is_refused(tmp_path, docs, tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    out = tmp_path / "out"
    out.mkdir()
    with run_lock(out):  # this process plays the first run
        proc = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out))
    assert proc.returncode == 2
    assert "another `tokshard prepare`" in proc.stderr and str(out) in proc.stderr


def test_rerun_of_a_complete_folder_does_nothing(tmp_path, docs, tokenizer_path):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    r = recipe.from_dict(files_recipe(tokenizer_path, data), "test")
    first = prepare(r, tmp_path / "out", RunOptions(workers=1), log=lambda m: None)
    before = first.read_bytes()
    messages: list[str] = []
    prepare(
        recipe.from_dict(files_recipe(tokenizer_path, data), "test"), tmp_path / "out", log=messages.append
    )
    assert first.read_bytes() == before
    assert any("already complete" in m for m in messages)


def test_a_rerun_that_finds_the_encoder_check_kept_writes_the_manifest_of_the_first_run(
    tmp_path, docs, tokenizer_path, dask_client, monkeypatch
):
    """A node's first run checks the encoder in full and keeps the pass; its rerun (after a kill)
    reads the pass. The manifest says what was compared, not what this node had kept, so the
    rerun's is the uninterrupted run's but for its creation time."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # this node's cache, cold
    data = write_jsonl(tmp_path / "in.jsonl", docs[:30])
    out = tmp_path / "out"
    runs: list[list[str]] = []
    manifests = []
    for _ in range(2):
        said: list[str] = []
        r = recipe.from_dict(files_recipe(tokenizer_path, data), "test")
        path = prepare(r, out, RunOptions(client=dask_client), log=said.append)
        manifests.append(json.loads(path.read_bytes()))
        runs.append([m for m in said if m.startswith("encoder: ")])
        path.unlink()  # the rerun writes it again, as one after a kill between the last task and it
    assert "kept in" not in runs[0][0] and f"kept in {tmp_path / 'xdg'}" in runs[1][0]
    for doc in manifests:
        del doc["created"], doc["checksum"]
    assert manifests[0] == manifests[1]


def shard_files(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "d").rglob("*")) if p.is_file()}


def test_a_partial_an_older_tokshard_committed_without_provenance_is_redone_to_equal_a_clean_run(
    tmp_path, docs, tokenizer_path, dask_client
):
    data = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": d}) for d in docs[:60]]
    lines[45] = '{"text": "broken'  # the old run stops there, its partial committed
    data.write_text("\n".join(lines) + "\n")
    one_partition = {"type": "files", "paths": [str(data)], "partition_bytes": 10_000_000}
    made = {"tokenizer": str(tokenizer_path), "shard_tokens": 2000, "sources": {"d": one_partition}}
    out = tmp_path / "out"
    with pytest.raises(TokshardError, match="bad record"):
        run_prepare(made, out, dask_client)
    (ck,) = [json.loads(p.read_text()) for p in out.glob(".tokshard/parts/d/train/*.json")]
    assert not ck["complete"] and ck["closed"] and ck["open"]["documents"]
    as_an_older_tokshard_left_it(out)
    said: list[str] = []
    path = run_prepare({**made, "on_bad_record": "skip"}, out, dask_client, log=said.append)
    clean = tmp_path / "clean"
    run_prepare({**made, "on_bad_record": "skip"}, clean, dask_client)
    assert shard_files(out) == shard_files(clean)  # .bin, .idx and .origin, byte for byte
    assert all(s.origin_hash for s in manifest.load(path).shards)
    (note,) = [m for m in said if "older tokshard" in m]
    assert "recorded no provenance" in note and "redoing it from its start" in note


def test_finished_shards_an_older_tokshard_wrote_are_kept_and_counted_as_without_provenance(
    tmp_path, docs, tokenizer_path, dask_client
):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:60])
    out = tmp_path / "out"
    run_prepare(files_recipe(tokenizer_path, data), out, dask_client)
    as_an_older_tokshard_left_it(out)
    bins = sorted(out.glob("d/train/*.bin"))
    assert len(bins) >= 3
    bins[1].unlink()  # its partition is redone, with provenance; the others are kept
    kept = {p: p.stat().st_mtime_ns for p in bins if p != bins[1]}
    for _ in range(2):  # the rerun that finishes the run, and one that finds it complete
        said: list[str] = []
        path = run_prepare(files_recipe(tokenizer_path, data), out, dask_client, log=said.append)
        assert all(p.stat().st_mtime_ns == t for p, t in kept.items()), "kept shards were encoded again"
        shards = manifest.load(path).shards
        assert sum(s.origin_hash is None for s in shards) == len(kept)
        (note,) = [m for m in said if "no provenance" in m]
        assert f"{len(kept)} of the run's {len(shards)} shards carry no provenance" in note
        assert "older tokshard" in note and "new --out" in note
