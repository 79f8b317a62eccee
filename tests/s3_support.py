"""A real S3 API server for the object-store tests: moto's standalone `moto_server`, started by
the tests on 127.0.0.1 and a free port. Clients find it the way users' tools find S3: through
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server_command() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    return [str(exe)] if exe.exists() else [shutil.which("moto_server") or "moto_server"]


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to talk to this server (and nothing else)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials(self.env))

    def new_bucket(self) -> str:
        name = f"tokshard-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key (relative to prefix) -> bytes."""
        s3 = self.client()
        found = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                found[key[len(prefix) :].lstrip("/")] = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return found


def _boto_credentials(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


@contextlib.contextmanager
def moto_server(extra_env: dict[str, str] | None = None) -> Iterator[S3Server]:
    port = free_port()
    proc = subprocess.Popen(
        [*moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(extra_env or {})},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield S3Server(endpoint, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def session_server() -> Iterator[S3Server]:
    """One server for the session (conftest's ``s3_server`` fixture); the test process's
    environment points at it."""
    with moto_server() as server:
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
