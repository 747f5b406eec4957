"""No secret (provider keys, Slack tokens, job tokens) in anything the Slack layer sends or logs."""

from __future__ import annotations

import logging

import pytest
from fakes.worlds import BOT_TOKEN, RUNNER_TOKEN, SIGNING_SECRET, SlackStack, estimate_id_from

from bot.engine.events import EngineEvent, EngineEventKind
from bot.providers.registry import CLOUDS

from .fake_engine import LEAKY_SECRET

PROVIDER_KEYS = {
    **{spec.key_env: f"{name}-FAKE-KEY-{i:02d}aa{i:02d}" for i, (name, spec) in enumerate(CLOUDS.items())},
    "HF_TOKEN": "hf_FAKE_TOKEN_99ee00",
    "WANDB_API_KEY": "wandb-FAKE-KEY-aa11bb",
}


@pytest.fixture
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key, value in PROVIDER_KEYS.items():
        monkeypatch.setenv(key, value)
    return PROVIDER_KEYS


def test_slack_session_leaks_no_secret(provider_keys, slack_stack: SlackStack, caplog, capfd) -> None:
    stack = slack_stack
    stack.chat.secrets.extend([*provider_keys.values(), LEAKY_SECRET, RUNNER_TOKEN])
    caplog.set_level(logging.DEBUG)
    acks = []
    for text in (
        "estimate Llama-3.1-8B",
        "estimate explode",
        "estimate leaky",
        "spend",
        "volumes",
        "help",
        "estimate m seq=oops",
        "jobs all",
    ):
        resp = stack.command(text)
        assert resp.status_code == 200
        acks.append(resp.text)
    first = stack.responses(6)
    eid = estimate_id_from(next(m for m in first if "Llama-3.1-8B" in m["text"]))
    stack.click(stack.action_payload("launch_cheapest", eid))
    stack.slack.wait_for("chat.postMessage")
    bus = stack.engine.bus
    stack.engine.update_job("j1", losses=[(1, 2.0), (2, 1.5)], spend=0.5, state="succeeded")
    bus.publish(EngineEvent(kind=EngineEventKind.finished, job_id="j1", data={"step": 2}))
    bus.publish(EngineEvent(kind=EngineEventKind.budget_alert, user="U_ALICE", message="90% of your budget"))
    stack.event({"type": "app_home_opened", "user": "U_ALICE", "channel": "D1", "tab": "home"})
    stack.slack.wait_for("views.publish")
    runner_event = {"job_id": "j1", "seq": 1, "kind": "progress"}
    stack.http.post(
        stack.url + "/runner/events", json=runner_event, headers={"Authorization": f"Bearer {RUNNER_TOKEN}"}
    )
    stack.http.post(stack.url + "/runner/events", json=runner_event, headers={"Authorization": "Bearer nope"})
    assert stack.notifier.drain()

    secrets = [BOT_TOKEN, SIGNING_SECRET, RUNNER_TOKEN, LEAKY_SECRET, *provider_keys.values()]
    sent = []
    for call in stack.slack.calls:
        # The bot token legitimately travels in the Authorization header to Slack; nowhere else.
        headers = {k: v for k, v in call.headers.items() if k.lower() != "authorization"}
        sent.append(call.raw.decode("utf-8", "replace") + str(headers) + str(call.body))
    assert len(sent) >= 15
    out, err = capfd.readouterr()
    emitted = "\n".join([*sent, *acks, caplog.text, out, err])
    assert "chat command failed" in caplog.text  # the failure was logged ...
    for secret in secrets:
        assert secret not in emitted, f"secret {secret[:6]}... leaked"
    assert any(c.headers.get("Authorization") == f"Bearer {BOT_TOKEN}" for c in stack.slack.calls)
