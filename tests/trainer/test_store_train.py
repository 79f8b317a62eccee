"""Training from an s3:// manifest through the node's data cache, against a real S3 API server
(moto_server on 127.0.0.1, started by the tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, cli

from pipeline.format.content_hash import file_hash
from pipeline.storage.data_cache import DataCache, ShardFetcher

CONFIGS = REPO / "trainer" / "configs"


def cache_note(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("tokshard: data cache ")]
    return line


def cached_files(cache: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(cache)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in cache.rglob("*")
        if p.suffix in (".bin", ".idx")
    }


def test_train_from_an_s3_manifest_goes_through_the_cache_and_a_second_run_downloads_nothing(
    s3_manifest, tmp_path
):
    cache = tmp_path / "cache"
    common = ["train", "--manifest", s3_manifest, "--data-cache", str(cache)]
    common += ["--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny", "--seq-len", "32"]
    common += ["--steps", "2", "--micro-batch", "4", "--log-every", "1", "--eval-every", "2"]
    first = cli(*common, "--run-dir", str(tmp_path / "r1"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    n_shards = len(json.loads((next(cache.glob("views/*/manifest.json"))).read_text())["shards"])
    assert n_shards >= 8
    before = cached_files(cache)
    # the prefetch stops when the run ends: it may not have fetched every shard by then
    assert f"{len(before)} files downloaded" in cache_note(first.stdout)
    assert not list(cache.rglob("*.tmp"))
    second = cli(*common, "--run-dir", str(tmp_path / "r2"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    after = cached_files(cache)
    assert f"{len(after) - len(before)} files downloaded" in cache_note(second.stdout)
    assert {k: after[k] for k in before} == before, "a cached shard was replaced"
    steps = [json.loads(x) for x in (tmp_path / "r2" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s] == [1, 2]
    assert not (tmp_path / "s3:").exists()


def test_samples_origin_of_a_run_on_an_s3_manifest_reads_sidecars_through_the_cache(s3_manifest, tmp_path):
    cache, save = tmp_path / "cache", tmp_path / "ckpt"
    args = ["train", "--manifest", s3_manifest, "--data-cache", str(cache), "--save", str(save)]
    args += ["--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny", "--seq-len", "32"]
    args += ["--steps", "1", "--micro-batch", "4", "--eval-every", "0", "--run-dir", str(tmp_path / "r")]
    trained = cli(*args, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert not list(cache.rglob("*.origin")), "training alone fetches no sidecar"
    traced = cli("samples", str(save), "--steps", "1", "--origin", "--json")  # the run's cache, by its record
    assert traced.returncode == 0, traced.stderr
    origins = [d["origin"] for line in traced.stdout.splitlines() for d in json.loads(line)["documents"]]
    assert origins and all(o["input"].endswith("/train.jsonl") for o in origins)
    for o in origins:  # each names the start of its line in the input
        with open(o["input"], "rb") as f:
            f.seek(max(0, o["offset"] - 1))
            assert o["offset"] == 0 or f.read(1) == b"\n"
    assert list(cache.rglob("text/train/*.origin.ok")), "the sidecars come through the cache, checked"


def test_samples_of_a_run_on_an_s3_manifest_whose_data_cache_was_deleted_fetches_it_again(
    s3_manifest, tmp_path
):
    """It said "no manifest at CACHE/views/KEY/manifest.json": the checkpoint recorded only the
    cache's view, and the view held the URL. The checkpoint records the URL too now."""
    cache, save = tmp_path / "cache", tmp_path / "ckpt"
    args = ["train", "--manifest", s3_manifest, "--data-cache", str(cache), "--save", str(save)]
    args += ["--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny", "--seq-len", "32"]
    args += ["--steps", "1", "--micro-batch", "4", "--eval-every", "0", "--run-dir", str(tmp_path / "r")]
    assert cli(*args, cwd=tmp_path).returncode == 0
    before = cli("samples", str(save), "--steps", "1", "--json", check=True).stdout
    shutil.rmtree(cache)
    after = cli("samples", str(save), "--steps", "1", "--json")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before
    assert list(cache.rglob("manifest.json")), "fetched again into the cache the run used"


def test_a_corrupted_cached_shard_is_detected_and_fetched_again(s3_manifest, tmp_path):
    first = DataCache(tmp_path / "cache")
    m = first.open_manifest(s3_manifest)
    ShardFetcher(first, m).fetch_all()
    first.close()
    victim = m.shards[3]
    data = bytearray(victim.bin_path.read_bytes())
    data[10] ^= 0xFF
    victim.bin_path.write_bytes(bytes(data))
    again = DataCache(tmp_path / "cache", log=lambda msg: None)
    m2 = again.open_manifest(s3_manifest)
    ShardFetcher(again, m2).fetch_all()
    assert (again.stats.refetched_corrupt, again.stats.downloaded) == (1, 1)
    assert file_hash(victim.bin_path) == victim.hash


