"""A rerun publishes only shards that are what their checkpoints say, and says what it skipped.

A finished folder whose manifest was removed, with one shard file deleted, cut or changed
behind the run's back: the rerun must redo that partition (not list the damaged shard in a
new manifest), and `tokshard status` must say beforehand that it will.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support import cli, plain_encode, run_prepare, stream_of, write_jsonl

from pipeline.format.verify import verify


@pytest.fixture(scope="module")
def finished(tmp_path_factory, docs, tokenizer_path, dask_client):
    """A finished run of several partitions, kept pristine; each test works on a copy."""
    d = tmp_path_factory.mktemp("kept")
    write_jsonl(d / "in.jsonl", docs[:80])
    raw = {
        "tokenizer": str(tokenizer_path),
        "sources": {"d": {"type": "files", "paths": [str(d / "in.jsonl")], "partition_bytes": 40_000}},
    }
    run_prepare(raw, d / "out", dask_client)
    return d, raw


@pytest.fixture
def rerun_folder(finished, tmp_path):
    d, raw = finished
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    (out / "manifest.json").unlink()
    shards = sorted(out.glob("d/train/*.bin"))
    assert len(shards) >= 3
    return out, raw, shards[1]


def flip_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "deleted .idx": lambda shard: shard.with_suffix(".idx").unlink(),
    "deleted .bin": lambda shard: shard.unlink(),
    "flipped byte in .bin": flip_byte,
    "flipped byte in .idx": lambda shard: flip_byte(shard.with_suffix(".idx")),
    "cut .bin": lambda shard: shard.write_bytes(shard.read_bytes()[:-2]),
    "cut .idx": lambda shard: shard.with_suffix(".idx").write_bytes(
        shard.with_suffix(".idx").read_bytes()[:-8]
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_rerun_redoes_a_kept_shard_that_differs_from_its_checkpoint(
    rerun_folder, docs, tokenizer_path, dask_client, damage
):
    out, raw, shard = rerun_folder
    DAMAGE[damage](shard)
    path = run_prepare(raw, out, dask_client)
    faults, _ = verify(path)
    assert faults == []
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, docs[:80]))


def test_status_says_a_rerun_will_redo_the_damaged_partition(rerun_folder):
    out, _, shard = rerun_folder
    flip_byte(shard)
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert s["rerun"].startswith("redo 1 partitions whose shards do not match their checkpoints")
    assert f"{shard.name} differs from its checkpoint" in s["rerun"]
    assert s["splits"]["d/train"]["pending"] == 1
    text = cli("status", str(out), check=True).stdout
    assert "a rerun would: redo 1 partitions whose shards do not match" in text


def test_status_of_undamaged_kept_shards_says_only_the_manifest_is_left(rerun_folder):
    out, _, _ = rerun_folder
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert s["rerun"] == "write the manifest (all partitions are done)" and s["damaged"] == []


@pytest.mark.parametrize("damage", ["deleted .bin", "deleted .idx", "cut .bin", "cut .idx"])
def test_a_finished_folder_whose_shard_went_missing_is_mended_by_its_rerun(
    finished, tmp_path, docs, tokenizer_path, dask_client, damage
):
    """Its manifest still there: status said nothing was left and the rerun did nothing, so the
    shard stayed missing while `inspect` said to rerun prepare. Both look at every shard's size
    now (content is `verify`'s); the rerun redoes that partition and writes the manifest again."""
    d, raw = finished
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    shard = sorted(out.glob("d/train/*.bin"))[1]
    DAMAGE[damage](shard)
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert s["rerun"].startswith("redo 1 partitions whose shards do not match their checkpoints"), s
    assert not s["complete"]
    said: list[str] = []
    path = run_prepare(raw, out, dask_client, log=said.append)
    assert any("is complete, but 1 partitions' shards are missing or cut since" in m for m in said), said
    assert verify(path)[0] == []
    assert np.array_equal(stream_of(path), plain_encode(tokenizer_path, docs[:80]))


def test_status_of_a_finished_folder_with_a_manifest_that_is_not_its_own_says_the_rerun_writes_one(
    finished, tmp_path
):
    d, _ = finished
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    (out / "manifest.json").write_text("{bad")
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert s["rerun"] == (
        "write the manifest again from the run's records (all partitions are done; the one there: not "
        "readable JSON: cut short or damaged)"
    )
    assert not s["complete"]


def test_a_finished_folder_whose_manifest_was_edited_gets_it_written_again_by_its_rerun(
    finished, tmp_path, dask_client
):
    """A shard's count edited in manifest.json: `train` and `verify` refuse it and say to re-run
    prepare, but the rerun said "already complete; nothing to do" and `status` "nothing", so the
    edit stayed. Both see it now; the rerun says so and writes the run's own manifest again."""
    d, raw = finished
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    path = out / "manifest.json"
    written = json.loads(path.read_text())
    edited = json.loads(path.read_text())
    edited["shards"][0]["tokens"] += 1
    path.write_text(json.dumps(edited, indent=1))
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert s["rerun"].startswith("write the manifest again from the run's records"), s["rerun"]
    assert "edited since `tokshard prepare` wrote it" in s["rerun"] and not s["complete"]
    said: list[str] = []
    assert run_prepare(raw, out, dask_client, log=said.append) == path
    assert any("is not the one the run wrote (edited since" in m for m in said), said
    again = json.loads(path.read_text())
    assert {k: v for k, v in again.items() if k not in ("created", "checksum")} == {
        k: v for k, v in written.items() if k not in ("created", "checksum")
    }
    assert verify(path)[0] == []
    assert json.loads(cli("status", str(out), "--json", check=True).stdout)["complete"]


def test_a_finished_folder_whose_manifest_has_no_checksum_is_said_to_have_none_not_to_be_edited(
    finished, tmp_path, dask_client
):
    """An older format's manifest, or one whose checksum field was deleted: nothing says it was
    edited, yet status and the rerun called it "edited ... its checksum does not match"."""
    d, raw = finished
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    path = out / "manifest.json"
    unsealed = json.loads(path.read_text())
    del unsealed["checksum"]
    path.write_text(json.dumps(unsealed, indent=1))
    s = json.loads(cli("status", str(out), "--json", check=True).stdout)
    assert "the one there: without a checksum" in s["rerun"] and "edited" not in s["rerun"], s["rerun"]
    said: list[str] = []
    assert run_prepare(raw, out, dask_client, log=said.append) == path
    assert any("is not the one the run wrote (without a checksum: an older" in m for m in said), said
    assert verify(path)[0] == []


def test_a_finished_run_whose_manifest_and_input_are_both_gone_is_told_to_restore_the_input(
    tmp_path, docs, tokenizer_path, dask_client
):
    """Its refusal said "restore it or use a new --out": a new --out cannot be made without the
    input either. The line says the run is done and what writing its manifest needs."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:20])
    raw = {"tokenizer": str(tokenizer_path), "sources": {"data": {"type": "files", "paths": [str(data)]}}}
    out = tmp_path / "out"
    run_prepare(raw, out, dask_client)
    (out / "manifest.json").unlink()
    data.rename(tmp_path / "in.hidden")
    want = (
        f"input {data} is gone since this run started; every partition of {out} is done, but its manifest "
        "is missing, and writing it needs the inputs as they were (the encoder check reads their first "
        "documents): restore it, then rerun"
    )
    assert json.loads(cli("status", str(out), "--json", check=True).stdout)["rerun"] == f"refuse: {want}"
    rerun = cli("prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(out))
    assert rerun.returncode == 1 and rerun.stderr == f"tokshard: error: {want}\n", rerun.stderr
    assert not (out / "manifest.json").exists()


# --- 16. skipped bad records are said, not only counted in the manifest ----------------------------


def test_the_final_line_and_status_say_how_many_records_were_skipped_and_why(tmp_path, docs, tokenizer_path):
    lines = [json.dumps({"text": d}) for d in docs[:10]]
    lines[2] = '{"text": "unterminated'
    lines[5] = '{"text": "unterminated too'
    lines[7] = '{"body": "wrong field"}'
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    proc = cli(
        "prepare", "--input", "in.jsonl", "--tokenizer", str(tokenizer_path), "--out", "out",
        "--on-bad-record", "skip", "--workers", "1", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = "skipped 3 bad records (2 malformed JSON, 1 missing field 'text')"
    assert proc.stdout.strip().splitlines()[-1].endswith(said), proc.stdout
    status = cli("status", str(tmp_path / "out"), check=True).stdout
    assert said in status
