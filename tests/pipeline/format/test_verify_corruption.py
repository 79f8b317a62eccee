"""`tokshard verify` catches every kind of damage, exits 1 and names the shard; a shard path
that leaves the manifest's folder, or a pipe where a shard file should be, is refused without
being opened."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from support import cli, run_prepare, write_jsonl

SHARD = "d/train/00000-0001"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, docs, tokenizer_path, dask_client) -> Path:
    d = tmp_path_factory.mktemp("verify")
    data = write_jsonl(d / "in.jsonl", docs[:40])
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 20_000,
        "sources": {"d": {"type": "files", "paths": [str(data)]}},
    }
    out = run_prepare(recipe, d / "out", dask_client).parent
    assert cli("verify", str(out)).returncode == 0
    return out


def flip_byte(out: Path) -> None:
    path = out / f"{SHARD}.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(suffix: str, keep: float):
    def damage(out: Path) -> None:
        path = out / f"{SHARD}{suffix}"
        os.truncate(path, int(path.stat().st_size * keep))

    return damage


def remove(suffix: str):
    return lambda out: (out / f"{SHARD}{suffix}").unlink()


#: what a clone of a repo made without git-lfs holds in place of a file
LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 40000\n"
)


def lfs_pointer(suffix: str):
    return lambda out: (out / f"{SHARD}{suffix}").write_bytes(LFS_POINTER)


def edit_manifest(out: Path) -> None:
    path = out / "manifest.json"
    doc = json.loads(path.read_text())
    doc["shards"][1]["tokens"] += 1
    path.write_text(json.dumps(doc, indent=1))


def resealed_totals(out: Path) -> None:
    """A manifest whose own checksum holds but whose totals are not its shards' sum (what a
    tool that edits manifests and re-seals them could write)."""
    from pipeline.format import manifest

    path = out / "manifest.json"
    doc = json.loads(path.read_text())
    doc.pop("checksum")
    doc["totals"]["tokens"] += 1
    path.write_text(json.dumps(manifest.sealed(doc), indent=1))


def origins_short_of_one(out: Path) -> None:
    """A well-formed sidecar that lists one document fewer than its .idx, with its hash
    re-recorded and the manifest re-sealed (what a tool that rewrote it could leave)."""
    from pipeline.format import manifest, provenance
    from pipeline.format.content_hash import bytes_hash

    side = provenance.read(out / f"{SHARD}.origin")
    short = provenance.Origins(side.inputs, side.input_of[:-1], side.place[:-1])
    raw = provenance.encode(short)
    (out / f"{SHARD}.origin").write_bytes(raw)
    path = out / "manifest.json"
    doc = json.loads(path.read_text())
    doc.pop("checksum")
    shard = next(s for s in doc["shards"] if s["path"] == f"{SHARD}.bin")
    shard["origin_hash"], shard["origin_bytes"] = bytes_hash(raw), len(raw)
    path.write_text(json.dumps(manifest.sealed(doc), indent=1))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (flip_byte, rf"FAULT {SHARD}\.bin: \.bin content hash differs"),
        (truncate(".bin", 0.5), rf"FAULT {SHARD}\.bin: \.bin is \d+ bytes, the manifest says \d+"),
        (truncate(".idx", 0.9), rf"FAULT {SHARD}\.bin: \.idx content hash differs"),
        (remove(".bin"), rf"FAULT {SHARD}\.bin: {Path(SHARD).name}\.bin is missing"),
        (remove(".idx"), rf"FAULT {SHARD}\.bin: {Path(SHARD).name}\.idx is missing"),
        (lfs_pointer(".bin"), rf"FAULT {SHARD}\.bin: \.bin is a Git LFS pointer, not the file; fetch it"),
        (lfs_pointer(".idx"), rf"FAULT {SHARD}\.bin: \.idx is a Git LFS pointer, not the file; fetch it"),
        (edit_manifest, r"FAULT .*manifest\.json: manifest was edited after prepare wrote it"),
        (resealed_totals, r"FAULT .*manifest\.json: totals .* disagree with the shard list"),
        (remove(".origin"), rf"FAULT {SHARD}\.bin: {Path(SHARD).name}\.origin \(provenance\) is missing"),
        (truncate(".origin", 0.8), rf"FAULT {SHARD}\.bin: {Path(SHARD).name}\.origin content hash differs"),
        (
            origins_short_of_one,
            rf"FAULT {SHARD}\.bin: {Path(SHARD).name}\.origin has (\d+) entries, the \.idx",
        ),
    ],
    ids=[
        "flipped-byte",
        "truncated-bin",
        "truncated-idx",
        "missing-bin",
        "missing-idx",
        "lfs-pointer-bin",
        "lfs-pointer-idx",
        "edited-manifest",
        "resealed-totals",
        "missing-origin",
        "truncated-origin",
        "origin-short-of-one",
    ],
)
def test_damage_is_found_named_and_exits_1(prepared, tmp_path, damage, expected):
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    damage(out)
    proc = cli("verify", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(expected, proc.stdout), proc.stdout


def point_outside(how: str):
    """Make the manifest reach a FIFO outside its folder: opening it would hang verify."""

    def damage(out: Path) -> str:
        fifo = out.parent / "outside.bin"
        os.mkfifo(fifo)
        path = out / "manifest.json"
        doc = json.loads(path.read_text())
        doc["shards"][0]["path"] = "../outside.bin" if how == "dotdot" else str(fifo)
        path.write_text(json.dumps(doc, indent=1))
        return doc["shards"][0]["path"]

    return damage


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_shard_path_leaving_the_folder_is_refused_unopened(prepared, tmp_path, how):
    out = tmp_path / "case" / "out"
    shutil.copytree(prepared, out)
    rel = point_outside(how)(out)
    proc = cli("verify", str(out), timeout=60)  # a read of the FIFO would block until the timeout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"shard path {rel!r} leaves the manifest's folder" in proc.stderr
    assert "refusing to open it" in proc.stderr


def pipe_in_place_of(out: Path, suffix: str, linked: bool) -> Path:
    """A FIFO where the shard's ``suffix`` file was: itself, or a link out of the folder to one."""
    path = out / f"{SHARD}{suffix}"
    path.unlink()
    fifo = out.parent / f"fifo{suffix}" if linked else path
    os.mkfifo(fifo)
    if linked:
        path.symlink_to(fifo)
    return path