def test_a_cached_shard_changed_with_its_size_and_mtime_put_back_is_fetched_again(s3_manifest, tmp_path):
    """The check record held size, mtime and inode: a write that restores the first two (``touch
    -r``) kept the changed copy. The ctime, which no write can put back, is recorded too."""
    import os

    first = DataCache(tmp_path / "cache")
    m = first.open_manifest(s3_manifest)
    ShardFetcher(first, m).fetch_all()
    first.close()
    victim = m.shards[3].bin_path
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    with open(victim, "r+b") as f:  # the same inode, the same size
        f.write(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = DataCache(tmp_path / "cache", log=lambda msg: None)
    ShardFetcher(again, again.open_manifest(s3_manifest)).fetch_all()
    assert (again.stats.refetched_corrupt, again.stats.downloaded) == (1, 1)
    assert file_hash(victim) == m.shards[3].hash


def test_verify_of_a_manifest_url_hashes_every_cached_shard_before_training(s3_manifest, tmp_path):
    """``train --verify`` returned at once for a manifest URL; a cached copy that rotted, its stat
    record still matching, is named before any step."""
    from pipeline.format.errors import DataError
    from trainer.data import verify_cached

    cache = DataCache(tmp_path / "cache", log=lambda msg: None)
    m = cache.open_manifest(s3_manifest)
    fetcher = ShardFetcher(cache, m)
    m.ready = fetcher.ready
    verify_cached(m)  # fetches every shard (and sidecar) and finds them whole
    assert all(e.bin_path.is_file() and e.origin_path.is_file() for e in m.shards)
    victim = m.shards[2].bin_path
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    record = victim.with_name(victim.name + ".ok")  # as bit rot: the record still matches the stat
    stamp = json.loads(record.read_text())
    st = victim.stat()
    stamp.update(size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino)
    record.write_text(json.dumps(stamp))
    with pytest.raises(DataError) as named:
        verify_cached(m)
    assert f"{m.shards[2].rel_path}: .bin content hash differs" in str(named.value)
    assert str(named.value).endswith("delete that copy and run again to fetch it anew")


def test_two_processes_fill_one_cache_at_once_each_shard_downloaded_once(s3_manifest, tmp_path, s3_server):
    script = (
        "import json, sys\n"
        "from pipeline.storage.data_cache import DataCache, ShardFetcher\n"
        "c = DataCache(sys.argv[1]); m = c.open_manifest(sys.argv[2]); ShardFetcher(c, m).fetch_all()\n"
        "print(json.dumps({'downloaded': c.stats.downloaded, 'cached': c.stats.cached}))\n"
    )
    env = {"PYTHONPATH": str(REPO), **s3_server.env, "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "cache"), s3_manifest],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    check = DataCache(tmp_path / "cache")
    m = check.open_manifest(s3_manifest)
    assert sum(r["downloaded"] for r in results) == 2 * len(m.shards), results  # each file once
    for entry in m.shards:
        assert file_hash(entry.bin_path) == entry.hash and file_hash(entry.idx_path) == entry.idx_hash
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_the_size_limit_evicts_least_recently_used_shards_that_no_job_maps(s3_manifest, tmp_path):
    running = DataCache(tmp_path / "cache", limit=1)  # everything it fetched stays: it maps it
    m = running.open_manifest(s3_manifest)
    ShardFetcher(running, m).fetch_all()
    assert running.stats.evicted == 0 and all(e.bin_path.exists() for e in m.shards)
    one = m.shards[0].bytes + m.shards[0].idx_path.stat().st_size
    later = DataCache(tmp_path / "cache", limit=one)
    m2 = later.open_manifest(s3_manifest)
    later.ensure(m2, m2.shards[0])  # cached: no download, so nothing to make room for
    later.ensure(m2, m2.shards[-1])
    assert later.stats.evicted == 0, "a shard the running job maps was evicted"
    running.close()  # that job ended
    later.evict()
    kept = [e.rel_path for e in m2.shards if e.bin_path.exists()]
    assert set(kept) <= {m2.shards[0].rel_path, m2.shards[-1].rel_path} and m2.shards[-1].rel_path in kept


def test_the_trainers_data_path_imports_fsspec_only_for_a_url():
    code = (
        "import sys\n"
        "import trainer.data, trainer.remote, pipeline.storage.data_cache\n"
        "assert 'fsspec' not in sys.modules, 'fsspec imported without a URL'\n"
        "from pipeline.storage.object_store import ObjectStore\n"
        "ObjectStore('memory://x')\n"
        "assert 'fsspec' in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
