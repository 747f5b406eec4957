"""moto in server mode with authentication on and STS session policies enforced, as AWS does.

moto checks an assumed role's own IAM policies but ignores the inline session ``Policy`` of AssumeRole
and the credentials' expiry; tunebot's scoped credentials are exactly a session policy with a lifetime.
This server (``python tests/fakes/moto_sts.py -H 127.0.0.1 -p PORT``) patches moto's S3 authorisation so
that a request made with assumed-role credentials must also be allowed by the session policy (Action and
Resource with wildcards, ``StringLike`` on ``s3:prefix`` for listings, each key of a multi-object delete)
and is refused once the credentials expired. The rest is moto.

    server = StsMoto()            # starts it; authentication is off while the fixture sets up IAM
    server.enforce()              # from here on every request is authenticated and authorised

A fixture (``sts_s3``) creates the bot's IAM user (its long-lived keys), a role the bot may assume with
an inline policy allowing all of S3 on the bucket, and the bucket.
"""

from __future__ import annotations

import fnmatch
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

REGION = "eu-west-1"


# ---- the patch (runs inside the server process) -----------------------------------------------------------


def _matches(patterns: Any, value: str) -> bool:
    items = patterns if isinstance(patterns, list) else [patterns]
    return any(fnmatch.fnmatchcase(value.lower(), str(p).lower()) for p in items)


def _condition_ok(condition: dict[str, Any] | None, context: dict[str, str]) -> bool:
    for operator, pairs in (condition or {}).items():
        for key, expected in pairs.items():
            actual = context.get(key)
            if actual is None:
                return False  # AWS: a condition on a key the request does not have is not met
            if operator == "StringLike" and not _matches(expected, actual):
                return False
            if operator == "StringEquals" and actual not in (
                expected if isinstance(expected, list) else [expected]
            ):
                return False
            if operator not in ("StringLike", "StringEquals"):
                return False
    return True


def session_allows(policy: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    """AWS's evaluation of one policy: an explicit Deny wins, else some Allow must match."""
    statements = policy.get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    allowed = False
    for st in statements:
        if not _matches(st.get("Action", []), action) or not _matches(st.get("Resource", []), resource):
            continue
        if not _condition_ok(st.get("Condition"), context):
            continue
        if st.get("Effect") == "Deny":
            return False
        allowed = True
    return allowed


CLOCK_FILE_ENV = "TUNEBOT_FAKE_STS_CLOCK_FILE"


def _clock_ahead() -> Any:
    """How far the test has moved this server's clock forward (``StsMoto.advance_clock``): credentials
    are issued and their expiry checked on that clock, so a test waits for no real lifetime to pass."""
    import datetime
    import os

    path = os.environ.get(CLOCK_FILE_ENV)
    try:
        seconds = float(Path(path).read_text()) if path else 0.0
    except (OSError, ValueError):
        seconds = 0.0
    return datetime.timedelta(seconds=seconds)


def _patch() -> None:
    import datetime

    import moto.sts.models as sts_models
    import xmltodict
    from moto.iam import access_control as ac
    from moto.s3.exceptions import S3AccessDeniedError
    from moto.sts.models import sts_backends

    real_utcnow = sts_models.utcnow
    sts_models.utcnow = lambda: real_utcnow() + _clock_ahead()  # credentials are issued on that clock too
    original = ac.S3IAMRequest.check_action_permitted

    def check_action_permitted(self: Any, resource: str) -> None:
        original(self, resource)  # the role's (or user's) own policies, as moto does
        key = self._access_key
        if not isinstance(key, ac.AssumedRoleAccessKey):
            return
        role = next(
            r
            for r in sts_backends[key.account_id][key.partition].assumed_roles
            if r.access_key_id == key._access_key_id
        )
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + _clock_ahead()
        if role.expiration < now:
            raise S3AccessDeniedError()  # expired credentials
        if not role.policy:
            return
        policy = json.loads(role.policy)
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self._path).query, keep_blank_values=True).items()}
        context = {"s3:prefix": query["prefix"]} if "prefix" in query else {}
        resources = [resource]
        if self._action == "s3:DeleteObject" and resource.count("/") == 0:  # a multi-object delete
            body = xmltodict.parse(self._body or b"<Delete/>")
            objects = (body.get("Delete") or {}).get("Object") or []
            objects = objects if isinstance(objects, list) else [objects]
            resources = [f"{resource}/{o['Key']}" for o in objects]
        for res in resources:
            if not session_allows(policy, self._action, res, context):
                raise S3AccessDeniedError()

    ac.S3IAMRequest.check_action_permitted = check_action_permitted


