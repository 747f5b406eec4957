"""A fake Hugging Face Hub on 127.0.0.1: what ``HfApi(endpoint=...).create_repo`` and ``upload_folder`` call,
and what ``snapshot_download`` reads (repo info, the file tree, ``/{repo}/resolve/{revision}/{file}``).

Serves repo creation (``POST /api/repos/create``), the model card check (``/api/validate-yaml``), the
preupload check (every file "regular", so file
contents come inline in the commit: no LFS or Xet storage is needed) and the commit
(``POST /api/models/{repo}/commit/{revision}``, NDJSON). Each repo's files are kept in memory with its
visibility; requests without the expected bearer token get 401, like the Hub.

    with FakeHub(token="hf_test") as hub:
        HfApi(endpoint=hub.url, token="hf_test").upload_folder(...)
        hub.repos["me/model"].files["adapter_config.json"]
        hub.add_folder("meta-llama/Llama-3.2-1B-Instruct", tiny_model_dir)  # then snapshot_download it

Gated models (``hub.add_model("org/name", gated=True, granted={"hf_ok"})``) answer
``/{repo}/resolve/{revision}/{file}`` the Hub's way, whoever asks: only to a token whose account accepted the
license (401 without a token, 403 with another, ``X-Error-Code: GatedRepo``); a missing file is 404
``EntryNotFound``. Any other file asked for without the hub's token is 401 with ``X-Error-Code:
RepoNotFound``, as the Hub answers for repositories it will not show.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class HubRepo:
    repo_id: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)

    @property
    def sha(self) -> str:
        """The repo's revision: a hash of its files (40 hex digits, like a commit id)."""
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name])
        return digest.hexdigest()

    def write_to(self, folder: Path) -> Path:
        """The repo's files in a local folder (to load them like a snapshot)."""
        for name, data in self.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return folder


@dataclass
class HubModel:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    granted: set[str] = field(default_factory=set)  # tokens whose account accepted the license


