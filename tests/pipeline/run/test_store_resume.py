"""An interrupted `prepare` into an object store finishes on its FIRST rerun, whatever stopped it:
a kill -9, the endpoint losing its state, a finished shard or checkpoint lost. Against a real
S3 API server (moto_server on 127.0.0.1, started by the tests); every rerun is a fresh process,
as a user types it. One worker each: how many encode is not the point (each more boots its own
interpreter)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from support import (
    assert_same_as_local,
    cli,
    kill_group,
    local_output,
    moto_server,
    paused,
    start_prepare,
    wait_for,
)

PARTITIONS = 7  # store_setup's recipe


def finished_partitions(server, bucket: str) -> int:
    return len(server.objects(bucket, "run/.tokshard/parts/"))


def test_a_prepare_killed_midway_finishes_on_its_first_rerun(s3_server, store_setup):
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    proc = start_prepare(recipe, url, "--workers", "1")
    wait_for(lambda: finished_partitions(s3_server, bucket) >= 2, 120, "two finished partitions", proc)
    kill_group(proc)
    assert finished_partitions(s3_server, bucket) < PARTITIONS, "the run ended before the kill"
    rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1")
    assert rerun.returncode == 0, rerun.stderr
    assert_same_as_local(s3_server, bucket, "run", ref)


def test_lost_objects_are_redone_by_the_first_rerun_and_status_says_so(s3_server, store_setup):
    """After an interrupted run (no manifest yet), a finished partition's ``.idx`` lost in the
    store, and another's cut (a manifest was once published over such a shard), are found,
    said by `status`, and redone as in a local folder; another's checkpoint deleted by hand
    (as an older message advised) is simply done again."""
    recipe, ref = store_setup
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    cli("prepare", str(recipe), "--out", url, "--workers", "1", check=True)
    s3 = s3_server.client()
    for key in ("manifest.json", "text/train/00003-0000.idx", ".tokshard/parts/text/train/00005.json"):
        s3.delete_object(Bucket=bucket, Key=f"run/{key}")
    cut = "run/text/train/00001-0000.idx"
    whole = s3.get_object(Bucket=bucket, Key=cut)["Body"].read()
    s3.put_object(Bucket=bucket, Key=cut, Body=whole[: len(whole) // 2])
    status = json.loads(cli("status", url, "--json", check=True).stdout)
    cut_damage, lost = sorted(status["damaged"])
    assert re.fullmatch(r"partition \S+@900000-1200000: text/train/00003-0000\.idx is missing", lost)
    assert re.fullmatch(
        rf"partition \S+: text/train/00001-0000\.bin: its \.idx is {len(whole) // 2} bytes, its \d+ documents "
        rf"make {len(whole)}",
        cut_damage,
    )
    assert status["rerun"].startswith("redo 2 partitions whose shards do not match"), status["rerun"]
    assert ", start 1 pending partitions, then write the manifest" in status["rerun"], status["rerun"]
    rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1")
    assert rerun.returncode == 0, rerun.stderr
    assert f"{lost}; redoing that partition" in rerun.stderr and f"{cut_damage}; redoing" in rerun.stderr
    assert "delete" not in rerun.stderr
    assert_same_as_local(s3_server, bucket, "run", ref)


def finished_with_edited_manifest(s3_server, recipe, total: str) -> tuple[str, str]:
    """A finished store run (bucket, its URL) whose manifest's ``total`` was then edited by hand."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    cli("prepare", str(recipe), "--out", url, "--workers", "1", check=True)
    s3 = s3_server.client()
    doc = json.loads(s3.get_object(Bucket=bucket, Key="run/manifest.json")["Body"].read())
    doc["totals"][total] += 1
    s3.put_object(Bucket=bucket, Key="run/manifest.json", Body=json.dumps(doc).encode())
    return bucket, url


def test_a_finished_store_run_whose_manifest_was_edited_gets_it_written_again_by_its_rerun(
    s3_server, store_setup
):
    """As in a folder: the edited manifest was kept by "already complete; nothing to do"."""
    recipe, ref = store_setup
    bucket, url = finished_with_edited_manifest(s3_server, recipe, "tokens")
    status = json.loads(cli("status", url, "--json", check=True).stdout)
    assert "write the manifest again from the run's records" in status["rerun"], status["rerun"]
    rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1", check=True)
    assert "is not the one the run wrote (edited since" in rerun.stderr, rerun.stderr
    assert "already complete" not in rerun.stderr
    assert_same_as_local(s3_server, bucket, "run", ref)


def test_a_store_rerun_that_writes_the_manifest_again_checks_the_shards_contents_first(
    s3_server, store_setup
):
    """The manifest edited AND a shard's byte flipped at the same size: the rerun wrote the
    manifest again from the checkpoints, checking sizes only, exit 0, and `verify` then found
    the damage (a folder's rerun hashes the shards and redoes it). Writing the manifest vouches
    for the shards' contents: the store's rerun reads each once, says so, and redoes the partition;
    `status` says beforehand that it will check them."""
    recipe, ref = store_setup
    bucket, url = finished_with_edited_manifest(s3_server, recipe, "documents")
    s3 = s3_server.client()
    key = "run/text/train/00002-0000.bin"
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    status = json.loads(cli("status", url, "--json", check=True).stdout)
    assert status["rerun"].startswith(
        "check the contents of its shards against the run's records (reading each from the store once), "
        "redo the partitions of any that differ, then write the manifest again"
    ), status["rerun"]
    rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1", check=True)
    assert re.search(
        r"checking the contents of its \d+ shards against them first \(a repair: each is read "
        r"from the store once, [\d.]+[kM]?B in all\), then writing it again",
        rerun.stderr,
    ), rerun.stderr
    assert "text/train/00002-0000.bin differs from its checkpoint (content hash); redoing that partition" in (
        rerun.stderr
    ), rerun.stderr
    assert_same_as_local(s3_server, bucket, "run", ref)
    assert cli("verify", url).returncode == 0


