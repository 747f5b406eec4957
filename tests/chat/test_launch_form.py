"""The launch form: from `/tune launch`, the global shortcut, the message shortcut on an uploaded JSONL and
App Home's button, to an estimate shown in the modal, to a launched job whose thread is in the channel.
Through the real bolt app over HTTP (and Socket Mode for the slash command) with the fake Web API."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fakes.worlds import SlackStack

from bot.chat.blockkit import violations
from bot.chat.grammar import LaunchCmd, parse
from bot.chat.launch_form import FormState, form_view, parse_form, read_values
from bot.engine.events import EngineEvent, EngineEventKind

from .fake_engine import make_estimate

ALICE = "UALICE0001"
DATA = "hf://datasets/acme/chat/train.jsonl"


# ---- the form's values go through the options table ---------------------------------------------


def test_the_form_reads_values_as_the_typed_grammar_does() -> None:
    values = {"model": "Qwen2.5-7B", "dataset": DATA, "method": "qlora", "seq": "4k", "max_cost": "$25"}
    request, errors = parse_form(values)
    typed = parse(f"launch Qwen2.5-7B dataset={DATA} method=QLoRA seq=4k max_cost=$25")
    assert not errors and isinstance(typed, LaunchCmd) and request == typed.request
    assert request.seq_len == 4096 and request.max_cost == 25.0


@pytest.mark.parametrize(
    "values,field,needle",
    [
        ({"dataset": DATA}, "model", "model"),
        ({"model": "m", "dataset": DATA, "max_cost": "lots"}, "max_cost", "not an amount of dollars"),
        ({"model": "m", "dataset": DATA, "max_cost": "-5"}, "max_cost", ""),
        ({"model": "m", "dataset": DATA, "seq": "banana"}, "seq", "not a sequence length"),
    ],
)
def test_bad_values_are_errors_under_their_field(values: dict, field: str, needle: str) -> None:
    request, errors = parse_form(values)
    assert request is None and set(errors) == {field} and needle in errors[field]


def test_the_modal_fits_slacks_limits_before_and_after_the_estimate() -> None:
    empty = form_view(state=FormState(channel="C1"))
    assert not violations(empty) and empty["submit"]["text"] == "Estimate"
    shown = form_view(
        {"model": "m"}, state=FormState("C1", "e1", "fp"), ask_channel=True, estimate=make_estimate()
    )
    assert not violations(shown) and shown["submit"]["text"] == "Launch"
    radios = next(b for b in shown["blocks"] if b.get("block_id") == "offer")["element"]["options"]
    assert [o["value"] for o in radios] == ["cheapest", "safest"]  # safest and fastest are one offer here
    assert all(len(o["text"]["text"]) <= 75 and len(o["description"]["text"]) <= 75 for o in radios)
    assert FormState.loads(shown["private_metadata"]) == FormState("C1", "e1", "fp")


# ---- through the bolt app ------------------------------------------------------------------------


def _state(view: dict[str, Any], **values: str) -> dict[str, Any]:
    """The state Slack submits for a view: its initial values, overridden by what the person typed."""
    state: dict[str, Any] = {}
    for block in view["blocks"]:
        if block.get("type") != "input":
            continue
        element, block_id = block["element"], block["block_id"]
        kind = element["type"]
        value = values.get(block_id)
        if kind in ("static_select", "radio_buttons"):
            chosen = {"value": value} if value else element.get("initial_option")
            state[block_id] = {"value": {"type": kind, "selected_option": chosen}}
        elif kind == "conversations_select":
            state[block_id] = {"value": {"type": kind, "selected_conversation": value}}
        else:
            state[block_id] = {"value": {"type": kind, "value": value or element.get("initial_value")}}
    return state


def submission(
    view: dict[str, Any], user: str = ALICE, view_id: str = "V77", **values: str
) -> dict[str, Any]:
    return {
        "type": "view_submission",
        "team": {"id": "T1"},
        "user": {"id": user, "name": user.lower()},
        "api_app_id": "A1",
        "trigger_id": f"trig-{time.time_ns()}",
        "view": {
            **view,
            "id": view_id,
            "state": {"values": _state(view, **values)},
        },
    }


def shortcut(kind: str, callback_id: str, user: str = ALICE, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "callback_id": callback_id,
        "trigger_id": f"trig-{time.time_ns()}",
        "team": {"id": "T1"},
        "user": {"id": user, "name": user.lower()},
        "api_app_id": "A1",
        **extra,
    }


def open_form(stack: SlackStack, entry: str, tmp_path: Path) -> dict[str, Any]:
    """Open the form from one entry point; returns the view that views.open got."""
    if entry == "command":
        assert stack.command("launch", user=ALICE).status_code == 200
    elif entry == "global_shortcut":
        assert stack.click(shortcut("shortcut", "launch_form")).status_code == 200
    elif entry == "message_shortcut":
        from slack_sdk import WebClient

        from bot.chat.slack.files import SlackFiles

        rows = [{"instruction": f"say {i}", "input": "", "output": str(i)} for i in range(20)]
        stack.slack.add_file(
            "F0DATA1",
            "train.jsonl",
            "".join(json.dumps(r) + "\n" for r in rows).encode(),
            user=ALICE,
            channels=("C1",),
        )
        client = WebClient(token="xoxb-test", base_url=stack.slack.api_url)
        stack.chat.files = SlackFiles(client, token="xoxb-test", folder=tmp_path / "files")
        message = {"type": "message", "ts": "1.2", "files": [{"id": "F0DATA1", "name": "train.jsonl"}]}
        payload = shortcut(
            "message_action",
            "launch_from_file",
            channel={"id": "C1"},
            message=message,
            response_url=stack.slack.response_url(),
            message_ts="1.2",
        )
        assert stack.click(payload).status_code == 200
    else:  # App Home's button: a block action in a view, no response_url
        payload = stack.action_payload("open_launch_modal", "home", user=ALICE)
        payload.pop("response_url")
        payload["container"] = {"type": "view", "view_id": "VHOME"}
        assert stack.click(payload).status_code == 200
    (opened,) = stack.slack.wait_for("views.open")
    view = opened.body["view"]
    assert view["callback_id"] == "launch_form" and not violations(view)
    return view


@pytest.mark.parametrize("entry", ["command", "global_shortcut", "message_shortcut", "app_home"])
def test_from_each_entry_point_to_a_running_job(slack_stack: SlackStack, entry: str, tmp_path: Path) -> None:
    stack = slack_stack
    view = open_form(stack, entry, tmp_path)
    in_channel = entry in ("command", "message_shortcut")
    asks = any(b.get("block_id") == "channel" for b in view["blocks"])
    assert asks is not in_channel  # no channel known: the form asks where the thread goes
    typed = {"model": "Llama-3.1-8B", "method": "qlora", "seq": "4k", "max_cost": "$25"}
    if entry != "message_shortcut":
        typed["dataset"] = DATA
    else:
        assert read_values({"state": {"values": _state(view)}})["dataset"] == "slack:F0DATA1"
    if asks:
        typed["channel"] = "C_TEAM"
    # a field error comes back in the ack, under its field
    bad = stack.click(submission(view, **{**typed, "max_cost": "lots"}))
    assert bad.json()["response_action"] == "errors" and set(bad.json()["errors"]) == {"max_cost"}
    # submitting estimates: the modal says so at once, then shows the offers (views.update in place)
    ack = stack.click(submission(view, **typed))
    assert ack.json()["response_action"] == "update" and "Estimating" in json.dumps(ack.json()["view"])
    (update,) = stack.slack.wait_for("views.update")
    estimated = update.body["view"]
    assert update.body["view_id"] == "V77" and not violations(estimated)
    assert estimated["submit"]["text"] == "Launch" and "Llama-3.1-8B" in json.dumps(estimated["blocks"])
    assert any(b.get("block_id") == "offer" for b in estimated["blocks"])
    # submitting with an offer picked launches that offer
    launched = stack.click(submission(estimated, **typed, offer="safest"))
    assert launched.json()["response_action"] == "update"
    done = stack.slack.wait_for("views.update", 2)[1].body["view"]
    assert done["title"]["text"] == "Launched" and "Launching job *j1* (safest)" in json.dumps(done)
    job = stack.engine.jobs["j1"]
    assert job.owner == ALICE and job.model == "Llama-3.1-8B" and job.method == "qlora"
    assert stack.engine.create_calls[-1]["choice"] == "safest"
    assert stack.engine.create_calls[-1]["team"] == "T1"  # the signed payload's workspace: team budgets
    # the job's thread: in the channel where it was launched (or the one picked)
    channel = "C1" if in_channel else "C_TEAM"
    assert stack.notifier.drain()
    card = stack.slack.wait_for("chat.postMessage")[0].body
    assert card["channel"] == channel and "Job j1" in card["text"]
    stack.engine.update_job("j1", state="running", step=5, max_steps=100)
    stack.engine.bus.publish(EngineEvent(kind=EngineEventKind.job_started, job_id="j1", user=ALICE))
    assert stack.notifier.drain()
    assert "running" in stack.slack.of("chat.update")[-1].body["text"]


def test_a_form_changed_after_the_estimate_estimates_again(slack_stack: SlackStack, tmp_path: Path) -> None:
    stack = slack_stack
    view = open_form(stack, "command", tmp_path)
    typed = {"model": "Llama-3.1-8B", "dataset": DATA}
    stack.click(submission(view, **typed))
    estimated = stack.slack.wait_for("views.update")[0].body["view"]
    again = stack.click(submission(estimated, **{**typed, "model": "Qwen2.5-7B"}, offer="cheapest"))
    assert "Estimating" in json.dumps(again.json()["view"])  # not launched: what was estimated changed
    assert "Qwen2.5-7B" in json.dumps(stack.slack.wait_for("views.update", 2)[1].body["view"])
    assert stack.engine.jobs == {}


def test_a_message_without_a_jsonl_file_gets_a_hint(slack_stack: SlackStack) -> None:
    stack = slack_stack
    message = {"type": "message", "ts": "1.2", "files": [{"id": "F9", "name": "cat.png"}]}
    payload = shortcut(
        "message_action",
        "launch_from_file",
        channel={"id": "C1"},
        message=message,
        response_url=stack.slack.response_url(),
    )
    assert stack.click(payload).status_code == 200
    hint = stack.responses(1)[0]
    assert "no JSONL file" in hint["text"] and hint["response_type"] == "ephemeral"
    assert not stack.slack.of("views.open")


def test_console_launch_without_a_model_still_asks_for_one() -> None:
    from bot.chat.handlers import Actor, ChatHandlers

    from .fake_engine import FakeEngine

    reply = ChatHandlers(FakeEngine()).handle_text("launch", Actor("console"))
    assert reply.kind == "error" and "needs a MODEL first" in reply.text()
