"""Slack over real HTTP: signed requests to bot.web under uvicorn, a fake Web API that records every call."""

from __future__ import annotations

import threading
import time

from fakes.worlds import SlackStack, estimate_id_from, listeners_settled, sign

from bot.chat.blockkit import violations
from bot.engine.api import DailySummary, SpendLine
from bot.engine.events import EngineEvent, EngineEventKind


def launch_job(stack: SlackStack, model: str = "Llama-3.1-8B", user: str = "U_ALICE") -> str:
    before = len(stack.slack.of("response"))
    assert stack.command(f"estimate {model}", user=user).status_code == 200
    eid = estimate_id_from(stack.responses(before + 1)[before])
    assert stack.click(stack.action_payload("launch_cheapest", eid, user=user)).status_code == 200
    stack.slack.wait_for("response", before + 2)
    return eid


def test_the_ack_comes_while_the_estimate_is_still_running(slack_stack: SlackStack) -> None:
    """Slack wants the ack within 3 s, whatever the work takes: the acks arrive while every estimate is
    held (an event, not a clock), the answers only once they are let go. Latency: bench/slack_ack.py."""
    gate = slack_stack.engine.estimate_gate = threading.Event()
    try:
        resp = slack_stack.command("estimate Llama-3.1-8B method=qlora")
        assert resp.status_code == 200
        assert "Estimating Llama-3.1-8B qlora" in resp.json()["text"]
        # a second command meanwhile is acknowledged too, still before any estimate ended
        assert slack_stack.command("estimate Qwen2.5-7B").status_code == 200
        assert not gate.is_set() and slack_stack.slack.of("response") == []
    finally:
        gate.set()
    full = slack_stack.responses(2, timeout=20)
    first = next(m for m in full if "Llama-3.1-8B" in m["text"])
    assert first["replace_original"] is True and first["response_type"] == "ephemeral"
    kinds = [b["type"] for b in first["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds and "context" in kinds
    assert "Memory breakdown" in str(first["blocks"]) and "$/h" in str(first["blocks"])
    buttons = [b for b in first["blocks"] if b["type"] == "actions"][0]["elements"]
    assert [b["text"]["text"].split(":")[0] for b in buttons] == [
        "Launch cheapest",
        "Launch safest",
        "Cancel",
    ]
    assert buttons[0]["confirm"] and buttons[1]["confirm"]
    assert not violations(first)


def test_parse_errors_and_help_come_in_the_ack(slack_stack: SlackStack) -> None:
    bad = slack_stack.command("estimate Llama seq=banana").json()
    assert "seq: `banana` is not a sequence length" in str(bad) and "/tune estimate MODEL" in str(bad)
    assert "Traceback" not in str(bad)
    helped = slack_stack.command("help").json()
    assert "/tune spend" in str(helped)


def test_wrong_or_stale_signature_is_401(slack_stack: SlackStack) -> None:
    wrong = slack_stack.command("estimate m", signature=sign("something else"))
    assert wrong.status_code == 401
    from urllib.parse import urlencode

    body = urlencode({"command": "/tune", "text": "estimate m", "user_id": "U1", "team_id": "T1"})
    stale = slack_stack.http.post(
        slack_stack.url + "/slack/events",
        content=body,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            **sign(body, timestamp=int(time.time()) - 301),
        },
    )
    assert stale.status_code == 401
    other_secret = slack_stack.http.post(
        slack_stack.url + "/slack/events",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded", **sign(body, secret="not-the-secret")},
    )
    assert other_secret.status_code == 401
    # A barrier, not a sleep: a signed command sent after them is answered, and its answer is the only one.
    assert slack_stack.command("estimate Qwen2.5-7B").status_code == 200
    (only,) = slack_stack.responses(1)
    assert "Qwen2.5-7B" in str(only) and len(slack_stack.slack.of("response")) == 1


def test_retried_and_double_clicked_launch_starts_one_job(slack_stack: SlackStack) -> None:
    stack = slack_stack
    stack.command("launch Llama-3.1-8B")
    eid = estimate_id_from(stack.responses(1)[0])
    payload = stack.action_payload("launch_cheapest", eid)
    results: list[int] = []
    clicks = [
        threading.Thread(target=lambda: results.append(stack.click(payload).status_code)) for _ in range(3)
    ]
    other = stack.action_payload("launch_safest", eid)
    for t in clicks:
        t.start()
    results.append(
        stack.click(
            payload, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "timeout"}
        ).status_code
    )
    results.append(stack.click(other).status_code)
    for t in clicks:
        t.join()
    assert results == [200] * 5
    replies = stack.responses(6)
    assert len(stack.engine.jobs) == 1
    texts = [r["text"] for r in replies[1:]]
    assert sum("Launching job *j1*" in t for t in texts) == 1
    assert sum("Already launched as job *j1*" in t for t in texts) == 4
    # the job's thread: one status card, its ts kept with set_thread
    posted = stack.slack.wait_for("chat.postMessage", 1)
    assert stack.notifier.drain()
    assert len(stack.slack.of("chat.postMessage")) == 1
    assert stack.engine.threads["j1"] == ("C1", posted[0].body["channel"] and stack.engine.threads["j1"][1])
    assert "Job j1" in posted[0].body["text"]


