"""One permissions policy: the engine enforces what the chat says, on every surface."""

from __future__ import annotations

import pytest

from bot.chat.handlers import ChatHandlers
from bot.engine.api import EngineError, PermissionDenied
from bot.engine.permissions import ENGINE, OPERATOR, Permissions
from bot.engine.record.jobstate import OPEN, JobState

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


def test_an_install_without_admins_has_its_budgets_set_by_the_operator_only(engine, fake, clock):
    """Issue 28: with no TUNEBOT_ADMINS any member set budgets: one whose budget stopped their jobs raised it,
    or lowered another's. Now they follow approvals: the operator sets them on the bot's machine."""
    engine.set_budget("user", "alice", daily=0.4, monthly=None, user=OPERATOR)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=1.0), max_cost=5.0)
    clock.advance(1800)  # $0.50 of a $0.40 daily budget
    engine.tick()
    assert engine.get_job(job.job_id).stop_reason == "budget"
    for who, scope, name, daily in (
        ("alice", "user", "alice", 1000.0),  # raising her own spent budget
        ("bob", "user", "alice", 0.01),  # lowering someone else's
        ("bob", "team", "local", 0.01),  # everyone's
        (ENGINE, "user", "alice", 1000.0),
    ):
        with pytest.raises(
            PermissionDenied, match=r"the operator sets budgets on the bot's machine: `tunebot budget set"
        ):
            engine.set_budget(scope, name, daily=daily, monthly=None, user=who)
    assert [(b.scope, b.name, b.daily) for b in engine.budgets()] == [("user", "alice", 0.4)]
    with pytest.raises(EngineError) as refused:  # the refusal names who can raise it, and how
        engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=0.01))
    assert (
        "the operator, on the bot's machine, can raise it: `tunebot budget set user alice daily=AMOUNT`"
        in str(refused.value)
    )
    assert engine.set_budget("user", "alice", daily=10.0, monthly=None, user=OPERATOR).daily == 10.0
    assert engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=0.01)).job_id


def test_with_admins_configured_admins_and_the_operator_set_budgets(make_engine):
    eng = make_engine(permissions=Permissions(admins=frozenset({"boss"})))
    for who in ("alice", ENGINE):
        with pytest.raises(PermissionDenied, match="only admins set budgets"):
            eng.set_budget("user", "alice", daily=1000.0, monthly=None, user=who)
    assert eng.set_budget("user", "alice", daily=5.0, monthly=None, user="boss").daily == 5.0
    assert eng.set_budget("user", "alice", daily=6.0, monthly=None, user=OPERATOR).daily == 6.0


def test_awaiting_approval_is_active_for_people_everywhere(engine, fake):
    from bot.chat import cards

    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    assert [j.job_id for j in engine.list_jobs(user="alice", active_only=True)] == [job.job_id]
    assert JobState.PENDING_APPROVAL in OPEN
    card = cards.job_card(engine.get_job(job.job_id))  # the Stop button too, not only `jobs --active`
    assert "stop_job" in str(card.parts)
    engine.stop(job.job_id, user="alice")
    assert engine.list_jobs(user="alice", active_only=True) == []