def test_a_store_that_lost_its_state_midway_is_prepared_whole_by_the_first_rerun(store_setup):
    """The endpoint restarts empty (a store without persistence) while a run goes on: that run
    ends with one line, and once the bucket is there again the first rerun makes all of it."""
    recipe, ref = store_setup
    with moto_server() as server:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/run"
        proc = start_prepare(recipe, url, "--workers", "1", env=server.env)
        wait_for(lambda: finished_partitions(server, bucket) >= 1, 120, "a finished partition", proc)
        with paused(proc):
            assert not server.objects(bucket, "run/manifest.json"), "the run ended before the reset"
            urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/moto-api/reset", method="POST"))
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "Traceback" not in stderr, stderr
        assert stderr.strip().splitlines()[-1].startswith("tokshard: error: "), stderr
        server.client().create_bucket(Bucket=bucket)
        rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1", env=server.env)
        assert rerun.returncode == 0, rerun.stderr
        assert_same_as_local(server, bucket, "run", ref)


def test_a_prepare_whose_credentials_were_revoked_finishes_on_its_first_rerun_with_new_ones(store_setup):
    """A server that enforces IAM: the run's access key is deleted while it goes on (one line,
    no traceback); the first rerun with another key finishes, taking over the dead run's lease."""
    recipe, ref = store_setup
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as server:
        first, second = _two_access_keys(server)
        bucket = "tokshard-revoked"
        boto3_client(server, first, "s3").create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/run"
        proc = start_prepare(recipe, url, "--workers", "1", env={**server.env, **first})
        wait_for(
            lambda: finished_partitions_as(server, second, bucket) >= 1, 120, "a finished partition", proc
        )
        with paused(proc):
            assert "manifest.json" not in _keys_as(server, second, bucket), (
                "the run ended before the revocation"
            )
            boto3_client(server, second, "iam").delete_access_key(
                UserName="runner", AccessKeyId=first["AWS_ACCESS_KEY_ID"]
            )
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "Traceback" not in stderr, stderr
        assert stderr.strip().splitlines()[-1].startswith("tokshard: error: "), stderr
        rerun = cli("prepare", str(recipe), "--out", url, "--workers", "1", env={**server.env, **second})
        assert rerun.returncode == 0, rerun.stderr
        server_objects = {
            k: v for k, v in _objects_as(server, second, bucket).items() if not k.startswith(".tokshard/")
        }
        assert server_objects == {k: v for k, v in local_output(ref).items() if k != "manifest.json"} | {
            "manifest.json": server_objects["manifest.json"]
        }


def _two_access_keys(server) -> tuple[dict[str, str], dict[str, str]]:
    """Two access keys of one IAM user allowed everything (made in the server's first
    unauthenticated requests), as the environment variables a process reads."""
    iam = boto3_client(server, {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"}, "iam")
    iam.create_user(UserName="runner")
    allow_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="runner", PolicyName="all", PolicyDocument=json.dumps(allow_all))
    keys = [iam.create_access_key(UserName="runner")["AccessKey"] for _ in range(2)]
    first, second = (
        {"AWS_ACCESS_KEY_ID": k["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": k["SecretAccessKey"]} for k in keys
    )
    return first, second


def boto3_client(server, key: dict[str, str], service: str):
    import boto3

    return boto3.client(
        service,
        endpoint_url=server.endpoint,
        aws_access_key_id=key["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=key["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


def _keys_as(server, key: dict[str, str], bucket: str) -> list[str]:
    s3 = boto3_client(server, key, "s3")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="run/")
    return [obj["Key"][len("run/") :] for page in pages for obj in page.get("Contents", [])]


def _objects_as(server, key: dict[str, str], bucket: str) -> dict[str, bytes]:
    s3 = boto3_client(server, key, "s3")
    return {
        k: s3.get_object(Bucket=bucket, Key=f"run/{k}")["Body"].read() for k in _keys_as(server, key, bucket)
    }


def finished_partitions_as(server, key: dict[str, str], bucket: str) -> int:
    return sum(1 for k in _keys_as(server, key, bucket) if k.startswith(".tokshard/parts/"))


def test_a_store_task_whose_run_a_newer_prepare_took_over_during_its_uploads_records_nothing(
    s3_server, docs, tokenizer_path, tmp_path, monkeypatch
):
    """The task looked for a newer run before its uploads only: one that took the lease while
    they went on found the old run's partition recorded under its own plan."""
    from distributed import Client, LocalCluster
    from support import run_prepare, write_jsonl

    from pipeline.format.errors import TokshardError
    from pipeline.run import store_state
    from pipeline.run.records import Holder

    write_jsonl(tmp_path / "in.jsonl", docs[:40])
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/run"
    real_upload = store_state.ObjectStore.upload

    def upload_then_taken_over(store, local, rel):
        real_upload(store, local, rel)
        if rel.endswith(".bin"):  # the partition's first shard is up: a newer prepare takes the lease
            store.write_bytes(store_state.LEASE_FILE, Holder.of_this_process("newer").to_bytes())

    monkeypatch.setattr(store_state.ObjectStore, "upload", upload_then_taken_over)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "sources": {
            "d": {"type": "files", "paths": [str(tmp_path / "in.jsonl")], "partition_bytes": 1 << 30}
        },
    }
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c,
        Client(c) as cl,
        pytest.raises(TokshardError, match=r"a newer prepare took over .*; not recording it"),
    ):
        run_prepare(recipe, url, cl)
    assert not [k for k in s3_server.objects(bucket, "run/.tokshard/parts/") if k.endswith(".json")]
