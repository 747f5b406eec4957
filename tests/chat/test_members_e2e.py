"""Issue 28, items 4 and 7, played as a hostile workspace member: signed requests to the real Slack HTTP app
(bot.web under uvicorn, the fake Slack Web API) on the real Engine (SQLite, real planner), with an in-memory
cloud. On eac3cff each attack here worked: every member read everyone's jobs, datasets and spend; a member
cloned another's job; the owner could not clone a job whose data was a Slack upload; with no admin configured
anyone but the owner approved; `/tune volumes` listed every cloud on each ask.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine.fakes import FakeProvider
from fakes.slack_api import FakeSlack, UvicornThread

from bot.chat.handlers import ChatHandlers
from bot.chat.notifier import SlackNotifier
from bot.chat.permissions import Permissions
from bot.chat.slack.app import build_app, make_async_client, make_sync_client
from bot.chat.slack.files import SlackFiles
from bot.planner.sources import SourcePolicy
from bot.providers.base import Volume
from bot.settings import Settings
from bot.web import create_app

from .conftest import BOT_TOKEN, SIGNING_SECRET
from .test_authz_e2e import Stack

ALICE, MALLORY, ADMIN = "U_ALICE", "U_MALLORY", "U_ADMIN"
LAUNCH = "Llama-3.1-8B method=qlora"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The one folder members may name (TUNEBOT_CHAT_DATA_DIR), with Alice's private dataset in it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    record = {"instruction": "Alice's secret recipe.", "input": "", "output": "Hi there! " * 20}
    (folder / "alice-private.jsonl").write_text("\n".join(json.dumps(record) for _ in range(200)) + "\n")
    return folder


@pytest.fixture
def make_stack(tmp_path: Path, shared: Path) -> Iterator[Callable[..., Stack]]:
    """The Slack stack with Slack uploads (files.info + download) and the given settings
    (TUNEBOT_ADMINS=U_ADMIN unless given)."""
    from bot.engine.service import Engine

    closers: list[Callable[[], None]] = []

    def make(*, clouds: list[FakeProvider] | None = None, **env: Any) -> Stack:
        slack = FakeSlack().start()
        slack.token = BOT_TOKEN
        closers.append(slack.stop)
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp_path / "data"),
            TUNEBOT_CHAT_DATA_DIR=str(shared),
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_API_URL=slack.api_url,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
            **{"TUNEBOT_ADMINS": ADMIN, **env},
        )
        clouds = clouds or [FakeProvider("vast", price=0.40, volumes=True)]
        engine = Engine(
            settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={c.name: c for c in clouds}
        )
        closers.append(engine.close)
        policy = Permissions.from_settings(settings)
        chat = ChatHandlers(
            engine,
            policy,
            secrets=settings.secrets(),
            sources=SourcePolicy.from_settings(settings),
            files=SlackFiles.from_settings(settings, make_sync_client(settings)),
        )
        bolt = build_app(chat, client=make_async_client(settings), signing_secret=SIGNING_SECRET)
        notifier = SlackNotifier(
            engine,
            make_sync_client(settings),
            admins=sorted(policy.admins),
            update_every_s=1.0,
            chart_every_s=0.0,
        )
        notifier.attach(engine.bus).start()
        closers.append(notifier.stop)
        server = UvicornThread(create_app(bolt_app=bolt, record_runner_event=engine.record_runner_event))
        server.__enter__()
        closers.append(lambda: server.__exit__(None, None, None))
        http = httpx.Client(timeout=20)
        closers.append(http.close)
        stack = Stack(slack, engine, chat, notifier, server.url, http)  # type: ignore[arg-type]
        stack.cloud = clouds[0]
        return stack

    yield make
    for close in reversed(closers):
        close()


def whole(stack: Stack, send: Callable[[], httpx.Response]) -> str:
    """Everything a request's answer shows (text and blocks of the ack or the response that follows)."""
    before = len(stack.slack.of("response"))
    resp = send()
    assert resp.status_code == 200, resp.text
    body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
    if body.get("text") and not str(body["text"]).startswith(":hourglass:"):
        return json.dumps(body)
    return json.dumps(stack.responses(before + 1)[before])


