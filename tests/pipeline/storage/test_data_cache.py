"""The node's data cache as `tokshard train --manifest s3://... --data-cache DIR` meets it: a cache
folder of someone else's, a shard missing or replaced in the store, data prepared again at the
same URL, and a full disk. Each is one line (never a traceback), and no temporary file is left.
Against a real S3 API server (moto_server on 127.0.0.1, started by the tests)."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from faulty_store import FAULTS, faults_given, faulty_store
from support import REPO, cli, copy_run, corpus, run_prepare, upload_folder

from pipeline.format.errors import DataError, TokshardError
from pipeline.storage.data_cache import DataCache, DownloadStopped, ShardFetcher

CONFIGS = REPO / "trainer" / "configs"
TRAIN = ["--deepspeed", str(CONFIGS / "zero0-fp32.json"), "--model", "tiny", "--seq-len", "32"]
TRAIN += ["--steps", "2", "--micro-batch", "4", "--log-every", "1", "--eval-every", "0"]


def train(manifest: str, cache: Path, run_dir: Path):
    return cli("train", "--manifest", manifest, "--data-cache", str(cache), "--run-dir", str(run_dir), *TRAIN)


def one_line(proc) -> str:
    line = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert line.startswith("tokshard: error: "), proc.stderr
    return line


def temporary_files(cache: Path) -> list[Path]:
    return list(cache.rglob("*.tmp"))


def test_train_refuses_a_data_cache_folder_holding_other_files(tmp_path):
    cache = tmp_path / "home"
    cache.mkdir()
    (cache / "thesis.tex").write_text("mine")
    proc = train("s3://any-bucket/run/manifest.json", cache, tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: --data-cache {re.escape(str(cache))} holds thesis\.tex but no views/: the data cache "
        r"did not write it .*",
        one_line(proc),
    )
    assert [p.name for p in cache.iterdir()] == ["thesis.tex"]


def test_a_manifest_url_with_no_manifest_leaves_no_cache_folder(s3_server, tmp_path):
    """The refusal made the new --data-cache folder and its empty views/ first."""
    bucket = s3_server.new_bucket()
    cache = tmp_path / "new-cache"
    with pytest.raises(TokshardError, match=rf"no manifest at s3://{bucket}/run/manifest\.json"):
        DataCache(cache, log=lambda _: None).open_manifest(f"s3://{bucket}/run/manifest.json")
    assert not cache.exists()


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_shard_object_missing_or_replaced_at_train_time_is_one_line(
    s3_server, s3_manifest, tmp_path, change
):
    """Every training shard's object is changed after the manifest was written, so the first one
    the run needs meets it, with a cold cache."""
    url = copy_run(s3_server, s3_manifest)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    s3 = s3_server.client()
    for key in [k for k in s3_server.objects(bucket, "run/text/train/") if k.endswith(".bin")]:
        key = f"run/text/train/{key}"
        if change == "deleted":
            s3.delete_object(Bucket=bucket, Key=key)
        else:
            data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            data[64:128] = bytes(64)
            s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    cache = tmp_path / "cache"
    proc = train(url, cache, tmp_path / "r")
    assert proc.returncode == 1, proc.stderr
    line = one_line(proc)
    where = rf"s3://{bucket}/run/text/train/\d+-\d+\.bin"
    if change == "deleted":
        assert re.fullmatch(
            rf"tokshard: error: {where}: a shard the manifest lists is missing from the store .*", line
        )
    else:
        assert re.fullmatch(rf"tokshard: error: {where} changed since its manifest was read .*", line)
    assert not temporary_files(cache)
    assert not list(cache.rglob("text/train/*.bin")), "a shard that failed its check was kept"


def test_data_prepared_again_at_the_same_url_is_fetched_again_and_not_called_corrupt(
    s3_server, s3_manifest, tmp_path, docs, tokenizer_path, dask_client
):
    url = copy_run(s3_server, s3_manifest)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    cache = tmp_path / "cache"
    first = train(url, cache, tmp_path / "r1")
    assert first.returncode == 0, first.stderr
    unrecorded = sorted(cache.rglob("text/train/*.bin.ok"))[0]
    unrecorded.unlink()  # a copy with no record of its check (a cache an older tokshard filled)
    # the same sources and splits, other text (the documents in the other order)
    train_docs = corpus(tmp_path / "train.jsonl", docs[:150][::-1], copies=1)
    valid_docs = corpus(tmp_path / "valid.jsonl", docs[150:180][::-1], copies=1)
    splits = {"train": [str(train_docs)], "validation": [str(valid_docs)]}
    recipe = {
        "tokenizer": str(tokenizer_path),
        "shard_tokens": 25_000,
        "sources": {"text": {"type": "files", "splits": splits}},
    }
    upload_folder(s3_server, run_prepare(recipe, tmp_path / "again", dask_client).parent, bucket, "run")
    second = train(url, cache, tmp_path / "r2")
    assert second.returncode == 0, second.stderr
    out = second.stdout + second.stderr
    assert "corrupt" not in out and "damaged" not in out.replace("0 damaged on this disk", ""), out
    assert "is of an earlier version of the data (its manifest changed since the cache was filled)" in out
    assert f"{unrecorded.with_suffix('')} has no record of its check and is not the manifest's" in out
    (summary,) = [ln for ln in second.stdout.splitlines() if ln.startswith("tokshard: data cache ")]
    changed = int(re.search(r"(\d+) of an earlier version of the data", summary).group(1))
    assert changed >= 1 and "0 damaged on this disk fetched again" in summary, summary


def test_a_full_disk_under_the_data_cache_is_one_line_and_leaves_no_temporary_file(
    s3_manifest, tmp_path, tmpfs
):
    mount, _ = tmpfs
    disk = mount(tmp_path / "small", "160k")  # less than the run's shards
    cache = disk / "cache"
    proc = train(s3_manifest, cache, tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"tokshard: error: disk full writing the data cache {re.escape(str(cache))} \(.* MiB free.*\); free "
        r"space there, give --data-cache a folder on a larger disk, or bound it with --data-cache-limit",
        one_line(proc),
    )
    assert not temporary_files(cache)


def test_origins_of_a_manifest_url_are_read_from_sidecars_the_cache_fetched_and_checked(
    s3_manifest, tmp_path, tokenizer_path
):
    """`TrainingSamples.origin` over an s3:// manifest: each document's sidecar comes into the
    view folder (with its hash record) and names the line its text is read back from."""
    from tokenizers import Tokenizer

    from pipeline.format.shard_reader import Shard
    from trainer.api import TrainingSamples

    cache = tmp_path / "cache"
    api = TrainingSamples(s3_manifest, seq_len=32, global_batch=4, micro_batch=4, data_cache=cache)
    (m,) = api.manifests
    tok = Tokenizer.from_file(str(tokenizer_path))
    checked = 0
    for batch in itertools.islice(api, 3):
        for pieces in batch["documents"]:
            for piece in pieces:
                o = api.origin(piece.source, piece.document)
                ids = Shard(m.resolve(o["shard"]), m.dtype).document(o["shard_document"])
                with open(o["input"], "rb") as f:
                    f.seek(o["offset"])
                    assert (
                        tok.decode([i for i in ids.tolist() if i != m.eos_id])
                        == json.loads(f.readline())["text"]
                    )
                checked += 1
    assert checked >= 12
    sidecars = list(cache.rglob("text/train/*.origin"))
    assert sidecars and all(p.with_name(p.name + ".ok").is_file() for p in sidecars)


def test_a_sidecar_replaced_in_the_store_is_refused_by_its_hash_and_not_kept(
    s3_server, s3_manifest, tmp_path
):
    url = copy_run(s3_server, s3_manifest)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    s3 = s3_server.client()
    for key in [k for k in s3_server.objects(bucket, "run/text/train/") if k.endswith(".origin")]:
        key = f"run/text/train/{key}"
        data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        data[-1] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    cache = tmp_path / "cache"
    from trainer.api import TrainingSamples

    api = TrainingSamples(url, seq_len=32, global_batch=4, micro_batch=4, data_cache=cache)
    piece = next(iter(api))["documents"][0][0]
    with pytest.raises(DataError) as caught:
        api.origin(piece.source, piece.document)
    assert re.fullmatch(
        rf"s3://{bucket}/run/text/train/\d+-\d+\.origin changed since its manifest was read .*",
        str(caught.value),
    )
    assert not list(cache.rglob("*.origin")) and not temporary_files(cache)


def test_counts_from_many_loader_threads_add_up_exactly():
    """The trainer's loader threads and its prefetch thread fetch shards at once; the run's last
    line counts them all."""
    import sys
    import threading

    from pipeline.storage.data_cache import CacheStats

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        stats = CacheStats()

        def fetch_many() -> None:
            for _ in range(20_000):
                stats.add(downloaded=1, downloaded_bytes=3)

        threads = [threading.Thread(target=fetch_many) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert (stats.downloaded, stats.downloaded_bytes) == (160_000, 480_000)


def test_a_download_stopped_in_flight_keeps_no_file_and_counts_nothing(s3_manifest, tmp_path):
    cache = DataCache(tmp_path / "cache")
    m = cache.open_manifest(s3_manifest)
    stop = threading.Event()
    stop.set()
    with pytest.raises(DownloadStopped):
        cache.ensure(m, m.shards[0], stop)
    assert not m.shards[0].bin_path.exists() and not m.shards[0].idx_path.exists()
    assert not temporary_files(tmp_path / "cache") and not cache.holds(m.shards[0])
    assert cache.stats.downloaded == 0


def test_a_stopped_prefetch_leaves_whole_shards_only_and_its_count_is_what_it_kept(s3_manifest, tmp_path):
    """The run ends while the prefetch thread is still downloading (a short run on a big manifest):
    it stops, and the last line's counts are exactly the files now in the cache."""
    root = tmp_path / "cache"
    cache = DataCache(root)
    m = cache.open_manifest(s3_manifest)
    fetcher = ShardFetcher(cache, m)
    fetcher.start(list(m.shards))
    fetcher.stop()
    kept = [p for p in root.rglob("*") if p.suffix in (".bin", ".idx")]
    assert cache.stats.downloaded == len(kept)
    assert fetcher.not_fetched() == len(m.shards) - sum(p.suffix == ".bin" for p in kept)
    assert not temporary_files(root)
    summary = cache.stats.summary(root, fetcher.not_fetched())
    assert (f"; {fetcher.not_fetched()} shards not fetched (the run ended first)" in summary) == (
        fetcher.not_fetched() > 0
    )


