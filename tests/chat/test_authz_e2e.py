"""Issue 19, item 4: authorization lives in the engine, whatever the door. Each attack reported on a9605e4 is
played here as a hostile workspace member would: signed Slack requests to the real HTTP app (bot.web under
uvicorn, the fake Slack Web API), on the real Engine (SQLite, real planner) with an in-memory cloud.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine.fakes import FakeProvider
from fakes.worlds import SlackStack, engine_slack_worlds
from sqlalchemy import select

from bot.providers.base import Volume

ALICE, MALLORY, ADMIN = "U_ALICE", "U_MALLORY", "U_ADMIN"


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    record = {"instruction": "Say hi.", "input": "", "output": "Hi there! " * 20}
    data.write_text("\n".join(json.dumps(record) for _ in range(200)) + "\n")
    return data


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[..., SlackStack]]:
    """Build the Slack world on the real engine with extra settings (TUNEBOT_ADMINS=U_ADMIN unless given) and
    clouds (default: vast at $0.40/h, with volumes)."""
    with engine_slack_worlds(tmp_path) as make:
        yield make


def volume(volume_id: str, name: str) -> Volume:
    return Volume(provider="vast", volume_id=volume_id, name=name, size_gb=500, price_per_gb_month=0.1)


def test_a_member_cannot_delete_volumes_that_are_not_theirs(make_stack, dataset: Path) -> None:
    """a9605e4: any member deleted any cloud volume, tunebot's or not (the clicker counted as owner)."""
    stack = make_stack()
    cloud = stack.cloud
    cloud.volumes["prod"] = volume("prod", "company-prod-db")  # never created by tunebot
    assert "Launching job" in stack.launch(f"Llama-3.1-8B method=qlora dataset={dataset}")
    (job,) = stack.engine.list_jobs()
    cloud.volumes["ckpt"] = volume("ckpt", f"tunebot-{job.job_id}")  # created for alice's job
    listed = stack.said(lambda: stack.command("volumes", user=MALLORY))
    assert listed  # the list answers; its table shows which volumes are untracked

    for who in (MALLORY, ALICE, ADMIN):  # nobody deletes the provider's own volume through tunebot
        text = stack.said(
            lambda who=who: stack.click(stack.action_payload("volume_delete", "vast:prod", user=who))
        )
        # A member sees only their own jobs' volumes: another one is answered as one that does not exist.
        said = "did not create or attach this volume" if who == ADMIN else "no volume prod on vast"
        assert said in text, text
    text = stack.said(lambda: stack.click(stack.action_payload("volume_delete", "vast:ckpt", user=MALLORY)))
    assert "no volume ckpt on vast" in text, text
    text = stack.said(lambda: stack.click(stack.action_payload("volume_keep", "vast:ckpt", user=MALLORY)))
    assert "no volume ckpt on vast" in text, text
    assert cloud.deleted_volumes == [] and {"prod", "ckpt"} <= set(cloud.volumes)

    text = stack.said(lambda: stack.click(stack.action_payload("volume_delete", "vast:ckpt", user=ALICE)))
    assert "deleted volume" in text and cloud.deleted_volumes == ["ckpt"]
    (prod,) = stack.engine.volumes()
    assert (prod.volume_id, prod.tracked, prod.owner) == ("prod", False, None)


def test_max_cost_is_approved_like_the_spend_it_allows(make_stack, dataset: Path) -> None:
    """a9605e4: approval compared only the estimate; `max_cost=$1000000` on a cents job launched at once."""
    stack = make_stack()
    words = f"launch Llama-3.1-8B method=qlora dataset={dataset} max_cost=$1000000"  # refused at its estimate
    text = stack.said(lambda: stack.command(words, user=MALLORY))
    assert "above this bot's limit" in text and "TUNEBOT_MAX_COST_LIMIT" in text, text
    text = stack.launch(f"Llama-3.1-8B method=qlora dataset={dataset} max_cost=$900", user=MALLORY)
    assert "may spend up to $900.00" in text and "approve" in text, text
    (job,) = stack.engine.list_jobs()
    assert job.state == "pending_approval" and stack.cloud.creates == 0


def test_a_pricier_fallback_waits_for_approval_in_the_thread(make_stack, dataset: Path) -> None:
    """a9605e4: the chosen offer had no capacity, so the launch rented a $60/h H100 without asking."""
    cheap = FakeProvider("vast", price=0.40)
    h100 = FakeProvider("runpod", price=60.0, gpu="h100-80gb")
    stack = make_stack(clouds=[cheap, h100])
    cheap.capacity = False
    text = stack.launch(f"Llama-3.1-8B method=qlora dataset={dataset}")
    (job,) = stack.engine.list_jobs()
    assert h100.creates == 0 and job.state == "pending_approval", (text, job)
    assert stack.notifier.drain()
    thread = [c.body for c in stack.slack.of("chat.postMessage") if c.body.get("thread_ts") == job.thread_ts]
    ask = next(m for m in thread if "approve_job" in str(m.get("blocks")))
    assert "not rented unless someone approves it" in str(ask["blocks"]) and "h100-80gb" in str(ask["blocks"])
    text = stack.said(lambda: stack.click(stack.action_payload("approve_job", job.job_id, user=MALLORY)))
    assert "only admins approve" in text and h100.creates == 0
    text = stack.said(lambda: stack.click(stack.action_payload("approve_job", job.job_id, user=ADMIN)))
    assert "approved" in text
    assert stack.engine.get_job(job.job_id).provider == "runpod" and h100.creates == 1


