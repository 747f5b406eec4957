"""`tunebot serve --http` as a child process: the real server (uvicorn, bot.web, bolt, ChatHandlers, the real
Engine on SQLite) on 127.0.0.1, talking to a FakeSlack; for tests and benches that measure the process
itself (its memory, where it listens, how it refuses what it should not read).

``raw_post`` sends a request over a plain socket so that a test controls the body byte by byte: it keeps
sending until the server answers or closes, and reports how much it managed to send.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from slack_sdk.signature import SignatureVerifier

ROOT = Path(__file__).resolve().parents[2]
SECRET = "serve-process-signing-secret-5e2"
BOT_TOKEN = "xoxb-serve-process-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sign(body: str | bytes, *, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": SignatureVerifier(secret).generate_signature(timestamp=ts, body=body) or "",
    }


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)


class ServeProcess:
    def __init__(
        self,
        tmp: Path,
        *,
        slack_api: str,
        env: dict[str, str] | None = None,
        root: Path = ROOT,
        args: Iterable[str] = (),
    ) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.root = root
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TUNEBOT_", "SLACK_", "DATABASE_"))},
            "PYTHONPATH": str(root),
            "TUNEBOT_DATA_DIR": str(tmp / "data"),
            "TUNEBOT_HF_OFFLINE": "1",
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": slack_api,
            **(env or {}),
        }
        self.args = ["serve", "--http", "--port", str(self.port), *args]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / f"serve-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 90.0) -> ServeProcess:
        code = "import sys; from bot.cli import main; sys.argv[0] = 'tunebot'; main()"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, *self.args],
                cwd=self.tmp,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tunebot serve exited {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tunebot serve did not answer /healthz:\n{self.output()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def rss_mb(self) -> float:
        return int(proc_status(self.pid)["VmRSS"].split()[0]) / 1024

    def peak_mb(self) -> float:
        return int(proc_status(self.pid)["VmHWM"].split()[0]) / 1024

    def listening_on(self) -> list[str]:
        """The local addresses the server's port is listening on (from /proc/net/tcp and tcp6)."""
        found = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, port = local.split(":")
                if state == "0A" and int(port, 16) == self.port:
                    found.append(_address(address))
        return found

    def command(self, text: str, *, user: str, response_url: str, channel: str = "C1") -> httpx.Response:
        body = urlencode(
            {
                "command": "/tune",
                "text": text,
                "user_id": user,
                "user_name": user.lower(),
                "team_id": "T1",
                "channel_id": channel,
                "response_url": response_url,
                "trigger_id": f"t{time.time_ns()}",
                "api_app_id": "A1",
                "token": "legacy",
            }
        )
        headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(body)}
        return httpx.post(self.url + "/slack/events", content=body, headers=headers, timeout=30)


def _address(hex_address: str) -> str:
    if len(hex_address) == 8:  # IPv4, little-endian
        return socket.inet_ntoa(bytes.fromhex(hex_address)[::-1])
    raw = bytes.fromhex(hex_address)
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def zeros(total: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    block = b"0" * chunk
    sent = 0
    while sent < total:
        part = block[: min(chunk, total - sent)]
        sent += len(part)
        yield part


def raw_post(
    port: int,
    path: str,
    headers: dict[str, str],
    body: Iterable[bytes],
    *,
    chunked: bool = False,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """POST ``body`` piece by piece, stopping as soon as the server answers or closes. Returns the status
    (None if none came), the body bytes sent, the seconds taken and the answer's first bytes."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    started = time.monotonic()
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            for piece in body:
                ready, _, _ = select.select([sock], [], [], 0)
                if ready:
                    break
                data = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
                sock.sendall(data)
                sent += len(piece)
                if time.monotonic() - started > timeout:
                    break
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            sock.settimeout(timeout)
            answer = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    status = None
    if answer.startswith(b"HTTP/1.1 "):
        status = int(answer.split()[1])
    return {"status": status, "sent": sent, "seconds": time.monotonic() - started, "answer": answer[:300]}