def test_a_member_sees_only_their_own_jobs_datasets_and_spend(make_stack, shared: Path) -> None:
    """eac3cff: `/tune jobs all`, `/tune status JOB` and `/tune spend` showed every member's jobs, datasets
    and spend to anyone in an allowed channel."""
    stack = make_stack()
    assert "Launching job" in stack.launch(f"{LAUNCH} dataset=alice-private.jsonl", user=ALICE)
    (job,) = stack.engine.list_jobs()
    stack.engine.roll_up_spend()

    everything = whole(stack, lambda: stack.command("jobs all", user=MALLORY))
    assert job.job_id not in everything and "alice-private" not in everything, everything
    assert "Only admins see everyone" in everything and "TUNEBOT_TEAM_READ" in everything
    status = whole(stack, lambda: stack.command(f"status {job.job_id}", user=MALLORY))
    assert "Not allowed" in status and "another member" in status, status
    assert "alice-private" not in status and "Llama" not in status
    spend = whole(stack, lambda: stack.command("spend week", user=MALLORY))
    assert ALICE not in spend and job.job_id not in spend, spend
    theirs = whole(stack, lambda: stack.command(f"spend week @{ALICE}", user=MALLORY))
    assert "Not allowed" in theirs and job.job_id not in theirs, theirs

    # The owner and the admins see it all; the engine refuses the same at its own door.
    assert job.job_id in whole(stack, lambda: stack.command(f"status {job.job_id}", user=ALICE))
    assert job.job_id in whole(stack, lambda: stack.command("jobs all", user=ADMIN))
    assert job.job_id in whole(stack, lambda: stack.command("spend week", user=ADMIN))
    from bot.engine.api import PermissionDenied

    with pytest.raises(PermissionDenied):
        stack.engine.get_job(job.job_id, viewer=MALLORY)
    with pytest.raises(PermissionDenied):
        stack.engine.series(job.job_id, viewer=MALLORY)
    with pytest.raises(PermissionDenied):
        stack.engine.list_jobs(viewer=MALLORY)
    with pytest.raises(PermissionDenied):
        stack.engine.spend("week", user=ALICE, viewer=MALLORY)


def test_team_read_opens_reading_but_not_acting(make_stack) -> None:
    stack = make_stack(TUNEBOT_TEAM_READ="1")
    assert "Launching job" in stack.launch(f"{LAUNCH} dataset=alice-private.jsonl", user=ALICE)
    (job,) = stack.engine.list_jobs()
    assert job.job_id in whole(stack, lambda: stack.command("jobs all", user=MALLORY))
    assert job.job_id in whole(stack, lambda: stack.command(f"status {job.job_id}", user=MALLORY))
    stop = whole(stack, lambda: stack.click(stack.action_payload("stop_job", job.job_id, user=MALLORY)))
    assert "only the job's owner or an admin" in stop
    clone = whole(stack, lambda: stack.command(f"clone {job.job_id}", user=MALLORY))
    assert "only the job's owner or an admin may clone it" in clone
    assert stack.engine.get_job(job.job_id).state == "running"


def _upload_job(stack: Stack) -> str:
    rows = "\n".join(json.dumps({"instruction": "Hi?", "output": "Hi there! " * 20}) for _ in range(200))
    stack.slack.add_file("F0UPLOAD1", "alice data.jsonl", (rows + "\n").encode(), user=ALICE)
    assert "Launching job" in stack.launch(f"{LAUNCH} dataset=slack:F0UPLOAD1", user=ALICE)
    (job,) = stack.engine.list_jobs()
    return job.job_id


def test_a_member_cannot_clone_another_members_job(make_stack) -> None:
    """eac3cff: a member cloned another member's job (with its private dataset) to push it to their repo."""
    stack = make_stack(TUNEBOT_CHAT_STORAGE_PREFIXES="s3://team/datasets/")
    assert "Launching job" in stack.launch(f"{LAUNCH} dataset=alice-private.jsonl", user=ALICE)
    (job,) = stack.engine.list_jobs()
    stolen = whole(stack, lambda: stack.command(f"clone {job.job_id} push_to_hub=mallory/x", user=MALLORY))
    assert "only the job's owner or an admin may clone it" in stolen, stolen
    assert "launch_cheapest" not in stolen and "alice-private" not in stolen
    from bot.engine.api import PermissionDenied

    with pytest.raises(PermissionDenied):  # the engine's own door refuses the same
        stack.engine.clone_request(job.job_id, {}, user=MALLORY)
    assert stack.engine.clone_request(job.job_id, {}, user=ADMIN).dataset  # an admin may


