"""App Home as the team's dashboard, through the bolt app over HTTP with the fake Web API: what an admin and
a member see, the Delete / Keep buttons there, and the refresh when a job changes state (coalesced)."""

from __future__ import annotations

import json
import time

from fakes.worlds import SlackStack

from bot.chat.blockkit import violations
from bot.engine.events import EngineEvent, EngineEventKind

from .test_slack_http import launch_job

ALICE, BOB, ADMIN = "UALICE0001", "UBOB00002", "U_ADMIN"


def open_home(stack: SlackStack, user: str) -> dict:
    before = len([c for c in stack.slack.of("views.publish") if c.body["user_id"] == user])
    stack.event({"type": "app_home_opened", "user": user, "channel": "D1", "tab": "home"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        mine = [c for c in stack.slack.of("views.publish") if c.body["user_id"] == user]
        if len(mine) > before:
            view = mine[-1].body["view"]
            assert view["type"] == "home" and violations(view) == []
            return view
        time.sleep(0.02)
    raise AssertionError(f"no App Home published for {user}")


def text(view: dict) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


def test_an_admin_sees_the_team_and_a_member_their_own(slack_stack: SlackStack) -> None:
    stack = slack_stack
    launch_job(stack, user=ALICE)
    stack.engine.update_job("j1", state="running", spend=1.25, eta_seconds=7200, step=40, max_steps=100)
    admin = open_home(stack, ADMIN)
    blocks = text(admin)
    assert "tunebot · team dashboard" in blocks
    for needle in ("Team spend now", "Team month to date", "Team projected month"):
        assert needle in blocks, needle
    running = next(b["text"]["text"] for b in admin["blocks"] if "*j1*" in b.get("text", {}).get("text", ""))
    # owner (a mention: Slack shows the name), GPU, $/h, spend so far, ETA
    for needle in (
        f"<@{ALICE}>",
        "a100-80gb x1 on vast (spot)",
        "$0.30/h",
        "$1.25 so far",
        "ETA 2.0 h",
        "40/100",
    ):
        assert needle in running, (needle, running)
    assert "This month by person" in blocks and "This month by team" in blocks and "projected" in blocks
    assert "Idle volumes" in blocks and "$14.00/month" in blocks
    actions = [e["action_id"] for b in admin["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert {"volume_delete", "volume_keep", "open_budget_modal", "open_launch_modal"} <= set(actions)
    assert not [b for b in admin["blocks"] if b["type"] == "table"]  # App Home has no table blocks

    member = open_home(stack, BOB)
    blocks = text(member)
    assert "team dashboard" not in blocks and "Your spend now" in blocks
    assert "*Your running jobs* (0)" in blocks and "*j1*" not in blocks  # not Alice's job
    assert "This month by person" not in blocks and "llama-ckpts" not in blocks  # not her volume
    actions = [e["action_id"] for b in member["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert actions == ["open_launch_modal"]  # a member launches; budgets and others' volumes are not theirs

    owner = open_home(stack, ALICE)
    assert "*Your running jobs* (1)" in text(owner) and "*j1*" in text(owner)


def test_app_home_is_refreshed_when_a_job_changes_state_coalesced(slack_stack: SlackStack) -> None:
    stack = slack_stack
    open_home(stack, ADMIN)
    open_home(stack, ALICE)

    def published(user: str) -> int:
        return len([c for c in stack.slack.of("views.publish") if c.body["user_id"] == user])

    launch_job(stack, user=ALICE)  # job_created: Alice's Home and the admin's change
    deadline = time.monotonic() + 5
    while (published(ADMIN) < 2 or published(ALICE) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert published(ADMIN) == 2 and published(ALICE) == 2
    latest = [c for c in stack.slack.of("views.publish") if c.body["user_id"] == ADMIN][-1].body["view"]
    assert "*j1*" in text(latest)
    before = published(ADMIN)
    for kind in [EngineEventKind.job_started, EngineEventKind.preempted, EngineEventKind.recovered] * 4:
        stack.engine.bus.publish(EngineEvent(kind=kind, job_id="j1", user=ALICE))
    time.sleep(2.5)  # at most one publish per person a second (min_interval_s=1 in the fixture)
    assert 1 <= published(ADMIN) - before <= 3  # twelve changes, coalesced
    assert published(BOB) == 0  # never opened it: nothing is pushed


def test_delete_from_app_home_tells_the_clicker_and_refreshes_the_home(slack_stack: SlackStack) -> None:
    stack = slack_stack
    open_home(stack, ADMIN)
    payload = stack.action_payload("volume_delete", "runpod:vol-1", user=ADMIN)
    payload.pop("response_url")  # a button in App Home: no message to answer
    payload["container"] = {"type": "view", "view_id": "VHOME"}
    assert stack.click(payload).status_code == 200
    dm = stack.slack.wait_for("chat.postMessage")[0].body
    assert dm["channel"] == f"D{ADMIN}" and "deleted volume *llama-ckpts*" in dm["text"]
    assert stack.engine.deleted == ["vol-1"]
    stack.slack.wait_for("views.publish", 2)  # the Home again, after the change