@pytest.mark.parametrize("suffix", [".bin", ".idx", ".origin"])
@pytest.mark.parametrize("linked", [False, True], ids=["in-place", "linked-out"])
def test_verify_names_a_pipe_in_place_of_a_shard_file_unopened(prepared, tmp_path, suffix, linked):
    out = tmp_path / "case" / "out"
    shutil.copytree(prepared, out)
    pipe_in_place_of(out, suffix, linked)
    proc = cli("verify", str(out), timeout=60)  # an open of the FIFO would block until the timeout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(
        rf"FAULT {SHARD}\.bin: 00000-0001{suffix}( \(provenance\))? is a pipe, not a file", proc.stdout
    )


@pytest.mark.parametrize("command", ["inspect", "megatron-args"])
def test_read_commands_name_an_index_that_is_a_pipe_unopened(prepared, tmp_path, command):
    """`inspect` read the index of every shard and waited on the pipe forever."""
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    pipe_in_place_of(out, ".idx", linked=False)
    proc = cli(command, str(out), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "00000-0001.idx is a pipe" in proc.stderr.strip().splitlines()[-1]


def test_training_on_an_index_linked_to_a_device_is_refused_unread(prepared, tmp_path):
    """A link to /dev/zero would be read for ever (an index is read whole)."""
    from pipeline.format import manifest
    from pipeline.format.errors import DataError
    from trainer.data import ModelLimits, check_manifest

    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    idx = out / "d/train/00000-0000.idx"  # the first of its stream: its header is read at start-up
    idx.unlink()
    idx.symlink_to("/dev/zero")
    m = manifest.load(out / "manifest.json")
    with pytest.raises(
        DataError, match=r"00000-0000\.idx is a device \(through a symbolic link to /dev/zero\)"
    ):
        check_manifest(m, ModelLimits("tiny", 1 << 16, 1024), seq_len=64)


def test_shards_linked_into_a_cache_outside_the_folder_are_read(prepared, tmp_path):
    """DVC's symlink cache and git-annex replace every file with a link into their store."""
    from pipeline.format import manifest
    from trainer.data import ModelLimits, check_manifest

    out = tmp_path / "repo" / "out"
    shutil.copytree(prepared, out)
    store = tmp_path / "repo" / ".cache"
    store.mkdir()
    for i, path in enumerate(sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")):
        path.rename(store / str(i))
        path.symlink_to(store / str(i))
    assert cli("verify", str(out)).returncode == 0
    inspected = cli("inspect", str(out))
    assert inspected.returncode == 0 and "sample:" in inspected.stdout, inspected.stderr
    check_manifest(manifest.load(out / "manifest.json"), ModelLimits("tiny", 1 << 16, 1024), seq_len=64)


def test_an_unreadable_manifest_is_a_fault_not_a_usage_error(prepared, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    (out / "manifest.json").write_text('{"format": 1, "dtype": "uint16", "shards": [')
    proc = cli("verify", str(out))
    assert proc.returncode == 1
    assert "manifest.json: not a readable manifest" in proc.stderr


def test_inspect_of_a_shard_that_is_a_git_lfs_pointer_shows_no_sample(prepared, tmp_path):
    """`inspect` decoded the pointer's bytes as ids and showed them as the sample text."""
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    first = json.loads((out / "manifest.json").read_text())["shards"][0]["path"]
    (out / first).write_bytes(LFS_POINTER)
    proc = cli("inspect", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sample:" not in proc.stdout
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"tokshard: error: {first}: .bin is a Git LFS pointer")
    )


def test_training_on_a_shard_that_is_a_git_lfs_pointer_is_refused_before_any_step(prepared, tmp_path):
    from pipeline.format import manifest
    from pipeline.format.errors import DataError
    from trainer.data import ModelLimits, check_manifest

    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    (out / f"{SHARD}.bin").write_bytes(LFS_POINTER)
    m = manifest.load(out / "manifest.json")
    with pytest.raises(DataError, match=rf"{SHARD}\.bin is a Git LFS pointer, not the shard; fetch it"):
        check_manifest(m, ModelLimits("tiny", 1 << 16, 1024), seq_len=64)


def test_the_advice_for_a_damaged_shard_repairs_it(tmp_path, docs, tokenizer_path):
    """A shard of the right size with other bytes: verify said "re-run prepare", and the rerun
    (which checks a finished run's shard sizes, not contents) said "already complete". The line
    now says to delete the damaged files first, and doing so gives a sound folder."""
    data = write_jsonl(tmp_path / "in.jsonl", docs[:40])
    args = ["prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]
    cli(*args, "--workers", "1", check=True)
    (shard,) = (tmp_path / "o").rglob("*.bin")
    flipped = bytearray(shard.read_bytes())
    flipped[len(flipped) // 2] ^= 0x01
    shard.write_bytes(bytes(flipped))
    proc = cli("verify", str(tmp_path / "o"))
    assert proc.returncode == 1 and "delete the damaged files and re-run `tokshard prepare`" in proc.stderr
    named = [line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("FAULT ")]
    for name in named:
        (tmp_path / "o" / name).unlink()
    cli(*args, "--workers", "1", check=True)
    assert cli("verify", str(tmp_path / "o")).returncode == 0
