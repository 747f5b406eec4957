"""A container registry on 127.0.0.1 speaking the OCI distribution API the way ghcr.io and Docker Hub do.

    with FakeRegistry() as reg:
        reg.push("tunebot/runner", "0.1.0", layers=[2_000_000_000, 900_000_000])   # a public image
        reg.push("acme/private", "1", private=True)                              # only for reg.users
        image = reg.image("tunebot/runner", "0.1.0")   # "127.0.0.1:<port>/tunebot/runner:0.1.0"

Token auth as the big registries do it: ``/v2/<name>/manifests/<ref>`` without a bearer token answers 401
with ``WWW-Authenticate: Bearer realm=".../token",service="fake-registry",scope="repository:<name>:pull"``;
``GET /token`` hands out a token, anonymously or with HTTP basic credentials (``users``); a token that does
not grant the repository (private, or unknown: registries do not say which) gets 401 ``UNAUTHORIZED``; a
granted one gets the manifest, 404 ``MANIFEST_UNKNOWN`` for a tag that was never pushed. Pushed tags are
an image index (linux/amd64) pointing at a manifest whose layers have the given sizes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Repo:
    private: bool = False
    blobs: dict[str, bytes] = field(default_factory=dict)  # digest -> manifest or index bytes
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest of what it points at


class FakeRegistry:
    def __init__(self, *, users: dict[str, str] | None = None) -> None:
        self.users = dict(users or {})
        self.repos: dict[str, Repo] = {}
        self.tokens: dict[str, tuple[str | None, set[str]]] = {}  # token -> (user, repositories granted)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- test controls -------------------------------------------------------------------------------
    def push(self, name: str, tag: str, *, layers: list[int] | None = None, private: bool = False) -> str:
        """Publish an image (an index over one linux/amd64 manifest); returns the index digest."""
        repo = self.repos.setdefault(name, Repo(private=private))
        repo.private = private
        sizes = layers if layers is not None else [1_500_000_000, 400_000_000]
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "size": 7023,
                    "digest": _digest(f"{name}:{tag}:config".encode()),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "size": size,
                        "digest": _digest(f"{name}:{tag}:{i}".encode()),
                    }
                    for i, size in enumerate(sizes)
                ],
            }
        ).encode()
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": INDEX,
                "manifests": [
                    {
                        "mediaType": MANIFEST,
                        "size": len(manifest),
                        "digest": _digest(manifest),
                        "platform": {"architecture": "amd64", "os": "linux"},
                    }
                ],
            }
        ).encode()
        with self.lock:
            repo.blobs[_digest(manifest)] = manifest
            repo.blobs[_digest(index)] = index
            repo.tags[tag] = _digest(index)
        return _digest(index)

    def image(self, name: str, tag: str) -> str:
        return f"{self.host}/{name}:{tag}"

    def count(self, path_part: str) -> int:
        with self.lock:
            return sum(1 for _, p, _ in self.requests if path_part in p)

    # -- server ---------------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> FakeRegistry:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _handle(self) -> None:
                status, headers, body = registry.route(self.command, self.path, dict(self.headers.items()))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                with registry.lock:
                    registry.requests.append((self.command, self.path, status))

            do_GET = do_HEAD = _handle  # noqa: N815 - http.server's naming

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeRegistry:
        return self if self._server else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API --------------------------------------------------------------------------------------
    def route(self, method: str, raw_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(raw_path)
        lower = {k.lower(): v for k, v in headers.items()}
        if parts.path == "/token":
            return self._token(parse_qs(parts.query), lower.get("authorization"))
        if parts.path == "/v2/":
            return 200, {"Docker-Distribution-Api-Version": "registry/2.0"}, b"{}"
        match = re.fullmatch(r"/v2/(.+)/manifests/([^/]+)", parts.path)
        if not match:
            return self._error(404, "NOT_FOUND", "no such route")
        name, ref = match.groups()
        auth = lower.get("authorization", "")
        grant = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
        if grant is None:
            return self._challenge(name)
        if name not in grant[1]:  # private, or unknown: a registry does not say which
            return self._challenge(name, code="UNAUTHORIZED", message="authentication required")
        repo = self.repos[name]
        digest = ref if ref.startswith("sha256:") else repo.tags.get(ref)
        body = repo.blobs.get(digest or "")
        if body is None:
            return self._error(404, "MANIFEST_UNKNOWN", f"manifest unknown: {name}:{ref}")
        kind = json.loads(body)["mediaType"]
        return 200, {"Content-Type": kind, "Docker-Content-Digest": digest or ""}, body

    def _token(
        self, query: dict[str, list[str]], authorization: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        user = None
        if authorization and authorization.startswith("Basic "):
            name, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            if self.users.get(name) != password:
                return self._error(401, "UNAUTHORIZED", "incorrect username or password")
            user = name
        granted = set()
        for scope in query.get("scope", []):
            _, repo_name, _ = scope.split(":", 2) if scope.count(":") >= 2 else ("", "", "")
            repo = self.repos.get(repo_name)
            if repo is not None and (not repo.private or user is not None):
                granted.add(repo_name)
        token = secrets.token_urlsafe(16)
        with self.lock:
            self.tokens[token] = (user, granted)
        body = json.dumps({"token": token, "access_token": token}).encode()
        return 200, {"Content-Type": "application/json"}, body

    def _challenge(
        self, name: str, *, code: str = "UNAUTHORIZED", message: str = "authentication required"
    ) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = self._error(401, code, message)
        headers["WWW-Authenticate"] = (
            f'Bearer realm="{self.url}/token",service="fake-registry",scope="repository:{name}:pull"'
        )
        return status, headers, body

    @staticmethod
    def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
        return status, {"Content-Type": "application/json"}, body
