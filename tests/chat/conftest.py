"""Fixtures for the chat layer's tests: the FakeEngine, and the whole Slack stack on loopback.

``slack_stack`` = fake Slack Web API server + FakeEngine + ChatHandlers + AsyncApp + SlackNotifier,
served by bot.web under real uvicorn on 127.0.0.1; ``SlackStack.command()`` / ``.click()`` send
correctly signed requests like Slack does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fakes.slack_api import FakeSlack, UvicornThread
from slack_sdk.signature import SignatureVerifier

from bot.chat.handlers import ChatHandlers
from bot.chat.notifier import SlackNotifier
from bot.chat.people import People
from bot.chat.permissions import Permissions
from bot.chat.slack.app import build_app, make_async_client, make_sync_client
from bot.chat.slack.home import HomePublisher
from bot.settings import Settings
from bot.web import create_app

from .fake_engine import FakeEngine

BOT_TOKEN = "xoxb-FAKE-BOT-TOKEN-7d1e5c"
SIGNING_SECRET = "FAKE-SIGNING-SECRET-93ab11"
RUNNER_TOKEN = "JOBTOKEN-FAKE-5f00d"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def sign(body: str, *, secret: str = SIGNING_SECRET, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}


@dataclass
class SlackStack:
    slack: FakeSlack
    engine: FakeEngine
    chat: ChatHandlers
    notifier: SlackNotifier
    url: str
    http: httpx.Client
    home: HomePublisher | None = None

    def command(
        self,
        text: str,
        *,
        user: str = "U_ALICE",
        channel: str = "C1",
        headers: dict | None = None,
        signature: dict | None = None,
    ) -> httpx.Response:
        body = urlencode(
            {
                "token": "legacy",
                "team_id": "T1",
                "channel_id": channel,
                "user_id": user,
                "user_name": user.lower(),
                "command": "/tune",
                "text": text,
                "response_url": self.slack.response_url(),
                "trigger_id": f"trig-{time.time_ns()}",
                "api_app_id": "A1",
            }
        )
        hdrs = {
            "Content-Type": "application/x-www-form-urlencoded",
            **(signature or sign(body)),
            **(headers or {}),
        }
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def action_payload(
        self, action_id: str, value: str, *, user: str = "U_ALICE", channel: str = "C1"
    ) -> dict:
        return {
            "type": "block_actions",
            "team": {"id": "T1"},
            "user": {"id": user, "name": user.lower()},
            "api_app_id": "A1",
            "channel": {"id": channel},
            "trigger_id": f"trig-{time.time_ns()}",
            "container": {"type": "message", "is_ephemeral": True},
            "response_url": self.slack.response_url(),
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "b1",
                    "value": value,
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    def click(self, payload: dict, *, headers: dict | None = None) -> httpx.Response:
        body = urlencode({"payload": json.dumps(payload)})
        hdrs = {"Content-Type": "application/x-www-form-urlencoded", **sign(body), **(headers or {})}
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def event(
        self, event: dict, *, headers: dict | None = None, event_id: str | None = None
    ) -> httpx.Response:
        body = json.dumps(
            {
                "token": "legacy",
                "team_id": "T1",
                "api_app_id": "A1",
                "type": "event_callback",
                "event": event,
                "event_id": event_id or f"Ev{time.time_ns()}",
                "event_time": int(time.time()),
            }
        )
        hdrs = {"Content-Type": "application/json", **sign(body), **(headers or {})}
        return self.http.post(self.url + "/slack/events", content=body, headers=hdrs)

    def responses(self, n: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        return [c.body for c in self.slack.wait_for("response", n, timeout)]


@pytest.fixture
def slack_stack(engine: FakeEngine) -> Iterator[SlackStack]:
    with FakeSlack() as slack:
        chat = ChatHandlers(
            engine, Permissions(admins=frozenset({"U_ADMIN"})), secrets=[BOT_TOKEN, SIGNING_SECRET]
        )
        settings = Settings(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_API_URL=slack.api_url)
        sync_client = make_sync_client(settings)
        chat.names = People.slack(sync_client)  # as `tunebot serve` does: users.info, cached
        home = HomePublisher(chat, sync_client, admins=["U_ADMIN"], min_interval_s=1.0, spacing_s=0.05)
        home.start()
        notifier = SlackNotifier(
            engine,
            sync_client,
            summary_channel="C_SUMMARY",
            admins=["U_ADMIN"],
            update_every_s=1.0,
            chart_every_s=0.0,
            names=chat.names,
            home=home,
        )
        bolt = build_app(chat, client=make_async_client(settings), signing_secret=SIGNING_SECRET, home=home)
        notifier.attach(engine.bus).start()

        def record(job_id: str, token: str, payload: dict) -> bool:
            return token == RUNNER_TOKEN

        web = create_app(bolt_app=bolt, record_runner_event=record)
        with UvicornThread(web) as server, httpx.Client(timeout=20) as http:
            yield SlackStack(slack, engine, chat, notifier, server.url, http, home)
        notifier.stop()
        home.stop()
