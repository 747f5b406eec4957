"""Slack in Socket Mode, end to end: the bot's AsyncApp behind bolt's AsyncSocketModeHandler (aiohttp)
connected to a loopback stand-in of Slack's Socket Mode API (tests/fakes/socket_mode.py), with the fake
Web API answering apps.connections.open with its ws:// URL. The same flows as the HTTP mode test:
commands, buttons, modals and events, on first delivery and on a retry, and a reconnect on
``refresh_requested``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fakes.slack_api import FakeSlack
from fakes.socket_mode import FakeSocketMode
from fakes.worlds import BOT_TOKEN, block_action, listeners_settled, slash_command
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

from bot.chat.blockkit import violations
from bot.chat.handlers import ChatHandlers
from bot.chat.notifier import SlackNotifier
from bot.chat.permissions import Permissions
from bot.chat.slack.app import build_app, make_async_client, make_sync_client
from bot.settings import Settings

from .fake_engine import FakeEngine

APP_TOKEN = "xapp-FAKE-APP-TOKEN-1a2b"
ALICE, ADMIN = "UALICE0001", "UADMIN003"


@dataclass
class SocketStack:
    slack: FakeSlack
    socket: FakeSocketMode
    engine: FakeEngine
    notifier: SlackNotifier

    def command(self, text: str, *, user: str = ALICE, channel: str = "C1") -> dict[str, Any]:
        payload = slash_command(self.slack, text, user=user, channel=channel)
        return self.socket.ack(self.socket.send("slash_commands", payload))

    def click(self, action_id: str, value: str, *, user: str = ALICE, channel: str = "C1") -> dict[str, Any]:
        payload = block_action(self.slack, action_id, value, user=user, channel=channel)
        return self.socket.ack(self.socket.send("interactive", payload))

    def event(self, event: dict[str, Any], *, event_id: str, retry_attempt: int = 0) -> dict[str, Any]:
        body = {
            "token": "legacy",
            "team_id": "T1",
            "api_app_id": "A1",
            "type": "event_callback",
            "event": event,
            "event_id": event_id,
            "event_time": int(time.time()),
        }
        reason = "timeout" if retry_attempt else ""
        sent = self.socket.send("events_api", body, retry_attempt=retry_attempt, retry_reason=reason)
        return self.socket.ack(sent)


@pytest.fixture
def socket_stack() -> Iterator[SocketStack]:
    with FakeSlack() as slack, FakeSocketMode() as socket:
        slack.socket_url = socket.url
        engine = FakeEngine()
        chat = ChatHandlers(engine, Permissions(admins=frozenset({ADMIN})), secrets=[BOT_TOKEN, APP_TOKEN])
        settings = Settings(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_API_URL=slack.api_url)
        bolt = build_app(chat, client=make_async_client(settings), signing_secret=None, socket_mode=True)
        notifier = SlackNotifier(engine, make_sync_client(settings), admins=[ADMIN], update_every_s=1.0)
        notifier.attach(engine.bus).start()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="socket-mode-bot", daemon=True)
        thread.start()

        async def connect() -> AsyncSocketModeHandler:
            handler = AsyncSocketModeHandler(bolt, APP_TOKEN)
            await handler.connect_async()
            return handler

        handler = asyncio.run_coroutine_threadsafe(connect(), loop).result(15)
        socket.wait_connections(1)
        try:
            yield SocketStack(slack, socket, engine, notifier)
        finally:
            asyncio.run_coroutine_threadsafe(handler.close_async(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            notifier.stop()


def test_connects_with_the_app_token_from_apps_connections_open(socket_stack: SocketStack) -> None:
    (opened,) = socket_stack.slack.of("apps.connections.open")
    assert opened.headers.get("Authorization") == f"Bearer {APP_TOKEN}"
    assert socket_stack.socket.connections == 1


def test_command_is_acked_then_answered_and_a_button_launches(socket_stack: SocketStack) -> None:
    stack = socket_stack
    gate = stack.engine.estimate_gate = threading.Event()  # the ack comes while the estimate is held
    try:
        ack = stack.command("estimate Llama-3.1-8B method=qlora")
        assert "Estimating Llama-3.1-8B qlora" in ack["payload"]["text"]
        assert not gate.is_set() and stack.slack.of("response") == []
    finally:
        gate.set()
    estimate = stack.slack.wait_for("response")[0].body
    assert estimate["response_type"] == "ephemeral" and not violations(estimate)
    eid = next(b for b in estimate["blocks"] if b["type"] == "actions")["elements"][0]["value"]
    assert stack.click("launch_cheapest", eid)["envelope_id"]
    launched = stack.slack.wait_for("response", 2)[1].body
    assert "Launching job *j1*" in launched["text"]
    card = stack.slack.wait_for("chat.postMessage")[0].body
    assert card["channel"] == "C1" and "Job j1" in card["text"]
    # help answers in the ack itself
    assert "/tune spend" in str(stack.command("help")["payload"])


def test_budget_modal_opens_and_field_errors_come_back_in_the_ack(socket_stack: SocketStack) -> None:
    stack = socket_stack
    stack.click("open_budget_modal", "budget", user=ADMIN)
    opened = stack.slack.wait_for("views.open")[0].body
    assert opened["view"]["callback_id"] == "budget_modal"
    submission = {
        "type": "view_submission",
        "team": {"id": "T1"},
        "user": {"id": ADMIN, "name": "ada"},
        "api_app_id": "A1",
        "trigger_id": "trig-1",
        "view": {
            "id": "V9",
            "type": "modal",
            "callback_id": "budget_modal",
            "private_metadata": "",
            "state": {
                "values": {
                    "scope": {"value": {"type": "static_select", "selected_option": {"value": "team"}}},
                    "name": {"value": {"type": "plain_text_input", "value": "ml"}},
                    "daily": {"value": {"type": "plain_text_input", "value": "lots"}},
                }
            },
        },
    }
    ack = stack.socket.ack(stack.socket.send("interactive", submission))
    assert ack["payload"]["response_action"] == "errors" and "daily" in ack["payload"]["errors"]


def test_app_home_is_published_on_first_delivery_and_once_per_event(socket_stack: SocketStack) -> None:
    stack = socket_stack
    opened = {"type": "app_home_opened", "user": ALICE, "channel": "D1", "tab": "home"}
    stack.event(opened, event_id="Ev100")  # retry_attempt 0: bolt turns it into x-slack-retry-num "0"
    view = stack.slack.wait_for("views.publish", 1)[0].body
    assert view["user_id"] == ALICE and view["view"]["type"] == "home"
    stack.event(opened, event_id="Ev100", retry_attempt=1)  # Slack retries what it thinks was lost
    listeners_settled()  # acked: whatever the retry started has ended, a publish it caused is recorded
    assert len(stack.slack.of("views.publish")) == 1
    stack.event(opened, event_id="Ev101", retry_attempt=2)  # a retry of a delivery that never arrived
    stack.slack.wait_for("views.publish", 2)


def test_reconnects_on_refresh_requested_and_keeps_working(socket_stack: SocketStack) -> None:
    stack = socket_stack
    stack.socket.refresh()
    stack.socket.wait_connections(2)
    stack.slack.wait_for("apps.connections.open", 2)
    deadline = time.monotonic() + 10
    while True:  # the new connection takes over once the old one is closed
        try:
            ack = stack.command("help")
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    assert "/tune spend" in str(ack["payload"])
    stack.event({"type": "app_home_opened", "user": ALICE, "tab": "home"}, event_id="Ev200")
    stack.slack.wait_for("views.publish", 1)


def test_a_429_on_views_publish_is_retried_after_retry_after(socket_stack: SocketStack) -> None:
    stack = socket_stack
    stack.slack.fail_next("views.publish", retry_after=1)
    stack.event({"type": "app_home_opened", "user": ALICE, "tab": "home"}, event_id="Ev300")
    stack.slack.wait_for("views.publish", 1, timeout=15)
    calls = [c for c in stack.slack.calls if c.method == "views.publish"]
    assert [c.status for c in calls] == [429, 200] and calls[1].at - calls[0].at >= 0.95


def test_launch_form_from_the_command_to_a_launched_job(socket_stack: SocketStack) -> None:
    from .test_launch_form import DATA, submission

    stack = socket_stack
    ack = stack.command("launch")
    assert ack["envelope_id"] and not ack.get("payload")  # acked empty: the form opens instead
    view = stack.slack.wait_for("views.open")[0].body["view"]
    typed = {"model": "Llama-3.1-8B", "dataset": DATA, "method": "lora"}
    first = stack.socket.ack(stack.socket.send("interactive", submission(view, user=ALICE, **typed)))
    assert first["payload"]["response_action"] == "update"
    estimated = stack.slack.wait_for("views.update")[0].body["view"]
    assert not violations(estimated) and estimated["submit"]["text"] == "Launch"
    launch = submission(estimated, user=ALICE, **typed, offer="cheapest")
    stack.socket.ack(stack.socket.send("interactive", launch))
    done = stack.slack.wait_for("views.update", 2)[1].body["view"]
    assert done["title"]["text"] == "Launched" and stack.engine.jobs["j1"].owner == ALICE
    assert stack.slack.wait_for("chat.postMessage")[0].body["channel"] == "C1"
