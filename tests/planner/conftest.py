"""Fixtures for the planner tests: a fake Hugging Face hub on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class FakeHub:
    url: str
    configs: dict[str, dict] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    # repo -> (bytes, declare Content-Length): a config.json of that many bytes (whitespace, then {}),
    # streamed; ``sent`` counts what the client took before it hung up
    huge: dict[str, tuple[int, bool]] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    hung_up: dict[str, threading.Event] = field(default_factory=dict)  # set once the stream to it ended

    def sent_before_hang_up(self, repo: str, timeout: float = 60.0) -> int:
        """What the server had sent of ``repo``'s config when the stream ended: the client may refuse it on
        its headers and return before the server's thread has noticed (the count is read after that)."""
        assert self.hung_up.setdefault(repo, threading.Event()).wait(timeout), f"{repo}: still streaming"
        return self.sent[repo]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """Serves /<org>/<name>/resolve/main/config.json for the configs put in `.configs`."""
    hub = FakeHub(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hub.requests.append((self.path, self.headers.get("Authorization")))
            repo = self.path.removesuffix("/resolve/main/config.json").strip("/")
            if repo in hub.huge:
                self._huge(repo, *hub.huge[repo])
                return
            if repo in hub.configs and self.path.endswith("/resolve/main/config.json"):
                body = json.dumps(hub.configs[repo]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def _huge(self, repo: str, size: int, declare: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if declare:
                self.send_header("Content-Length", str(size + 2))
            self.end_headers()
            hub.sent[repo] = 0
            block = b" " * (1 << 16)
            try:
                while hub.sent[repo] < size:
                    part = block[: size - hub.sent[repo]]
                    self.wfile.write(part)
                    hub.sent[repo] += len(part)
                self.wfile.write(b"{}")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                hub.hung_up.setdefault(repo, threading.Event()).set()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("TUNEBOT_HF_URL", hub.url)
    monkeypatch.delenv("TUNEBOT_HF_OFFLINE", raising=False)
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
