"""manifest.json: its schema, its checksum, and what the loader refuses."""

from __future__ import annotations

import json

import jsonschema
import pytest
from support import REPO, run_prepare, write_jsonl

from pipeline.format import manifest
from pipeline.format.errors import DataError, TokshardError, VerifyError
from pipeline.format.verify import verify


@pytest.fixture
def manifest_path(tmp_path, docs, tokenizer_path, dask_client):
    data = write_jsonl(tmp_path / "in.jsonl", docs[:5])
    recipe = {"tokenizer": str(tokenizer_path), "sources": {"d": {"type": "files", "paths": [str(data)]}}}
    return run_prepare(recipe, tmp_path / "out", dask_client)


def test_schema_rejects_a_shard_path_that_leaves_the_folder(manifest_path):
    schema = json.loads((REPO / "manifests" / "schema.json").read_text())
    data = json.loads(manifest_path.read_text())
    data["shards"][0]["path"] = "../elsewhere/x.bin"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_loader_refuses_escaping_paths_without_opening_them(manifest_path):
    data = json.loads(manifest_path.read_text())
    data["shards"][0]["path"] = "/etc/passwd.bin"
    manifest_path.write_text(json.dumps(data))
    with pytest.raises(VerifyError, match="leaves the manifest's folder"):
        manifest.load(manifest_path)


def test_checksum_detects_an_edit(manifest_path):
    assert manifest.load(manifest_path).checksum_ok()
    data = json.loads(manifest_path.read_text())
    data["tokenizer"]["vocab_size"] += 1
    manifest_path.write_text(json.dumps(data))
    assert not manifest.load(manifest_path).checksum_ok()


def test_a_manifest_without_its_checksum_is_said_to_have_none_not_to_be_edited(manifest_path):
    data = json.loads(manifest_path.read_text())
    del data["checksum"]
    manifest_path.write_text(json.dumps(data))
    assert manifest.seal_problem(data) == manifest.NO_CHECKSUM
    with pytest.raises(DataError, match=r"manifest\.json: without a checksum: an older tokshard wrote it"):
        manifest.load(manifest_path).check_sealed()
    assert [f for f in verify(manifest_path)[0] if "checksum" in f] == [
        f"{manifest_path}: manifest {manifest.NO_CHECKSUM}"
    ]


def test_other_format_versions_are_refused_by_name(manifest_path):
    data = json.loads(manifest_path.read_text())
    data["format"] = 99
    manifest_path.write_text(json.dumps(data))
    with pytest.raises(TokshardError, match="manifest format 99, this tokshard reads format 1"):
        manifest.load(manifest_path)


def test_fingerprint_ignores_creation_time(manifest_path):
    first = manifest.load(manifest_path).fingerprint()
    data = json.loads(manifest_path.read_text())
    data["created"] = "2000-01-01T00:00:00+00:00"
    manifest_path.write_text(json.dumps(data))
    assert manifest.load(manifest_path).fingerprint() == first


def _shard_folder(manifest_path):
    """The folder under the manifest's that holds its first shard (``d``, the source's)."""
    rel = json.loads(manifest_path.read_text())["shards"][0]["path"]
    return manifest_path.parent / rel.split("/")[0]


def test_a_shard_folder_symlinked_out_of_the_manifests_folder_is_read(manifest_path, tmp_path):
    """A folder moved to another disk and linked back: its shards are read where it leads."""
    folder = _shard_folder(manifest_path)
    outside = tmp_path / "outside"
    folder.rename(outside)
    folder.symlink_to(outside)
    m = manifest.load(manifest_path)
    assert all(entry.bin_path.is_file() for entry in m.shards)


def test_a_manifest_that_is_a_symbolic_link_reads_the_shards_beside_the_file_it_leads_to(
    manifest_path, tmp_path
):
    """``latest.json -> run3/manifest.json``: the shards are run3's (they were looked for beside
    the link, and every one was missing)."""
    link = tmp_path / "links" / "latest.json"
    link.parent.mkdir()
    link.symlink_to(manifest_path)
    m = manifest.load(link)
    assert m.folder == manifest_path.parent.resolve()
    assert all(entry.bin_path.is_file() for entry in m.shards)


def test_a_shard_folder_symlinked_inside_the_manifests_folder_is_read(manifest_path):
    folder = _shard_folder(manifest_path)
    moved = manifest_path.parent / "moved"
    folder.rename(moved)
    folder.symlink_to(moved)
    m = manifest.load(manifest_path)
    assert all(entry.bin_path.is_file() for entry in m.shards)


def test_a_train_runs_folder_given_for_a_manifest_names_the_manifest_it_trained_on(tmp_path):
    """`megatron-args RUN_DIR` (or inspect, verify) on a `tokshard train` run's folder asked
    whether `tokshard prepare` was still running; the run's record names its manifest."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"data": {"manifest": "/data/web/manifest.json"}}))
    with pytest.raises(
        TokshardError,
        match=r"is the folder of a `tokshard train` run, which trained on "
        r"/data/web/manifest.json: pass that\)$",
    ):
        manifest.find(run)
    (run / "run.json").write_text(json.dumps({"data": {"manifest": ["/a/manifest.json", "/b"]}}))
    with pytest.raises(TokshardError, match=r"trained on /a/manifest.json, /b: pass that"):
        manifest.find(run)
    (run / "run.json").write_text("{")  # not a run's record: the usual question
    with pytest.raises(TokshardError, match="still running"):
        manifest.find(run)
