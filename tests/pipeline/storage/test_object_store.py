"""What a store's client logs on its own (`pipeline.storage.object_store`): unreachable, a gs://
command printed about fifty lines of gcsfs's, two tracebacks among them, before its own one."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from faulty_store import faults_given, faulty_store
from support import free_port, web_folder

from pipeline.format.errors import TokshardError
from pipeline.storage.object_store import ObjectStore


async def _no_wait(_seconds: float) -> None:
    pass


def test_an_unreachable_gcs_store_is_tokshards_one_line_and_none_of_gcsfs(monkeypatch, caplog):
    retry = pytest.importorskip("gcsfs.retry")
    from gcsfs import GCSFileSystem

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "tokshard-tests")
    monkeypatch.setattr(retry, "asyncio", SimpleNamespace(sleep=_no_wait))  # its back-offs: 31 s
    GCSFileSystem.clear_instance_cache()  # one made for another endpoint
    try:
        with (
            caplog.at_level(logging.WARNING),
            pytest.raises(TokshardError, match=r"^cannot reach gs://bucket/run "),
        ):
            ObjectStore("gs://bucket/run").check_reachable()
    finally:
        GCSFileSystem.clear_instance_cache()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("gcsfs")] == []


@contextlib.contextmanager
def _through(s3_server, **faults) -> Iterator[str]:
    """The endpoint of a `faulty_store` in front of the tests' S3 server, which this process's
    S3 client then reaches (a client made for another endpoint is let go before and after)."""
    from s3fs import S3FileSystem

    with faulty_store(s3_server.endpoint, **faults) as endpoint:
        S3FileSystem.clear_instance_cache()
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        try:
            yield endpoint
        finally:
            os.environ["AWS_ENDPOINT_URL"] = s3_server.endpoint
            S3FileSystem.clear_instance_cache()


def _object(s3_server, size: int) -> tuple[str, bytes]:
    """A bucket's URL holding ``data.bin``, ``size`` bytes that differ from block to block."""
    bucket = s3_server.new_bucket()
    data = b"".join(i.to_bytes(4, "little") for i in range(size // 4))
    s3_server.client().put_object(Bucket=bucket, Key="data.bin", Body=data)
    return f"s3://{bucket}", data


def test_a_store_that_ignores_byte_ranges_is_one_line_for_each_read_of_part_of_an_object(s3_server, tmp_path):
    """A caching gateway that answers a Range with the whole object: fsspec took the whole for
    the range asked for, so the data cache, verify's download and a worker read wrong bytes."""
    url, data = _object(s3_server, 17 << 20)  # more than two of open_read's 8 MiB blocks
    with _through(s3_server, every=0, ignore_ranges=True):
        store = ObjectStore(url)
        with (
            pytest.raises(
                TokshardError,
                match=rf"^{url}/data.bin: the store answered a read of bytes \d+-\d+ with 17,825,792 bytes",
            ),
            store.open_read("data.bin") as f,
        ):
            while f.read(1 << 20):
                pass
        store.download("data.bin", tmp_path / "copy.bin")  # one answer, asked for whole
    assert (tmp_path / "copy.bin").read_bytes() == data


def test_a_whole_read_from_a_web_server_without_byte_ranges_is_the_whole_file(tmp_path):
    """A manifest served by Python's own file server (no Range): a copy made of 8 MiB ranges
    refused every shard larger than one, for verify, inspect and train alike (a download and
    the data cache's read from start to end)."""
    data = os.urandom(20 << 20)  # more than two of its 8 MiB reads
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "s.bin").write_bytes(data)
    with web_folder(tmp_path / "web") as url:
        store = ObjectStore(url)
        store.download("s.bin", tmp_path / "copy.bin")
        with store.open_read("s.bin") as f:  # the data cache's read, for train and inspect
            read = b"".join(iter(lambda: f.read(1 << 20), b""))
    assert (tmp_path / "copy.bin").read_bytes() == data
    assert read == data


def test_a_store_whose_answers_arrive_damaged_is_one_line_after_retries(s3_server):
    """A body cut short with a Content-Length that says so, and the whole object's checksum:
    botocore's FlexibleChecksumError came through every read as a traceback."""
    url, _ = _object(s3_server, 1 << 20)
    with _through(s3_server, every=0, cut_answers=True):
        store = ObjectStore(url)
        with pytest.raises(TokshardError) as raised, store.open_read("data.bin") as f:
            f.read()
    assert str(raised.value).startswith(
        f"the store's answers for {url}/data.bin kept failing the checksum it sent with them, after its "
        "client's retries"
    ), raised.value


def test_a_head_answered_503_is_tried_as_often_as_a_get(s3_server):
    """A HEAD's 503 has no body, so botocore's code for it is "503", not "SlowDown": s3fs tried it
    twice (botocore's two attempts) where a GET got ten, and the line said "what was written is
    kept" to a command that writes nothing."""
    url, _ = _object(s3_server, 1024)
    tries = {}
    for name, call in (("HEAD", lambda s: s.size("data.bin")), ("GET", lambda s: s.read_bytes("data.bin"))):
        with _through(s3_server, every=1, faults=("slow-down",)) as endpoint:
            with pytest.raises(
                TokshardError, match=rf"^the store kept failing on {url}/data.bin after"
            ) as raised:
                call(ObjectStore(url))
            tries[name] = faults_given(endpoint)
            assert "written" not in str(raised.value)
    assert tries["HEAD"] == tries["GET"] == 10, tries