def test_budgets_stop_and_refuse_and_the_running_limit_holds_in_slack(make_stack, dataset: Path) -> None:
    """a9605e4: `team` was never set (team budgets saw nothing), a user at 2,350% of budget still launched,
    and one user ran 12 jobs at once."""
    from store.models import Job

    stack = make_stack(TUNEBOT_MAX_RUNNING_PER_USER="2")
    launch = f"Llama-3.1-8B method=qlora dataset={dataset}"
    for _ in range(2):
        assert "Launching job" in stack.launch(launch)
    text = stack.launch(launch)
    assert "already has 2 job(s) running" in text and "TUNEBOT_MAX_RUNNING_PER_USER" in text, text
    assert stack.cloud.creates == 2
    with stack.engine.session() as s:
        assert {t for (t,) in s.execute(select(Job.team))} == {"T1"}  # the signed payload's workspace
    # The workspace's budget is spent: every member's launch is refused, naming it and who raises it.
    assert "Budget for team" in stack.said(
        lambda: stack.command("budget set team T1 daily=$0.000001", user=ADMIN)
    )
    time.sleep(0.05)  # a few cents of spend at $0.40/h
    text = stack.launch(launch, user=MALLORY)
    assert "team T1's daily budget" in text and "is spent" in text and "an admin (U_ADMIN)" in text, text
    assert stack.cloud.creates == 2
    stack.engine.tick()  # the running jobs it covers stop (after a checkpoint where the host can)
    assert {j.stop_reason for j in stack.engine.list_jobs()} == {"budget"}


def test_an_allow_list_denies_dms_and_unlisted_channels(make_stack, dataset: Path) -> None:
    """a9605e4: the channel allow list let direct messages (and every unlisted channel) launch."""
    stack = make_stack(TUNEBOT_ALLOWED_CHANNELS="C_ML", TUNEBOT_CHANNEL_ALLOW="C_ML=U_ALICE|U_MALLORY")
    launch = f"launch Llama-3.1-8B method=qlora dataset={dataset}"
    for channel in ("D0MALLORY", "C_RANDOM"):
        text = stack.said(lambda channel=channel: stack.command(launch, user=MALLORY, channel=channel))
        assert "is not allowed here" in text and "TUNEBOT_ALLOWED_CHANNELS" in text, text
        # The estimate's own Launch button, clicked where it was posted: refused by the engine's rule too.
        eid = stack.estimate(f"Llama-3.1-8B method=qlora dataset={dataset}", user=MALLORY, channel=channel)
        click = stack.action_payload("launch_cheapest", eid, user=MALLORY, channel=channel)
        assert "is not allowed here" in stack.said(lambda click=click: stack.click(click))
    assert stack.cloud.creates == 0 and stack.engine.list_jobs() == []
    assert "Launching job" in stack.launch(f"Llama-3.1-8B method=qlora dataset={dataset}", channel="C_ML")


def test_members_push_only_to_the_configured_hub_namespaces(make_stack, dataset: Path) -> None:
    """a9605e4: any member pushed to any Hub repo the operator's token could write, and made it public."""
    stack = make_stack(HF_TOKEN="hf_operator_token", TUNEBOT_HUB_NAMESPACES="acme")
    base = f"Llama-3.1-8B method=qlora dataset={dataset}"
    text = stack.launch(f"{base} push_to_hub=victim-org/prod-model public=yes", user=MALLORY)
    assert "pushes only to acme (TUNEBOT_HUB_NAMESPACES), not to victim-org" in text, text
    assert stack.cloud.creates == 0 and stack.engine.list_jobs() == []
    text = stack.launch(f"{base} push_to_hub=acme/mallory-model public=yes", user=MALLORY)
    (job,) = stack.engine.list_jobs()
    assert job.state == "pending_approval" and stack.cloud.creates == 0, text
    text = stack.said(lambda: stack.click(stack.action_payload("approve_job", job.job_id, user=ALICE)))
    assert "Not allowed: only admins approve" in text and stack.cloud.creates == 0
    stack.said(lambda: stack.click(stack.action_payload("approve_job", job.job_id, user=ADMIN)))
    assert stack.engine.get_job(job.job_id).state == "running" and stack.cloud.creates == 1