def test_429_retry_after_is_honoured(slack_stack: SlackStack) -> None:
    stack = slack_stack
    stack.slack.fail_next("chat.postMessage", retry_after=1)
    launch_job(stack)
    calls = stack.slack.wait_for("chat.postMessage", 1, timeout=15)
    every = [c for c in stack.slack.calls if c.method == "chat.postMessage"]
    assert [c.status for c in every] == [429, 200]
    assert every[1].at - every[0].at >= 0.95
    assert calls[0].body["channel"] == "C1"
    # the async client of the listeners retries too (App Home publish)
    stack.slack.fail_next("views.publish", retry_after=1)
    assert (
        stack.event(
            {"type": "app_home_opened", "user": "U_ALICE", "channel": "D1", "tab": "home"}
        ).status_code
        == 200
    )
    stack.slack.wait_for("views.publish", 1, timeout=15)
    publishes = [c for c in stack.slack.calls if c.method == "views.publish"]
    assert [c.status for c in publishes] == [429, 200]
    assert publishes[1].at - publishes[0].at >= 0.95
    view = publishes[1].body["view"]
    assert view["type"] == "home" and "j1" in str(view["blocks"]) and not violations(view)


def test_retried_event_is_not_handled_twice(slack_stack: SlackStack) -> None:
    ev = {"type": "app_home_opened", "user": "U_ALICE", "channel": "D1", "tab": "home"}
    assert slack_stack.event(ev, event_id="Ev1").status_code == 200
    retry = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert slack_stack.event(ev, event_id="Ev1", headers=retry).status_code == 200
    slack_stack.slack.wait_for("views.publish", 1)
    listeners_settled()  # whatever the retry started has ended: a publish it caused would be recorded now
    assert len(slack_stack.slack.of("views.publish")) == 1
    # a retry of a delivery that never arrived (its first attempt failed) is the only copy: handled
    assert slack_stack.event(ev, event_id="Ev2", headers=retry).status_code == 200
    slack_stack.slack.wait_for("views.publish", 2)


