"""A dataset server on 127.0.0.1 that can be slow on purpose: a byte every ``every_s`` seconds.

Issue 28 (item 6): a dataset URL that sends a byte every few seconds held a slow-work thread of the bot for as
long as the server kept going. ``SlowServer`` plays that server for real (a socket, no mock): ``mode`` is
"fast" (the file at once), "body" (the headers at once, then the body byte by byte) or "headers" (the status
line and headers themselves byte by byte). It stops dribbling after ``give_up_s`` (or when stopped), so that a
reader with no deadline of its own eventually ends too instead of hanging a test forever.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class SlowServer:
    def __init__(self, content: bytes, *, every_s: float = 0.25, give_up_s: float = 45.0) -> None:
        self.content = content
        self.every_s = every_s
        self.give_up_s = give_up_s
        self.mode = "body"
        self.requests = 0
        self.open_connections = 0
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="slow-http", daemon=True)

    def url(self, name: str = "data.jsonl") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> SlowServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with self._lock:
            self.requests += 1
            self.open_connections += 1
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/jsonl\r\n"
                + f"Content-Length: {len(self.content)}\r\nConnection: close\r\n\r\n".encode()
            )
            mode = self.mode
            if mode == "fast":
                conn.sendall(head + self.content)
                return
            slow = head + self.content if mode == "headers" else self.content
            if mode == "body":
                conn.sendall(head)
            started = time.monotonic()
            for i in range(len(slow)):
                if self._stop.is_set() or time.monotonic() - started > self.give_up_s:
                    return
                conn.sendall(slow[i : i + 1])
                if self._stop.wait(self.every_s):
                    return
        except OSError:
            return  # the reader hung up (its deadline): that is the point
        finally:
            with self._lock:
                self.open_connections -= 1
            conn.close()


@contextmanager
def slow_server(content: bytes, **kw: float) -> Iterator[SlowServer]:
    server = SlowServer(content, **kw).start()
    try:
        yield server
    finally:
        server.stop()
