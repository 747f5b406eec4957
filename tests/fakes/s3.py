"""An S3-compatible server on 127.0.0.1 (moto in server mode) for any test area.

    from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (in a conftest.py)

    def test_x(s3_bucket):   # "s3://tb-<random>": a fresh bucket; AWS_* variables point at the server
        ...

One moto_server process serves the whole session; each test gets its own bucket. The AWS_* variables
(endpoint, keys, region) are set for the test, so botocore, s3fs and the bot's Settings all find it, and
s3fs's instance cache is cleared so no test talks to a server another test started.

That server takes any key. ``s3_with_keys`` is one that checks them, as S3 does: a second moto_server with
IAM authentication on, a bucket, and the keys of a user who may write there and of one who may only read
(``AuthedS3``); any other key is refused (InvalidAccessKeyId, SignatureDoesNotMatch).
"""

from __future__ import annotations

import json
import os
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
    def __init__(self, *, unauthenticated_actions: int | None = None) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        server = Path(sys.executable).parent / "moto_server"
        env = dict(os.environ)
        if unauthenticated_actions is not None:  # moto checks keys against its IAM after this many requests
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(unauthenticated_actions)
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
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
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "tunebot-test-key",
            "AWS_SECRET_ACCESS_KEY": "tunebot-test-secret-4f1b",
            "AWS_DEFAULT_REGION": REGION,
        }

    def bucket(self) -> str:
        import boto3

        name = f"tb-{uuid.uuid4().hex[:12]}"
        boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id="x", aws_secret_access_key="x", region_name=REGION
        ).create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
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


class AuthedS3:
    """A moto server that checks keys: ``bucket`` ("s3://..."), ``writer`` and ``reader`` (key id, secret)."""

    SETUP_REQUESTS = 7  # create_bucket + (create_user, put_user_policy, create_access_key) x 2

    def __init__(self) -> None:
        import boto3

        self.server = MotoServer(unauthenticated_actions=self.SETUP_REQUESTS)
        kw = {
            "endpoint_url": self.server.url,
            "region_name": REGION,
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        name = f"tb-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", **kw).create_bucket(
            Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        iam = boto3.client("iam", **kw)
        self.bucket = f"s3://{name}"
        self.writer = self._user(iam, "writer", ["s3:*"])
        self.reader = self._user(iam, "reader", ["s3:GetObject", "s3:ListBucket", "s3:HeadObject"])

    @staticmethod
    def _user(iam: object, name: str, actions: list[str]) -> tuple[str, str]:
        allow = {"Effect": "Allow", "Action": actions, "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [allow]}
        iam.create_user(UserName=name)  # type: ignore[attr-defined]
        iam.put_user_policy(
            UserName=name,
            PolicyName="s3",  # type: ignore[attr-defined]
            PolicyDocument=json.dumps(policy),
        )
        key = iam.create_access_key(UserName=name)["AccessKey"]  # type: ignore[attr-defined]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def env(self, key: tuple[str, str]) -> dict[str, str]:
        """The AWS_* settings for these keys on this server."""
        return {
            "AWS_ENDPOINT_URL": self.server.url,
            "AWS_ACCESS_KEY_ID": key[0],
            "AWS_SECRET_ACCESS_KEY": key[1],
            "AWS_DEFAULT_REGION": REGION,
        }


@pytest.fixture(scope="session")
def s3_with_keys() -> Iterator[AuthedS3]:
    authed = AuthedS3()
    yield authed
    authed.server.stop()
