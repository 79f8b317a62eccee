"""What a store's client logs on its own (`pipeline.storage.object_store`): unreachable, a gs://
command printed about fifty lines of gcsfs's, two tracebacks among them, before its own one."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from support import free_port

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