def test_thread_card_throttled_milestones_and_chart(slack_stack: SlackStack) -> None:
    stack = slack_stack
    launch_job(stack)
    assert stack.notifier.drain()
    engine, bus = stack.engine, stack.engine.bus
    channel, ts = engine.threads["j1"]
    real_clock, frozen = stack.notifier.clock, stack.notifier.clock()
    stack.notifier.clock = lambda: frozen  # the burst takes no time on the notifier's clock, however slow
    engine.update_job("j1", state="running")
    bus.publish(EngineEvent(kind=EngineEventKind.job_started, job_id="j1"))
    for step in range(1, 31):
        engine.update_job(
            "j1",
            step=step,
            max_steps=30,
            loss=3.0 - step * 0.05,
            losses=[(s, 3.0 - s * 0.05) for s in range(1, step + 1)],
        )
        bus.publish(EngineEvent(kind=EngineEventKind.progress, job_id="j1", data={"step": step}))
    assert stack.notifier.drain()
    stack.notifier.clock = real_clock
    updates_after_burst = len(stack.slack.of("chat.update"))
    assert updates_after_burst == 1, updates_after_burst  # 30 progress events in no time: one edit
    bus.publish(EngineEvent(kind=EngineEventKind.checkpoint, job_id="j1", data={"step": 30}))
    bus.publish(EngineEvent(kind=EngineEventKind.preempted, job_id="j1", message="spot instance reclaimed"))
    bus.publish(EngineEvent(kind=EngineEventKind.recovered, job_id="j1", data={"step": 20}))
    engine.update_job("j1", state="succeeded", spend=1.23, output_uri="/tmp/out/j1/adapter")
    bus.publish(EngineEvent(kind=EngineEventKind.finished, job_id="j1", data={"step": 30, "loss": 1.5}))
    assert stack.notifier.drain(20)
    replies = [c.body for c in stack.slack.of("chat.postMessage") if c.body.get("thread_ts") == ts]
    texts = " | ".join(r["text"] for r in replies)
    for needle in (
        "Started on",
        "Checkpoint saved at step 30",
        "Preempted at step",
        "spot instance reclaimed",
        "Recovered: resumed from step 20",
        "Finished at step 30",
        "$1.23",
        "/tmp/out/j1/adapter",
    ):
        assert needle in texts, needle
    card = stack.slack.of("chat.update")[-1].body
    assert card["ts"] == ts and card["channel"] == channel and "succeeded" in card["text"]
    uploads = stack.slack.of("files.completeUploadExternal")
    assert uploads, stack.slack.methods()
    assert stack.slack.of("upload") and stack.slack.of("upload")[0].raw.startswith(b"\x89PNG")
    complete = uploads[-1].body
    assert complete.get("thread_ts") == ts and complete.get("channel_id") == channel
    assert "Llama-3.1-8B · lora · a100-80gb x1: step 30" in str(complete["files"])  # model, method, GPU