def test_a_download_a_killed_process_left_is_deleted_by_the_next_one(s3_manifest, tmp_path):
    cache = DataCache(tmp_path / "cache")
    m = cache.open_manifest(s3_manifest)
    entry = m.shards[0]
    entry.bin_path.parent.mkdir(parents=True, exist_ok=True)
    abandoned = entry.bin_path.with_name(entry.bin_path.name + ".4242.139872.tmp")
    abandoned.write_bytes(b"half a shard")
    cache.ensure(m, entry)
    assert not abandoned.exists() and entry.bin_path.is_file()
    assert not temporary_files(tmp_path / "cache")


FETCH_ALL = """
import sys
from pipeline.storage.data_cache import DataCache, ShardFetcher
cache = DataCache(sys.argv[1])
ShardFetcher(cache, cache.open_manifest(sys.argv[2])).fetch_all()
"""


def test_shards_fetched_through_a_store_that_fails_every_few_requests_arrive_whole(
    s3_server, s3_manifest, tmp_path
):
    """Throttling (503 SlowDown), a 500 and a dropped connection, in turn on every 4th request:
    the store client's retries fetch every shard, byte for byte the stored object."""
    root = tmp_path / "cache"
    with faulty_store(s3_server.endpoint, every=4) as endpoint:
        env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": endpoint}
        proc = subprocess.run(
            [sys.executable, "-c", FETCH_ALL, str(root), s3_manifest], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert faults_given(endpoint) >= 2 * len(FAULTS)
    cache = DataCache(root)
    m = cache.open_manifest(s3_manifest)
    bucket, prefix = s3_manifest.removeprefix("s3://").split("/")[0], "run"
    stored = s3_server.objects(bucket, prefix)
    assert m.shards
    for e in m.shards:
        assert e.bin_path.read_bytes() == stored[e.rel_path], e.rel_path
        assert e.idx_path.read_bytes() == stored[e.rel_path.removesuffix(".bin") + ".idx"], e.rel_path
    assert not temporary_files(root)


def test_the_summary_says_one_shard_and_one_file_in_the_singular(tmp_path):
    """It said "1 files downloaded", "1 shards found cached"."""
    from pipeline.storage.data_cache import CacheStats

    line = CacheStats(downloaded=1, cached=1).summary(tmp_path, not_fetched=1)
    assert "1 file downloaded" in line and "1 shard found cached" in line and "1 shard not fetched" in line
    assert "2 shards found cached" in CacheStats(cached=2).summary(tmp_path)
