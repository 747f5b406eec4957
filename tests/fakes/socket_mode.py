"""A loopback stand-in of Slack's Socket Mode API: a WebSocket server on 127.0.0.1 (aiohttp).

Slack's side of Socket Mode, as the bot sees it: ``apps.connections.open`` (the fake Web API in
slack_api.py answers it with this server's ``ws://`` URL) and a WebSocket that greets with ``hello``,
sends envelopes (``slash_commands``, ``interactive``, ``events_api`` with ``retry_attempt`` /
``retry_reason``) and reads back each acknowledgement (``{"envelope_id": ..., "payload": ...}``).
``refresh()`` sends ``{"type": "disconnect", "reason": "refresh_requested"}`` as Slack does before it
rotates a connection; the client must open a new URL and reconnect.

    with FakeSocketMode() as socket, FakeSlack() as slack:
        slack.socket_url = socket.url
        ...
        eid = socket.send("slash_commands", {...}); ack = socket.ack(eid)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any

from aiohttp import WSMsgType, web


class FakeSocketMode:
    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.connections = 0  # WebSocket connections accepted so far
        self.acks: dict[str, dict[str, Any]] = {}  # envelope id -> the acknowledgement the bot sent
        self.received: list[dict[str, Any]] = []  # every message the bot sent
        self._ids = itertools.count(1)
        self._ws: web.WebSocketResponse | None = None  # the newest connection
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-socket-mode", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/link/?ticket=fake"

    def start(self) -> FakeSocketMode:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> FakeSocketMode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/link/", self._link)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        with self._cond:
            self.connections += 1
            self._ws = ws
            self._cond.notify_all()
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {"host": "fake", "approximate_connection_time": 3600},
                    "connection_info": {"app_id": "A1"},
                }
            )
        )
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            with self._cond:
                self.received.append(data)
                if data.get("envelope_id"):
                    self.acks[data["envelope_id"]] = data
                self._cond.notify_all()
        return ws

    # ---- what a test does --------------------------------------------------------------------------
    def wait_connections(self, n: int, timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.connections >= n and self._ws is not None, timeout):
                raise AssertionError(f"expected {n} connection(s), got {self.connections}")

    def _send_raw(self, message: dict[str, Any]) -> None:
        with self._cond:
            ws = self._ws
        if ws is None:
            raise AssertionError("nobody is connected")
        asyncio.run_coroutine_threadsafe(ws.send_str(json.dumps(message)), self._loop).result(5)

    def send(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        retry_attempt: int | None = None,
        retry_reason: str | None = None,
        envelope_id: str | None = None,
    ) -> str:
        """Send an envelope (``slash_commands``, ``interactive``, ``events_api``); returns its id."""
        envelope_id = envelope_id or f"env-{next(self._ids)}-{time.time_ns()}"
        message: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind != "events_api",
        }
        if kind == "events_api":  # Slack always sends both on events (0 and "" on the first delivery)
            message["retry_attempt"] = retry_attempt or 0
            message["retry_reason"] = retry_reason or ""
        self._send_raw(message)
        return envelope_id

    def ack(self, envelope_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The bot's acknowledgement of an envelope (Slack wants it within 3 seconds)."""
        with self._cond:
            if not self._cond.wait_for(lambda: envelope_id in self.acks, timeout):
                raise AssertionError(f"no acknowledgement of {envelope_id}")
            return self.acks[envelope_id]

    def refresh(self) -> None:
        """Ask the client to reconnect, as Slack does before it rotates a connection."""
        self._send_raw({"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "fake"}})