def test_alerts_summary_reminders_and_approval(slack_stack: SlackStack) -> None:
    stack = slack_stack
    bus = stack.engine.bus
    bus.publish(
        EngineEvent(kind=EngineEventKind.budget_alert, user="U_BOB", message="You used 90% of $20 today")
    )
    summary = DailySummary(
        day="2026-12-01",
        spent=12.5,
        spent_today=1.0,
        spent_month=30.0,
        active=1,
        pending_approval=0,
        by_user=[SpendLine(key="U_ALICE", amount=10.0), SpendLine(key="U_BOB", amount=2.5)],
        by_provider=[SpendLine(key="vast", amount=12.5)],
        finished={"succeeded": 2},
        idle_volumes=1,
        idle_volume_cost_per_month=14.0,
    )
    bus.publish(
        EngineEvent(
            kind=EngineEventKind.daily_summary,
            message="Daily spend summary for 2026-12-01",
            data={"summary": summary.model_dump(mode="json")},
        )
    )
    vol = stack.engine.volume_list[0]
    bus.publish(
        EngineEvent(kind=EngineEventKind.idle_volume, user=vol.owner, data=vol.model_dump(mode="json"))
    )
    assert stack.notifier.drain()
    dm = stack.slack.of("conversations.open")[0].body
    assert dm["users"] == "U_BOB"
    posts = {c.body["channel"]: c.body for c in stack.slack.of("chat.postMessage")}
    assert "90% of $20" in posts["DU_BOB"]["text"]
    summary = [c.body for c in stack.slack.of("chat.postMessage") if c.body["channel"] == "C_SUMMARY"]
    daily = next(m for m in summary if "Spend on 2026-12-01" in m["text"])
    assert "Daily spend summary for 2026-12-01: $12.50" in str(daily["blocks"])
    assert "U_ALICE" in str(daily["blocks"]) and "$30.00" in str(daily["blocks"])
    assert "Jobs finished: 2 succeeded" in daily["text"] and "$14.00/month" in str(daily["blocks"])
    reminder = next(m for m in summary if "llama-ckpts" in m["text"])
    blocks = str(reminder["blocks"])
    assert "$14.00/month" in blocks and "volume_delete" in blocks and "volume_keep" in blocks
    stack.click(stack.action_payload("volume_delete", "runpod:vol-1", user="U_BOB"))
    stack.click(stack.action_payload("volume_delete", "runpod:vol-1", user="U_ALICE"))
    stack.responses(2)
    assert stack.engine.deleted == ["vol-1"]
    # approval: above $50 the job waits; the owner cannot approve it, an admin can
    launch_job(stack, model="expensive")
    assert stack.notifier.drain()
    job = next(iter(j for j in stack.engine.jobs.values() if j.model == "expensive"))
    assert job.state == "pending_approval"
    request = [c.body for c in stack.slack.of("chat.postMessage") if "Approval needed" in c.body["text"]]
    assert request and "approve_job" in str(request[0]["blocks"])
    n = len(stack.slack.of("response"))
    stack.click(stack.action_payload("approve_job", job.job_id, user="U_ALICE"))
    assert "cannot approve your own job" in stack.responses(n + 1)[-1]["text"]
    stack.click(stack.action_payload("approve_job", job.job_id, user="U_ADMIN"))
    assert "approved job" in stack.responses(n + 2)[-1]["text"]
    assert stack.engine.jobs[job.job_id].state == "approved"


def test_every_message_fits_block_kit_and_has_fallback(slack_stack: SlackStack) -> None:
    stack = slack_stack
    stack.engine.n_offers = 300
    for text in (
        "estimate big-model",
        "jobs all",
        "spend week",
        "volumes",
        "budget",
        "status",
        "gpus",
        "estimate no-such-model",
        "estimate explode",
        "stop nope",
    ):
        assert stack.command(text).status_code == 200
    stack.responses(10)
    launch_job(stack)
    stack.event({"type": "app_home_opened", "user": "U_ALICE", "channel": "D1", "tab": "home"})
    stack.slack.wait_for("views.publish")
    assert stack.notifier.drain()
    messages = stack.slack.messages()
    assert len(messages) >= 14
    for message in messages:
        assert violations(message) == [], message.get("text")
        if message.get("type") != "home":
            assert message.get("text"), message
    big = next(m for m in messages if "big-model" in m.get("text", ""))
    assert len(big["blocks"]) <= 50


