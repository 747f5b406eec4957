"""Cloudflare's R2 temporary-credentials endpoint on 127.0.0.1, minting credentials that really work.

    POST /client/v4/accounts/{account_id}/r2/temp-access-credentials   (Authorization: Bearer <API token>)
    {"bucket", "parentAccessKeyId", "permission", "ttlSeconds", "prefixes"?, "objects"?}
    -> {"success": true, "errors": [], "messages": [], "result": {"accessKeyId", "secretAccessKey",
        "sessionToken"}}

As Cloudflare documents it: ``permission`` is one of object-read-write, object-read-only, admin-read-write,
admin-read-only; ``ttlSeconds`` at most 604,800; a wrong token is 401 with Cloudflare's error shape. With
``mint`` (the enforcing moto of fakes/moto_sts.py) the credentials are made by STS AssumeRole with the session
policy those parameters mean, so that a test can use them against the store and see them scoped.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PERMISSIONS = ("object-read-write", "object-read-only", "admin-read-write", "admin-read-only")
PATH = re.compile(r"^/client/v4/accounts/([0-9a-f]{32})/r2/temp-access-credentials$")


def policy_for(body: dict[str, Any]) -> dict[str, Any]:
    """The IAM session policy an R2 temporary credential's parameters amount to."""
    bucket = body["bucket"]
    write = body["permission"].endswith("read-write")
    actions = ["s3:GetObject"] + (
        ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"] if write else []
    )
    prefixes, objects = body.get("prefixes") or [], body.get("objects") or []
    if not prefixes and not objects:  # the whole bucket
        prefixes = [""]
    resources = [f"arn:aws:s3:::{bucket}/{p}*" for p in prefixes] + [
        f"arn:aws:s3:::{bucket}/{o}" for o in objects
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": actions, "Resource": resources},
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {
                    "StringLike": {
                        "s3:prefix": [f"{p}*" for p in prefixes] + [p.rstrip("/") for p in prefixes]
                    }
                },
            },
            {"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [f"arn:aws:s3:::{bucket}"]},
        ],
    }


class FakeCloudflare:
    def __init__(
        self,
        *,
        token: str,
        account: str,
        mint: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        self.token, self.account, self.mint = token, account, mint
        self.requests: list[dict[str, Any]] = []
        self.refuse_next: dict[str, Any] | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, answer = fake.answer(self.path, self.headers.get("Authorization", ""), raw)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/client/v4"

    def __enter__(self) -> FakeCloudflare:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def _error(status: int, code: int, message: str) -> tuple[int, dict[str, Any]]:
        return status, {
            "success": False,
            "errors": [{"code": code, "message": message}],
            "messages": [],
            "result": None,
        }

    def answer(self, path: str, auth: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        match = PATH.match(path)
        if not match or match.group(1) != self.account:
            return self._error(404, 7003, "Could not route to this path")
        if auth != f"Bearer {self.token}":
            return self._error(401, 10000, "Authentication error")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, 10001, "invalid JSON")
        self.requests.append(body)
        if self.refuse_next is not None:
            refused, self.refuse_next = self.refuse_next, None
            return 400, refused
        ttl = body.get("ttlSeconds", 900)
        if (
            not isinstance(body.get("bucket"), str)
            or not isinstance(body.get("parentAccessKeyId"), str)
            or body.get("permission") not in PERMISSIONS
            or not isinstance(ttl, int)
            or not 0 < ttl <= 604_800
        ):
            return self._error(400, 10040, "invalid temporary credentials request")
        if self.mint is not None:
            creds = self.mint({**body, "ttlSeconds": ttl})
        else:
            creds = {
                "accessKeyId": f"r2tmp-{len(self.requests)}",
                "secretAccessKey": "r2-secret-" + "x" * 20,
                "sessionToken": "r2-session-" + "y" * 40,
            }
        return 200, {"success": True, "errors": [], "messages": [], "result": creds}


def minted_by(world: Any) -> Callable[[dict[str, Any]], dict[str, str]]:
    """A ``mint`` that makes real, scoped credentials on the enforcing moto (fakes/moto_sts.StsWorld)."""

    def mint(body: dict[str, Any]) -> dict[str, str]:
        sts = world.server.client("sts", world.key, world.secret)
        creds = sts.assume_role(
            RoleArn=world.role_arn,
            RoleSessionName="r2-temp",
            Policy=json.dumps(policy_for(body)),
            DurationSeconds=body["ttlSeconds"],
        )["Credentials"]
        return {
            "accessKeyId": creds["AccessKeyId"],
            "secretAccessKey": creds["SecretAccessKey"],
            "sessionToken": creds["SessionToken"],
        }

    return mint
