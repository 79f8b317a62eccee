"""A full disk or an unwritable output: one clear line naming the path and the space needed,
nothing committed is lost, and a rerun with room finishes with the same bytes.

The output lives on a tmpfs of our own with a size limit (needs root to mount; skipped
with the reason otherwise)."""

from __future__ import annotations

import re

from support import assert_same_output, checkpoints, cli, corpus, files_recipe, leftovers, reference

from pipeline.format.verify import verify


def test_disk_full_is_one_clear_line_and_a_rerun_with_room_finishes(
    tmp_path, tmpfs, docs, tokenizer_path, dask_client
):
    mount, remount = tmpfs
    data = corpus(tmp_path / "in.jsonl", docs, copies=4)
    recipe = files_recipe(
        tmp_path / "r.toml", tokenizer_path, data, partition_bytes=700_000, commit_seconds=0.2
    )
    ref = reference(recipe, tmp_path / "ref", dask_client).parent
    disk = mount(tmp_path / "small", "1200k")  # room for about half of the 2 MB of shards
    out = disk / "out"
    proc = cli("prepare", str(recipe), "--out", str(out), "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"tokshard: error: disk full writing {re.escape(str(out))}/\S+ \(\d+\.\d MiB free, about \d+\.\d MiB "
        r"more needed\); free space or move --out, then rerun: committed work is kept",
        error,
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    kept = {c["key"]: c["updated"] for c in checkpoints(out) if c["complete"]}
    assert kept, "partitions that fitted are committed"
    remount(disk, "size=64m")
    cli("prepare", str(recipe), "--out", str(out), "--workers", "1", check=True)
    assert {c["key"]: c["updated"] for c in checkpoints(out) if c["key"] in kept} == kept, (
        "committed work redone"
    )
    assert_same_output(ref, out)
    assert not leftovers(out)
    assert verify(out / "manifest.json")[0] == []


def test_an_unwritable_output_is_named_with_what_to_do(tmp_path, tmpfs, docs, tokenizer_path):
    mount, remount = tmpfs
    data = corpus(tmp_path / "in.jsonl", docs[:5], copies=1)
    disk = mount(tmp_path / "ro", "1m")
    remount(disk, "ro")
    proc = cli(
        "prepare", "--input", str(data), "--tokenizer", str(tokenizer_path), "--out", str(disk / "out")
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"tokshard: error: cannot write {disk / 'out' / 'manifest.json'}: Read-only file system; "
        "choose a place this user can write"
    )
