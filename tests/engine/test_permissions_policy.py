"""One permissions policy: the engine enforces what the chat says, on every surface."""

from __future__ import annotations

import pytest

from bot.chat.handlers import ChatHandlers
from bot.engine.api import PermissionDenied
from bot.engine.jobstate import OPEN, JobState
from bot.engine.permissions import OPERATOR, Permissions

from .conftest import estimate_for, request


def test_with_admins_configured_the_engine_refuses_a_non_admin_approval(make_engine, fake):
    eng = make_engine(permissions=Permissions(admins=frozenset({"boss"})))
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    with pytest.raises(PermissionDenied, match="only admins approve"):
        eng.approve(job.job_id, approver="bob")  # the CLI or any other surface: the same rule as Slack
    assert eng.get_job(job.job_id).state == JobState.PENDING_APPROVAL and fake.creates == 0
    assert eng.approve(job.job_id, approver="boss").state == JobState.RUNNING
    with pytest.raises(PermissionDenied, match="only admins set budgets"):
        eng.set_budget("user", "alice", daily=5.0, monthly=None, user="bob")
    with pytest.raises(PermissionDenied):
        eng.stop(job.job_id, user="bob")
    assert eng.stop(job.job_id, user="boss").state == JobState.STOPPED


def test_chat_without_its_own_policy_asks_the_engines(make_engine):
    policy = Permissions(admins=frozenset({"boss"}))
    eng = make_engine(permissions=policy)
    assert ChatHandlers(eng).permissions is policy


def test_an_install_without_admins_is_approved_by_the_operator_only(engine, fake):
    """Issue 28: with no TUNEBOT_ADMINS anyone but the owner approved (a second Slack account sufficed); now
    no member approves, the operator does on the bot's machine (`tunebot approve JOB`)."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    with pytest.raises(PermissionDenied, match="own job"):
        engine.approve(job.job_id, approver="alice")
    with pytest.raises(PermissionDenied, match="the operator approves it on the bot's machine"):
        engine.approve(job.job_id, approver="bob")
    assert engine.get_job(job.job_id).state == JobState.PENDING_APPROVAL and fake.creates == 0
    assert engine.approve(job.job_id, approver=OPERATOR).state == JobState.RUNNING


def test_awaiting_approval_is_active_for_people_everywhere(engine, fake):
    from bot.chat import cards

    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    assert [j.job_id for j in engine.list_jobs(user="alice", active_only=True)] == [job.job_id]
    assert JobState.PENDING_APPROVAL in OPEN
    card = cards.job_card(engine.get_job(job.job_id))  # the Stop button too, not only `jobs --active`
    assert "stop_job" in str(card.parts)
    engine.stop(job.job_id, user="alice")
    assert engine.list_jobs(user="alice", active_only=True) == []