def test_runner_events_endpoint_and_healthz(slack_stack: SlackStack) -> None:
    url = slack_stack.url
    http = slack_stack.http
    assert http.get(url + "/healthz").json()["ok"] is True
    event = {"job_id": "j1", "seq": 1, "kind": "progress", "step": 3}
    assert http.post(url + "/runner/events", json=event).status_code == 401
    assert (
        http.post(url + "/runner/events", json=event, headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    ok = http.post(
        url + "/runner/events", json=event, headers={"Authorization": "Bearer JOBTOKEN-FAKE-5f00d"}
    )
    assert ok.status_code == 200
    bad = http.post(
        url + "/runner/events", content=b"{", headers={"Authorization": "Bearer JOBTOKEN-FAKE-5f00d"}
    )
    assert bad.status_code == 400


def view_submission(user: str, **values: str) -> dict:
    state = {
        "scope": {
            "value": {"type": "static_select", "selected_option": {"value": values.pop("scope", "user")}}
        },
        **{k: {"value": {"type": "plain_text_input", "value": v}} for k, v in values.items()},
    }
    return {
        "type": "view_submission",
        "team": {"id": "T1"},
        "user": {"id": user, "name": user.lower()},
        "api_app_id": "A1",
        "trigger_id": f"trig-{time.time_ns()}",
        "view": {
            "id": "V1",
            "type": "modal",
            "callback_id": "budget_modal",
            "state": {"values": state},
            "private_metadata": "",
        },
    }


def test_budget_modal_from_app_home(slack_stack: SlackStack) -> None:
    stack = slack_stack
    stack.event({"type": "app_home_opened", "user": "U_ADMIN", "channel": "D1", "tab": "home"})
    home = stack.slack.wait_for("views.publish")[0].body["view"]
    assert "open_budget_modal" in str(home["blocks"])
    stack.event({"type": "app_home_opened", "user": "U_BOB", "channel": "D1", "tab": "home"})
    bob_home = stack.slack.wait_for("views.publish", 2)[1].body["view"]
    assert "open_budget_modal" not in str(bob_home["blocks"])  # only admins set budgets
    payload = stack.action_payload("open_budget_modal", "budget", user="U_ADMIN")
    assert stack.click(payload).status_code == 200
    opened = stack.slack.wait_for("views.open")[0].body
    assert opened["trigger_id"] == payload["trigger_id"] and opened["view"]["type"] == "modal"
    assert violations(opened["view"]) == []
    bad = stack.click(view_submission("U_ADMIN", name="ml team", daily="lots"))
    assert bad.status_code == 200
    assert bad.json()["response_action"] == "errors"
    assert set(bad.json()["errors"]) == {"daily", "name"}
    ok = stack.click(view_submission("U_ADMIN", scope="team", name="ml", daily="$20", monthly="400"))
    assert ok.status_code == 200 and not ok.text
    dm = stack.slack.wait_for("chat.postMessage")[0].body
    assert dm["channel"] == "DU_ADMIN" and "Budget for team *ml*: daily $20.00, monthly $400.00" in dm["text"]
    assert stack.engine.budget_list[-1].scope == "team" and stack.engine.budget_list[-1].monthly == 400.0
    stack.click(view_submission("U_BOB", name="U_BOB", daily="1000"))
    denied = stack.slack.wait_for("chat.postMessage", 2)[1].body
    assert denied["channel"] == "DU_BOB" and "only admins set budgets" in denied["text"]


def test_stop_cancel_and_reject_buttons_reach_the_engine(slack_stack: SlackStack) -> None:
    stack = slack_stack
    n = len(stack.slack.of("response"))
    assert stack.command("estimate Llama-3.1-8B").status_code == 200
    eid = estimate_id_from(stack.responses(n + 1)[n])
    stack.click(stack.action_payload("cancel_estimate", eid))
    cancelled = stack.responses(n + 2)[-1]
    launch_job(stack, model="Qwen2.5-7B")
    job = next(j for j in stack.engine.jobs.values() if j.model == "Qwen2.5-7B")
    n = len(stack.slack.of("response"))
    stack.click(stack.action_payload("stop_job", job.job_id))
    stopped = stack.responses(n + 1)[-1]
    launch_job(stack, model="expensive")
    pending = next(j for j in stack.engine.jobs.values() if j.model == "expensive")
    n = len(stack.slack.of("response"))
    stack.click(stack.action_payload("reject_job", pending.job_id, user="U_ADMIN"))
    rejected = stack.responses(n + 1)[-1]
    assert "Cancelled; nothing was launched" in cancelled["text"]
    assert f"Stopping job *{job.job_id}*" in stopped["text"]
    assert f"rejected job *{pending.job_id}*" in rejected["text"]
    assert stack.engine.jobs[pending.job_id].state != "pending_approval"
