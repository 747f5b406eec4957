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
from fakes.worlds import SlackStack, engine_slack_worlds

from bot.providers.base import Volume

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
def make_stack(tmp_path: Path, shared: Path) -> Iterator[Callable[..., SlackStack]]:
    """The Slack world on the real engine with Slack uploads (files.info + download) and the given settings
    (TUNEBOT_ADMINS=U_ADMIN unless given); members name files in ``shared``."""
    with engine_slack_worlds(tmp_path, chat_data_dir=shared, uploads=True) as make:
        yield make


def whole(stack: SlackStack, send: Callable[[], httpx.Response]) -> str:
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
    assert f"no job {job.job_id}" in status and "Not allowed" not in status, status  # as an unknown id
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


def _upload_job(stack: SlackStack) -> str:
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
    assert f"no job {job.job_id}" in stolen, stolen  # a job they may not read: as one that does not exist
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


def budget_submission(user: str, *, scope: str, name: str, daily: str) -> dict[str, Any]:
    """The App Home budget modal's "Save", as Slack posts it (a member can post it without the button)."""
    plain = {"type": "plain_text_input"}
    return {
        "type": "view_submission",
        "team": {"id": "T1"},
        "user": {"id": user, "name": user.lower()},
        "api_app_id": "A1",
        "trigger_id": "trig-budget",
        "view": {
            "id": "V1",
            "type": "modal",
            "callback_id": "budget_modal",
            "private_metadata": "",
            "state": {
                "values": {
                    "scope": {"value": {"type": "static_select", "selected_option": {"value": scope}}},
                    "name": {"value": {**plain, "value": name}},
                    "daily": {"value": {**plain, "value": daily}},
                    "monthly": {"value": {**plain, "value": ""}},
                }
            },
        },
    }


def _budgets(stack: SlackStack) -> list[tuple[str, str, float | None]]:
    return [(b.scope, b.name, b.daily) for b in stack.engine.budgets()]


def test_without_admins_no_member_sets_budgets_the_operator_does_from_the_cli(
    make_stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5982010: with no TUNEBOT_ADMINS any member set budgets (`/tune budget set`, the App Home modal): one
    whose budget stopped their jobs raised it, or lowered someone else's to stop theirs."""
    from bot.engine.api import PermissionDenied
    from bot.engine.permissions import OPERATOR

    stack = make_stack(TUNEBOT_ADMINS="")
    stack.engine.set_budget("user", ALICE, daily=1.0, monthly=None, user=OPERATOR)
    stack.engine.set_budget("user", MALLORY, daily=5.0, monthly=None, user=OPERATOR)
    before = _budgets(stack)

    for who, words in (
        (ALICE, f"budget set user {ALICE} daily=1000"),  # raising her own
        (MALLORY, f"budget set user {ALICE} daily=0.01"),  # lowering another's to stop her jobs
        (MALLORY, "budget set team T1 daily=0.01"),  # the whole workspace's
    ):
        said = stack.said(lambda who=who, words=words: stack.command(words, user=who))
        assert "Not allowed" in said and "the operator sets budgets on the bot's machine" in said, said
        assert "`tunebot budget set user|team NAME daily=X monthly=Y`" in said, said
    # App Home offers no "Set a budget" to her; a forged click opens no modal, and the refusal comes by DM.
    stack.event({"type": "app_home_opened", "user": ALICE, "channel": "D1", "tab": "home"})
    home = stack.slack.wait_for("views.publish")[0].body["view"]
    assert "open_budget_modal" not in json.dumps(home["blocks"]) and "Your spend" in json.dumps(
        home["blocks"]
    )
    assert stack.click(stack.action_payload("open_budget_modal", "budget", user=ALICE)).status_code == 200
    (refusal,) = (m.body for m in stack.slack.wait_for("chat.postMessage"))
    assert refusal["channel"] == f"D{ALICE}" and "the operator sets budgets" in refusal["text"], refusal
    assert stack.slack.of("views.open") == []
    # The modal's Save, posted without the modal: the same refusal, by DM.
    saved = stack.click(budget_submission(ALICE, scope="user", name=ALICE, daily="1000"))
    assert saved.status_code == 200 and not saved.text
    dm = stack.slack.wait_for("chat.postMessage", 2)[1].body
    assert dm["channel"] == f"D{ALICE}" and "Not allowed" in dm["text"] and "tunebot budget set" in dm["text"]
    with pytest.raises(PermissionDenied):  # the engine's own door refuses the same
        stack.engine.set_budget("user", ALICE, daily=1000.0, monthly=None, user=ALICE)
    assert _budgets(stack) == before

    # The operator, on the bot's machine: `tunebot budget set` (the same grammar), as the operator.
    from typer.testing import CliRunner

    from bot.cli import app
    from bot.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.delenv("TUNEBOT_ADMINS", raising=False)
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(app, ["budget", "set", "user", ALICE, "daily=lots"])
        assert out.exit_code == 2 and "not an amount of dollars" in out.output, out.output
        out = CliRunner().invoke(app, ["budget", "set", "user", ALICE, "daily=$50", "monthly=400"])
        assert out.exit_code == 0, out.output
        assert f"Budget for user {ALICE}: daily $50.00, monthly $400.00" in out.output, out.output
        out = CliRunner().invoke(app, ["budget", "show"])  # the operator reads every budget
        assert out.exit_code == 0 and ALICE in out.output and MALLORY in out.output, out.output
    finally:
        get_settings.cache_clear()
    assert ("user", ALICE, 50.0) in _budgets(stack)
    from sqlalchemy import select

    from store.models import AuditLog

    with stack.engine.session() as s:
        actors = [
            a.actor for a in s.execute(select(AuditLog).where(AuditLog.action == "set-budget")).scalars()
        ]
    assert actors == [OPERATOR, OPERATOR, OPERATOR]  # nobody else ever set one


def test_with_admins_only_an_admin_sets_budgets_and_a_member_reads_only_their_own(make_stack) -> None:
    """5982010: `/tune budget` showed every member's budget and what they spent today and this month."""
    stack = make_stack()  # TUNEBOT_ADMINS=U_ADMIN
    said = stack.said(lambda: stack.command(f"budget set user {MALLORY} daily=1000", user=MALLORY))
    assert "Not allowed: only admins set budgets" in said, said
    said = stack.said(lambda: stack.command(f"budget set user {MALLORY} daily=10", user=ADMIN))
    assert f"Budget for user *{MALLORY}*: daily $10.00" in said, said
    assert "Budget for" in stack.said(
        lambda: stack.command(f"budget set user {ALICE} daily=$7.25", user=ADMIN)
    )
    assert "Budget for" in stack.said(lambda: stack.command("budget set team T1 monthly=$900", user=ADMIN))
    assert _budgets(stack) == [("team", "T1", None), ("user", ALICE, 7.25), ("user", MALLORY, 10.0)]

    hers = whole(stack, lambda: stack.command("budget", user=MALLORY))
    assert MALLORY in hers and "$10.00" in hers, hers
    assert ALICE not in hers and "$7.25" not in hers and "$900" not in hers, hers
    assert "Only admins see other people's and teams' budgets" in hers
    carol = whole(stack, lambda: stack.command("budget", user="U_CAROL"))
    assert "You have no budget" in carol and ALICE not in carol and MALLORY not in carol, carol
    everything = whole(stack, lambda: stack.command("budget", user=ADMIN))
    assert all(n in everything for n in (ALICE, MALLORY, "$7.25", "$900.00")), everything
    assert len(stack.engine.budgets(viewer=MALLORY)) == 1  # the engine's own door filters the same
