"""A fake Slack Web API on 127.0.0.1 that records every call, for the chat layer's tests and bench.

Serves ``/api/<method>`` (auth.test, chat.postMessage with ts, chat.update, chat.postEphemeral,
views.open, views.update, views.publish, conversations.open, users.info (``users``), apps.connections.open
(``socket_url``: the Socket Mode stand-in of socket_mode.py), files.info, files.getUploadURLExternal,
files.completeUploadExternal),
the upload POST of files_upload_v2 (``/upload/<file_id>``) and response_url endpoints
(``/response/<id>``, see ``response_url()``). ``fail_next(method, retry_after=1)`` makes the next call
answer 429 with Retry-After, once. Channels in ``not_in`` answer chat.postMessage with ``not_in_channel``
(a private channel the bot was not invited to).

    with FakeSlack() as slack:
        client = WebClient(token="xoxb-test", base_url=slack.api_url)
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Call:
    method: str  # Web API method, "upload" or "response"
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    status: int
    at: float = field(default_factory=time.time)


def _decode(raw: bytes, content_type: str) -> dict[str, Any]:
    if not raw:
        return {}
    if "json" in content_type:
        try:
            data = json.loads(raw)
            return data if isinstance(data, dict) else {"_": data}
        except ValueError:
            return {}
    if "form" in content_type:
        parsed = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        for key in ("blocks", "attachments", "view", "files"):
            if isinstance(parsed.get(key), str):
                try:
                    parsed[key] = json.loads(parsed[key])
                except ValueError:
                    pass
        return parsed
    return {"_bytes": len(raw)}


class FakeSlack:
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, delay_s: float = 0.0) -> None:
        self.calls: list[Call] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._fail: dict[str, list[tuple[int, float]]] = {}
        self._ts = itertools.count(1)
        self.files: dict[str, dict[str, Any]] = {}  # file id -> files.info's "file" (+ "_content")
        self.token: str | None = None  # when set, file downloads need "Authorization: Bearer <token>"
        self.socket_url: str | None = None  # what apps.connections.open answers (Socket Mode)
        self.not_in: set[str] = set()  # channels the bot is not a member of
        self._views = itertools.count(1)
        # users.info: id -> (display name, real name); an empty display name falls back to the real name
        self.users: dict[str, tuple[str, str]] = {
            "UALICE0001": ("alice", "Alice Liddell"),
            "UBOB00002": ("", "Bob Stone"),
            "UADMIN003": ("ada", "Ada Admin"),
        }
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-slack", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def api_url(self) -> str:
        return self.base_url + "/api/"

    def response_url(self, key: str | None = None) -> str:
        return f"{self.base_url}/response/{key or uuid.uuid4().hex[:8]}"

    def start(self) -> FakeSlack:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- test helpers ------------------------------------------------------------------------------
    def fail_next(self, method: str, *, status: int = 429, retry_after: float = 1, times: int = 1) -> None:
        with self._lock:
            self._fail.setdefault(method, []).extend([(status, retry_after)] * times)

    def add_file(
        self,
        file_id: str,
        name: str,
        content: bytes,
        *,
        user: str = "U_ALICE",
        channels: tuple[str, ...] = (),
        content_encoding: str | None = None,
    ) -> None:
        """A file "uploaded to Slack": files.info describes it, its private URL serves ``content`` (as it is,
        with ``Content-Encoding: <content_encoding>`` when given: a client that decodes it gets more)."""
        self.files[file_id] = {
            "_encoding": content_encoding,
            "id": file_id,
            "name": name,
            "size": len(content),
            "user": user,
            "channels": list(channels),
            "url_private_download": f"{self.base_url}/files-pri/T1-{file_id}/download/{name}",
            "_content": content,
        }

    def of(self, method: str, *, ok_only: bool = True) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and (c.status == 200 or not ok_only)]

    def wait_for(self, method: str, n: int = 1, timeout: float = 10.0) -> list[Call]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.of(method)
            if len(found) >= n:
                return found
            time.sleep(0.02)
        raise AssertionError(f"expected {n} {method} call(s), got {len(self.of(method))}: {self.methods()}")

    def methods(self) -> list[str]:
        with self._lock:
            return [c.method for c in self.calls]

    def messages(self) -> list[dict[str, Any]]:
        """Every message payload sent: postMessage, update, ephemeral, response_url bodies and views."""
        out = []
        with self._lock:
            for c in self.calls:
                if c.method in ("chat.postMessage", "chat.update", "chat.postEphemeral", "response"):
                    out.append(c.body)
                elif c.method in ("views.publish", "views.open", "views.update") and isinstance(
                    c.body.get("view"), dict
                ):
                    out.append(c.body["view"])
        return out

    # ---- the server --------------------------------------------------------------------------------
    def _answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "tunebot",
                "team_id": "T1",
                "user_id": "UBOT",
                "bot_id": "BBOT",
            }
        if method == "apps.connections.open":
            if not self.socket_url:
                return {"ok": False, "error": "not_allowed_token_type"}
            return {"ok": True, "url": self.socket_url}
        if method == "users.info":
            user = str(body.get("user") or "")
            if user not in self.users:
                return {"ok": False, "error": "user_not_found"}
            display, real = self.users[user]
            return {
                "ok": True,
                "user": {
                    "id": user,
                    "name": (display or real).lower().replace(" ", "."),
                    "real_name": real,
                    "profile": {"display_name": display, "real_name": real},
                },
            }
        if method == "chat.postMessage" and body.get("channel") in self.not_in:
            return {"ok": False, "error": "not_in_channel"}
        if method in ("chat.postMessage", "chat.postEphemeral"):
            ts = f"{1700000000 + next(self._ts)}.000100"
            channel = body.get("channel", "C?")
            return {
                "ok": True,
                "channel": channel,
                "ts": ts,
                "message_ts": ts,
                "message": {"text": body.get("text", ""), "ts": ts},
            }
        if method == "chat.update":
            return {
                "ok": True,
                "channel": body.get("channel"),
                "ts": body.get("ts"),
                "text": body.get("text", ""),
            }
        if method == "conversations.open":
            return {"ok": True, "channel": {"id": "D" + str(body.get("users", "X")).split(",")[0]}}
        if method in ("views.publish", "views.open", "views.update"):
            view = body.get("view") or {}
            view_id = body.get("view_id") or f"V{next(self._views)}"
            return {"ok": True, "view": {**view, "id": view_id, "hash": f"h{time.time_ns()}"}}
        if method == "files.getUploadURLExternal":
            file_id = "F" + uuid.uuid4().hex[:8].upper()
            return {"ok": True, "upload_url": f"{self.base_url}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            files = body.get("files") or []
            if isinstance(files, str):
                files = json.loads(files)
            return {"ok": True, "files": [{"id": f.get("id"), "title": f.get("title")} for f in files]}
        if method == "files.info":
            file = self.files.get(str(body.get("file")))
            if file is None:
                return {"ok": False, "error": "file_not_found"}
            return {"ok": True, "file": {k: v for k, v in file.items() if not k.startswith("_")}}
        return {"ok": True}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _reply(
                self, status: int, payload: dict[str, Any] | None, headers: dict[str, str] | None = None
            ):
                data = json.dumps(payload).encode() if payload is not None else b"ok"
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if payload is not None else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self.do_POST()

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlparse(self.path)
                body = _decode(raw, self.headers.get("Content-Type", ""))
                if url.query:
                    body.update({k: v[0] for k, v in parse_qs(url.query).items()})
                parts = [p for p in url.path.split("/") if p]
                kind = parts[0] if parts else ""
                method = parts[1] if kind == "api" and len(parts) > 1 else kind
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                status, retry_after = 200, 0.0
                with fake._lock:
                    pending = fake._fail.get(method)
                    if pending:
                        status, retry_after = pending.pop(0)
                headers = {k: v for k, v in self.headers.items()}
                with fake._lock:
                    fake.calls.append(Call(method, url.path, headers, body, raw, status))
                if status != 200:
                    self._reply(
                        status, {"ok": False, "error": "ratelimited"}, {"Retry-After": f"{retry_after:g}"}
                    )
                    return
                if kind == "files-pri":
                    file_id = parts[1].split("-", 1)[-1] if len(parts) > 1 else ""
                    file = fake.files.get(file_id)
                    if file is None or (
                        fake.token and headers.get("Authorization") != f"Bearer {fake.token}"
                    ):
                        self._reply(404, {"ok": False, "error": "not found"})
                        return
                    data = file["_content"]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(data)))
                    if file.get("_encoding"):
                        self.send_header("Content-Encoding", file["_encoding"])
                    self.end_headers()
                    self.wfile.write(data)
                elif kind == "api":
                    self._reply(200, fake._answer(method, body))
                else:  # upload and response_url answer plain "ok" like Slack
                    self._reply(200, None)

        return Handler


class UvicornThread:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a background thread (a real HTTP server)."""

    def __init__(self, app: Any, *, port: int = 0) -> None:
        import socket

        import uvicorn

        if not port:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.port = port
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self._thread.start()
        deadline = time.time() + 15
        while not self.server.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