def test_the_owner_clones_a_job_whose_dataset_was_a_slack_upload(make_stack) -> None:
    """eac3cff: the owner could not clone a job whose dataset was a Slack upload (its local copy is outside
    the data folder members may name); the upload is fetched again with the cloner's own access."""
    stack = make_stack()
    job_id = _upload_job(stack)
    own = whole(stack, lambda: stack.command(f"clone {job_id} lr=1e-4", user=ALICE))
    assert "launch_cheapest" in own, own  # the estimate with its launch buttons
    launched = stack.said(
        lambda: stack.click(stack.action_payload("launch_cheapest", _estimate_id(own), user=ALICE))
    )
    assert "Launching job" in launched, launched
    assert len(stack.engine.list_jobs(user=ALICE)) == 2 and stack.cloud.creates == 2
    # Someone who may not use the upload (not theirs, not shared where they type) cannot use it by cloning.
    other = whole(stack, lambda: stack.command(f"clone {job_id}", user=ADMIN, channel="C_OTHER"))
    assert "share it in this channel" in other, other


def _estimate_id(answer: str) -> str:
    body = json.loads(answer)
    for block in body.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("action_id") == "launch_cheapest":
                return str(element["value"])
    raise AssertionError(f"no launch button in {answer[:500]}")


def test_without_admins_nobody_approves_in_slack_the_operator_does_from_the_cli(
    make_stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eac3cff: with no TUNEBOT_ADMINS anyone but the owner approved (a second account sufficed), and
    `tunebot approve --user bob` approved in any name."""
    stack = make_stack(TUNEBOT_ADMINS="")
    text = stack.launch(f"{LAUNCH} dataset=alice-private.jsonl max_cost=$900", user=ALICE)
    (job,) = stack.engine.list_jobs()
    for who in (MALLORY, ALICE):  # the buttons are not shown; a forged click is refused all the same
        click = stack.action_payload("approve_job", job.job_id, user=who)
        said = stack.said(lambda click=click: stack.click(click))
        assert "Not allowed" in said and "tunebot approve" in said, said
        said = stack.said(lambda who=who: stack.command(f"approve {job.job_id}", user=who))
        assert "Not allowed" in said, said
    assert stack.engine.get_job(job.job_id).state == "pending_approval" and stack.cloud.creates == 0
    # The launch's answer and the thread say who approves, and offer no button nobody may press.
    assert "nobody approves it in Slack" in text and "tunebot approve" in text, text
    assert stack.notifier.drain()
    asks = [m for m in stack.slack.messages() if "needs approval" in str(m) or "asks to launch" in str(m)]
    assert asks and all("approve_job" not in str(m.get("blocks")) for m in asks), asks
    assert any(f"tunebot approve {job.job_id}" in str(m.get("blocks")) for m in asks), asks

    # The operator, on the bot's machine: `tunebot approve JOB` acts as the operator, never as a member.
    from typer.testing import CliRunner

    from bot.cli import app
    from bot.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.delenv("TUNEBOT_ADMINS", raising=False)
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(app, ["approve", job.job_id, "--user", MALLORY])
        assert out.exit_code == 2 and "never in someone else's name" in out.output, out.output
        assert stack.engine.get_job(job.job_id).state == "pending_approval"
        out = CliRunner().invoke(app, ["approve", job.job_id])
        assert out.exit_code == 0, out.output
    finally:
        get_settings.cache_clear()
    from store.models import Job

    with stack.engine.session() as s:
        assert s.get(Job, job.job_id).approved_by == "operator"  # type: ignore[union-attr]
    stack.engine.tick()  # the supervisor launches what the operator approved
    assert stack.engine.get_job(job.job_id).state == "running" and stack.cloud.creates == 1


def volume(volume_id: str, name: str) -> Volume:
    return Volume(provider="vast", volume_id=volume_id, name=name, size_gb=500, price_per_gb_month=0.1)


def test_volumes_answer_from_a_shared_cache_a_few_times_a_minute_per_member(make_stack) -> None:
    """eac3cff: `/tune volumes` listed every cloud's volumes on each call, with no limit per member."""
    cloud = FakeProvider("vast", price=0.40, volumes=True)
    listings: list[int] = []
    inner = cloud.list_volumes
    cloud.list_volumes = lambda: listings.append(1) or inner()  # type: ignore[method-assign]
    stack = make_stack(clouds=[cloud], TUNEBOT_VOLUMES_PER_MINUTE="3")
    cloud.volumes["prod"] = volume("prod", "company-prod-db")
    answers = [whole(stack, lambda: stack.command("volumes", user=MALLORY)) for _ in range(4)]
    assert all("company-prod-db" not in a for a in answers)  # not tunebot's, not hers: not shown to her
    assert "TUNEBOT_VOLUMES_PER_MINUTE" in answers[3] and "ask again in" in answers[3], answers[3]
    assert "company-prod-db" in whole(stack, lambda: stack.command("volumes", user=ADMIN))
    assert len(listings) == 1, listings  # one listing of the cloud for everyone within the minute