def main() -> None:
    _patch()
    from moto.server import main as moto_main

    moto_main(sys.argv[1:])


# ---- the test side --------------------------------------------------------------------------------------


class StsMoto:
    """The patched moto server on a free loopback port (authentication off until ``enforce()``)."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        import os
        import tempfile

        self.clock_file = Path(tempfile.mkdtemp(prefix="tunebot-sts-clock-")) / "ahead"
        self.clock_file.write_text("0")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, CLOCK_FILE_ENV: str(self.clock_file)},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.proc.kill()
                    raise RuntimeError("moto (STS) did not start") from None
                time.sleep(0.1)

    def advance_clock(self, seconds: float) -> None:
        """Move the server's clock (the one expiry is checked on) ``seconds`` further ahead."""
        ahead = float(self.clock_file.read_text())
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(str(ahead + seconds))
        tmp.replace(self.clock_file)

    def enforce(self, on: bool = True) -> None:
        import httpx

        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0" if on else b"inf").raise_for_status()

    def client(self, service: str, key: str = "x", secret: str = "x", token: str | None = None) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            aws_session_token=token,
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class StsWorld:
    """The bot's IAM user and keys, the role it assumes for runners, the bucket; authentication on."""

    def __init__(self, server: StsMoto) -> None:
        self.server = server
        server.enforce(False)
        self.bucket = f"tb-{uuid.uuid4().hex[:12]}"
        iam = server.client("iam")
        user = f"tunebot-bot-{uuid.uuid4().hex[:6]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(
            UserName=user,
            PolicyName="bot",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": ["s3:*", "sts:AssumeRole", "sts:GetFederationToken"],
                            "Resource": "*",
                        }
                    ],
                }
            ),
        )
        keys = iam.create_access_key(UserName=user)["AccessKey"]
        self.key, self.secret = keys["AccessKeyId"], keys["SecretAccessKey"]
        user_arn = iam.get_user(UserName=user)["User"]["Arn"]
        role = iam.create_role(
            RoleName=f"tunebot-runner-{uuid.uuid4().hex[:6]}",
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"AWS": user_arn}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
        )
        self.role_arn = role["Role"]["Arn"]
        iam.put_role_policy(
            RoleName=role["Role"]["RoleName"],
            PolicyName="bucket",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": "s3:*",
                            "Resource": [f"arn:aws:s3:::{self.bucket}", f"arn:aws:s3:::{self.bucket}/*"],
                        }
                    ],
                }
            ),
        )
        server.client("s3").create_bucket(
            Bucket=self.bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        server.enforce(True)

    @property
    def env(self) -> dict[str, str]:
        """The bot's own environment: its long-lived keys, the endpoint, and the role runners get."""
        return {
            "AWS_ENDPOINT_URL": self.server.url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": REGION,
        }

    def s3(self, key: str | None = None, secret: str | None = None, token: str | None = None) -> Any:
        return self.server.client("s3", key or self.key, secret or self.secret, token)


@pytest.fixture(scope="session")
def sts_server() -> Iterator[StsMoto]:
    server = StsMoto()
    yield server
    server.stop()


@pytest.fixture
def sts_s3(sts_server: StsMoto, monkeypatch: pytest.MonkeyPatch) -> Iterator[StsWorld]:
    """A bucket on the enforcing server, the bot's keys in the environment (AWS_*), the runner role."""
    sts_server.clock_file.write_text("0")  # a clock an earlier test moved ahead starts again at now
    world = StsWorld(sts_server)
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    import s3fs

    from bot.settings import get_settings

    s3fs.S3FileSystem.clear_instance_cache()
    get_settings.cache_clear()
    yield world
    s3fs.S3FileSystem.clear_instance_cache()
    get_settings.cache_clear()


if __name__ == "__main__":
    main()