class FakeHub:
    def __init__(self, *, token: str = "hf_fake_token_3c9a") -> None:
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.models: dict[str, HubModel] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.validated: list[str] = []  # model card headers the client asked to validate
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                with hub.lock:
                    hub.requests.append((self.command, self.path, status))

            def _gated_file(self) -> bool:
                """A file of an add_model() repo, answered per token; False for any other path."""
                answer = hub.resolve_model_file(self.path.split("?")[0], self.headers.get("Authorization"))
                if answer is None:
                    return False
                status, headers, body = answer
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                with hub.lock:
                    hub.requests.append((self.command, self.path, status))
                return True

            def _handle(self) -> None:
                if self.command in ("GET", "HEAD") and self._gated_file():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    # The Hub says which: a repository it will not show this token is "RepoNotFound".
                    code = {"X-Error-Code": "RepoNotFound"} if "/resolve/" in self.path else {}
                    self._answer(401, {"error": "Invalid credentials in Authorization header"}, code)
                    return
                path = self.path.split("?")[0]
                file = hub.resolve_file(path) if self.command in ("GET", "HEAD") else None
                if file is not None:
                    self._send_file(*file)
                    return
                status, body = hub.route(self.command, path, raw)
                self._answer(status, body)

            def _send_file(self, repo: HubRepo, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", repo.sha)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                with hub.lock:
                    hub.requests.append((self.command, self.path, 200))

            do_GET = do_POST = do_PUT = do_HEAD = _handle  # noqa: N815 - http.server's naming

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self if self._server else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_model(
        self,
        repo_id: str,
        *,
        config: dict[str, Any] | None = None,
        gated: bool = False,
        granted: set[str] | None = None,
    ) -> HubModel:
        """A (gated) model whose files anyone may ask for, answered per token (see the module's docstring)."""
        files = {"config.json": json.dumps(config or {"model_type": "llama"}).encode()}
        model = HubModel(repo_id, files, gated=gated, granted=set(granted or ()))
        with self.lock:
            self.models[repo_id] = model
        return model

    def resolve_model_file(
        self, path: str, authorization: str | None
    ) -> tuple[int, dict[str, str], bytes] | None:
        """``/{repo}/resolve/{revision}/{file}`` of an add_model() repo as the Hub answers it, else None."""
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        model = self.models.get(match.group(1)) if match else None
        if model is None or match is None:
            return None
        token = authorization[7:] if authorization and authorization.startswith("Bearer ") else None

        def error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            return status, headers, json.dumps({"error": message}).encode()

        if model.gated and token not in model.granted:
            return error(
                401 if token is None else 403,
                "GatedRepo",
                f"Access to model {model.repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        data = model.files.get(match.group(3))
        if data is None:
            return error(404, "EntryNotFound", f'{match.group(3)} does not exist on "{match.group(2)}"')
        return 200, {"Content-Type": "application/octet-stream", "X-Repo-Commit": "0" * 40}, data

    def add_folder(self, repo_id: str, folder: Path, *, private: bool = True) -> HubRepo:
        """A repo holding a local folder's files (a model to download with ``snapshot_download``)."""
        repo = HubRepo(repo_id, private=private)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                repo.files[path.relative_to(folder).as_posix()] = path.read_bytes()
        with self.lock:
            self.repos[repo_id] = repo
        return repo

    def resolve_file(self, path: str) -> tuple[HubRepo, bytes] | None:
        """``/{org}/{name}/resolve/{revision}/{file}``: the file's bytes (any revision reads the repo)."""
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        with self.lock:
            repo = self.repos.get(match.group(1)) if match else None
            if repo is None or match is None or match.group(2) not in repo.files:
                return None
            return repo, repo.files[match.group(2)]

    def route(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        with self.lock:
            if method == "POST" and path == "/api/repos/create":
                body = json.loads(raw or b"{}")
                org = body.get("organization")
                repo_id = f"{org}/{body['name']}" if org else body["name"]
                if "/" not in repo_id:
                    repo_id = f"me/{repo_id}"
                if repo_id in self.repos:
                    return 409, {
                        "error": "You already created this model repo",
                        "url": f"{self.url}/{repo_id}",
                    }
                private = body.get("visibility") == "private" or bool(body.get("private"))
                self.repos[repo_id] = HubRepo(repo_id, private=private)
                return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}
            if method == "POST" and path == "/api/validate-yaml":  # a README.md with a metadata header
                content = json.loads(raw or b"{}").get("content", "")
                self.validated.append(content)
                return 200, {"errors": [], "warnings": []}
            match = re.fullmatch(r"/api/models/(.+?)/(preupload|commit)/([^/]+)", path)
            if match and method == "POST":
                repo_id, action, _revision = match.groups()
                repo = self.repos.get(repo_id)
                if repo is None:
                    return 404, {"error": "Repository not found"}
                if action == "preupload":
                    files = json.loads(raw)["files"]
                    return 200, {
                        "files": [
                            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                        ]
                    }
                return self._commit(repo, raw)
            match = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+(?:/.*)?", path)
            if match and method == "GET" and match.group(1) in self.repos:
                repo = self.repos[match.group(1)]
                return 200, [
                    {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                    for n, d in sorted(repo.files.items())
                ]
            match = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
            if match and method == "GET" and match.group(1) in self.repos:
                repo = self.repos[match.group(1)]
                return 200, {
                    "id": repo.repo_id,
                    "private": repo.private,
                    "sha": repo.sha,
                    "siblings": [{"rfilename": n} for n in sorted(repo.files)],
                }
            return 404, {"error": f"fake hub: no route {method} {path}"}

    def _commit(self, repo: HubRepo, raw: bytes) -> tuple[int, Any]:
        message = ""
        for line in raw.decode().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item.get("key"), item.get("value") or {}
            if key == "header":
                message = value.get("summary", "")
            elif key == "file":
                content = value.get("content", "")
                data = base64.b64decode(content) if value.get("encoding") == "base64" else content.encode()
                repo.files[value["path"]] = data
            elif key in ("lfsFile", "xetFile"):
                return 400, {"error": "the fake hub stores regular files only"}
        oid = f"{len(repo.commits) + 1:040x}"
        repo.commits.append(message)
        return 200, {"commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}", "commitOid": oid}
