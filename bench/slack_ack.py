"""Slash-command acknowledgement latency: 50 signed `/tune estimate` commands sent at once.

Two servers, each a real uvicorn process on 127.0.0.1 with a fake Slack Web API inside it:
  baseline  a bare AsyncApp that only acks and responds (docs/slack.md measured p99 ~110 ms here)
  tunebot   what `tunebot serve --http` serves: bot.web + the AsyncApp + ChatHandlers + the real
            Engine on SQLite; every command runs a real estimate in a worker thread after its ack
The client (httpx.AsyncClient + asyncio.gather) times each request until its HTTP response (the ack).
Target: tunebot p99 < 200 ms.   Run: .venv/bin/python bench/slack_ack.py [--n 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECRET = "bench-signing-secret"
TOKEN = "xoxb-bench-token"
TARGET_MS = 200.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- the servers (run in a child process) ------------------------------------------------------------
def build_baseline(slack_api: str):  # type: ignore[no-untyped-def]
    from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    app = AsyncApp(client=AsyncWebClient(token=TOKEN, base_url=slack_api), signing_secret=SECRET)

    @app.command("/tune")
    async def tune(ack, respond) -> None:  # type: ignore[no-untyped-def]
        await ack(text="ok")
        await respond(text="done")

    handler = AsyncSlackRequestHandler(app)

    async def events(request):  # type: ignore[no-untyped-def]
        return await handler.handle(request)

    async def healthz(request):  # type: ignore[no-untyped-def]
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/slack/events", events, methods=["POST"]), Route("/healthz", healthz)])


def build_tunebot(slack_api: str, data_dir: str):  # type: ignore[no-untyped-def]
    from bot.chat.handlers import ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.chat.slack.app import build_app, make_async_client
    from bot.engine.service import Engine
    from bot.settings import Settings
    from bot.web import create_app

    settings = Settings(
        TUNEBOT_DATA_DIR=data_dir, SLACK_BOT_TOKEN=TOKEN, SLACK_API_URL=slack_api, SLACK_SIGNING_SECRET=SECRET
    )
    engine = Engine(settings)
    chat = ChatHandlers(engine, Permissions.from_settings(settings), secrets=settings.secrets())
    bolt = build_app(chat, client=make_async_client(settings), signing_secret=SECRET)
    return create_app(bolt_app=bolt, record_runner_event=engine.record_runner_event)


def serve(kind: str, port: int, slack_port: int) -> None:
    import logging

    import uvicorn

    logging.disable(logging.WARNING)
    api_url = f"http://127.0.0.1:{slack_port}/api/"
    with tempfile.TemporaryDirectory() as data_dir:
        app = build_baseline(api_url) if kind == "baseline" else build_tunebot(api_url, data_dir)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def serve_fake_slack(port: int) -> None:
    """The fake Slack Web API (auth.test, response_url) in its own process, off the measured servers' CPU."""
    from tests.fakes.slack_api import FakeSlack

    slack = FakeSlack(port=port).start()
    try:
        while True:
            time.sleep(3600)
    finally:
        slack.stop()


# ---- the client --------------------------------------------------------------------------------------
def signed(text: str, i: int, response_url: str) -> tuple[bytes, dict[str, str]]:
    from slack_sdk.signature import SignatureVerifier

    body = urlencode(
        {
            "token": "x",
            "team_id": "T1",
            "channel_id": "C1",
            "user_id": f"U{i}",
            "user_name": f"u{i}",
            "command": "/tune",
            "text": text,
            "response_url": f"{response_url}/{i}",
            "trigger_id": f"t{i}-{time.time_ns()}",
            "api_app_id": "A1",
        }
    )
    ts = str(int(time.time()))
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body),
    }
    return body.encode(), headers


async def burst(url: str, n: int, text: str, response_url: str) -> tuple[list[float], list[int]]:
    import httpx

    requests = [signed(text, i, response_url) for i in range(n)]
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(body: bytes, headers: dict[str, str]) -> tuple[float, int]:
            started = time.perf_counter()
            resp = await client.post(url + "/slack/events", content=body, headers=headers)
            return (time.perf_counter() - started) * 1000, resp.status_code

        results = await asyncio.gather(*(one(b, h) for b, h in requests))
    return [r[0] for r in results], [r[1] for r in results]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def run_async(coro):  # type: ignore[no-untyped-def]
    """The client's event loop: uvloop where installed (as uvicorn uses on the server side)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


class Server:
    """One server kind in its own process, and its fake Slack Web API (auth.test, response_url) in another."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        port, slack_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.response_url = f"http://127.0.0.1:{slack_port}/response"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        fake = [sys.executable, __file__, "--fake-slack", "--slack-port", str(slack_port)]
        self.slack = subprocess.Popen(fake, env=env, cwd=ROOT)
        serve = ["--serve", kind, "--port", str(port), "--slack-port", str(slack_port)]
        self.proc = subprocess.Popen([sys.executable, __file__, *serve], env=env, cwd=ROOT)

    def wait_ready(self) -> None:
        import httpx

        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"{self.kind} server did not start")
            time.sleep(0.2)
        run_async(burst(self.url, 3, TEXT, self.response_url))  # warm-up: auth.test, first estimate

    def round(self, n: int) -> list[float]:
        latencies, codes = run_async(burst(self.url, n, TEXT, self.response_url))
        ok = sum(c == 200 for c in codes)
        print(
            f"  {self.kind:8s} {ok}/{n} acked  p50 {percentile(latencies, 50):6.1f} ms  "
            f"p99 {percentile(latencies, 99):6.1f} ms  max {max(latencies):6.1f} ms",
            flush=True,
        )
        if ok != n:
            raise SystemExit(f"{self.kind}: only {ok}/{n} commands were acknowledged")
        return latencies

    def stop(self) -> None:
        for proc in (self.proc, self.slack):
            proc.terminate()
            proc.wait(10)


TEXT = "estimate Llama-3.1-8B method=qlora tokens=20M"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=["baseline", "tunebot"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--slack-port", type=int, default=0)
    parser.add_argument("--fake-slack", action="store_true")
    args = parser.parse_args()
    if args.fake_slack:
        serve_fake_slack(args.slack_port)
        return 0
    if args.serve:
        serve(args.serve, args.port, args.slack_port)
        return 0
    print(
        f"{args.n} signed /tune commands at once, {args.rounds} rounds each (interleaved), on this machine; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    servers = [Server("baseline"), Server("tunebot")]
    results: dict[str, list[float]] = {"baseline": [], "tunebot": []}
    try:
        for server in servers:
            server.wait_ready()
        for r in range(args.rounds):
            print(f"round {r + 1}")
            for server in servers:
                time.sleep(1.5)  # let the previous burst's follow-up work (estimates, responds) finish
                results[server.kind].extend(server.round(args.n))
    finally:
        for server in servers:
            server.stop()
    base, ours = results["baseline"], results["tunebot"]
    p50b, p99b = percentile(base, 50), percentile(base, 99)
    p50, p99 = percentile(ours, 50), percentile(ours, 99)
    print(f"baseline (bare AsyncApp, ack+respond): p50 {p50b:.1f} ms  p99 {p99b:.1f} ms")
    print(
        f"tunebot  (serve --http app, estimate): p50 {p50:.1f} ms  p99 {p99:.1f} ms  "
        f"(p99 ratio to baseline {p99 / p99b:.2f}x)"
    )
    verdict = "PASS" if p99 < TARGET_MS else "FAIL"
    print(f"target p99 < {TARGET_MS:.0f} ms: {verdict}")
    return 0 if p99 < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
