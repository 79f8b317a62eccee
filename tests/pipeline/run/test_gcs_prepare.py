"""gs:// through the same storage seam as s3://, against a real Google Cloud Storage JSON API
server (gcp-storage-emulator on 127.0.0.1, started here) reached through gcsfs."""

from __future__ import annotations

import json

import pytest
from support import SMALL, assert_same_as_local, cached_manifest, cli, gcs_emulator


@pytest.fixture(scope="module")
def gcs_server():
    pytest.importorskip("gcsfs")
    with gcs_emulator() as server:
        yield server


def test_prepare_to_gcs_gives_the_bytes_of_a_local_run_and_status_and_verify_read_it(
    gcs_server, store_setup, tmp_path
):
    """The emulator keeps no preconditions, as some stores do not: the run says once that a
    second `prepare` could not be refused, and goes on."""
    recipe, ref = store_setup
    bucket = gcs_server.new_bucket()
    url = f"gs://{bucket}/run"
    done = cli("prepare", str(recipe), "--out", url, cwd=tmp_path, env=gcs_server.env, check=True)
    assert done.stdout.startswith(f"{url}/manifest.json: ")
    warned = [ln for ln in done.stderr.splitlines() if "conditional writes" in ln]
    assert warned == [
        f"tokshard: {url}: this store ignores conditional writes (S3's If-None-Match, GCS's ifGenerationMatch), "
        "so a second `tokshard prepare` on it would not be refused while this one runs; start one at a time"
    ]
    assert_same_as_local(gcs_server, bucket, "run", ref)
    # gcsfs warns that it cannot ask this server for the bucket's type on every call: the driver
    # and each of its workers say it once (a run said it hundreds of times)
    assert done.stderr.count("Could not determine bucket type") <= 3, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [], "a URL made a local folder"
    status = cli("status", url, cwd=tmp_path, env=gcs_server.env, check=True).stdout
    assert "7 done, 0 partial, 0 pending" in status and "running: no" in status
    verified = cli("verify", f"{url}/manifest.json", cwd=tmp_path, env=gcs_server.env, check=True)
    assert verified.stdout.startswith("OK: ")


def test_train_reads_a_gcs_manifest_through_the_data_cache(gcs_server, tmp_path, tmp_path_factory):
    bucket = gcs_server.new_bucket()
    gcs_server.upload(cached_manifest(tmp_path_factory).parent, bucket, "data")
    cache, run = tmp_path / "cache", tmp_path / "run"
    args = ["--manifest", f"gs://{bucket}/data/manifest.json", "--data-cache", str(cache), *SMALL]
    done = cli("train", *args, "--steps", "2", "--run-dir", str(run), cwd=tmp_path, env=gcs_server.env)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s] == [1, 2]
    assert list(cache.rglob("*.bin")) and not list(cache.rglob("*.tmp"))
