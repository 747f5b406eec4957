"""An S3-compatible server on 127.0.0.1 (moto in server mode) for any test area.

    from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (in a conftest.py)

    def test_x(s3_bucket):   # "s3://tb-<random>": a fresh bucket; AWS_* variables point at the server
        ...

One moto_server process serves the whole session; each test gets its own bucket. The AWS_* variables
(endpoint, keys, region) are set for the test, so botocore, s3fs and the bot's Settings all find it, and
s3fs's instance cache is cleared so no test talks to a server another test started.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REGION = "eu-west-1"  # moto refuses creating a us-east-1 bucket with a location constraint


class MotoServer:
    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        server = Path(sys.executable).parent / "moto_server"
        self.proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "tunebot-test-key",
                "AWS_SECRET_ACCESS_KEY": "tunebot-test-secret-4f1b", "AWS_DEFAULT_REGION": REGION}

    def bucket(self) -> str:
        import boto3

        name = f"tb-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.url, aws_access_key_id="x", aws_secret_access_key="x",
                     region_name=REGION).create_bucket(
            Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket as "s3://<name>", with the AWS_* environment pointing at the session's server."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    import s3fs

    from bot.settings import get_settings

    s3fs.S3FileSystem.clear_instance_cache()  # s3fs caches clients regardless of the environment
    get_settings.cache_clear()
    yield f"s3://{s3_server.bucket()}"
    s3fs.S3FileSystem.clear_instance_cache()  # nor may a later test get one that points here
    get_settings.cache_clear()
