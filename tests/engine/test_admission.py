"""Budgets that stop, the per-user running limit and jobs.team (issue 19): enforced in the engine, on every
backend, whatever the door."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from bot.engine.api import EngineError
from bot.engine.permissions import OPERATOR, Permissions
from store.models import Job

from .conftest import Recorder, estimate_for, request
from .fakes import FakeProvider

SOON = 500.0  # under the heartbeat timeout (600 s without a runner event)


def test_a_spent_budget_refuses_launches_and_stops_running_jobs(make_engine, clock):
    """a9605e4: budgets only alerted; a user at 2,350% of their budget still launched."""
    p = FakeProvider("p", price=169.2)  # $23.50 in 500 s
    eng = make_engine(providers={"p": p}, permissions=Permissions(admins=frozenset({"boss"})))
    eng.set_budget("user", "alice", daily=1.0, monthly=None, user="boss")
    rec = Recorder(eng.bus)
    running = eng.create_job(request(), user="alice", estimate=estimate_for(p, hours=0.2), max_cost=40.0)
    clock.advance(SOON)  # $23.50 of a $1 daily budget: 2,350%
    eng.tick()
    stopped = eng.get_job(running.job_id)
    assert stopped.state == "stopped" and stopped.stop_reason == "budget"
    notice = next(e for e in rec.events if e.kind == "budget_alert" and e.job_id == running.job_id)
    assert "stopping after a checkpoint" in notice.message and "admin (boss)" in notice.message
    creates = p.creates
    with pytest.raises(EngineError) as refused:
        eng.create_job(request(), user="alice", estimate=estimate_for(p, hours=0.01))
    text = str(refused.value)
    assert "alice's daily budget of $1.00 is spent ($23.50 today)" in text
    assert "an admin (boss) can raise it" in text and "budget set user alice daily=" in text
    assert p.creates == creates and len(eng.list_jobs(user="alice")) == 1
    assert eng.create_job(request(), user="bob", estimate=estimate_for(p, hours=0.01)).state == "running"
    eng.set_budget("user", "alice", daily=100.0, monthly=None, user="boss")  # an admin raises it
    assert eng.create_job(request(), user="alice", estimate=estimate_for(p, hours=0.01)).state == "running"


def test_an_approved_job_whose_budget_is_spent_meanwhile_is_cancelled_not_launched(make_engine, clock):
    p = FakeProvider("p", price=10.0)
    eng = make_engine(providers={"p": p})
    waiting = eng.create_job(request(), user="alice", estimate=estimate_for(p, hours=10.0))  # $100: approval
    eng.create_job(request(), user="alice", estimate=estimate_for(p))
    clock.advance(SOON)  # $1.39
    eng.set_budget("user", "alice", daily=1.0, monthly=None, user=OPERATOR)  # no admins: the operator's
    eng.tick()  # the running job stops at once (no graceful stop on this fake)
    creates = p.creates
    job = eng.approve(waiting.job_id, approver=OPERATOR)
    assert job.state == "cancelled" and job.stop_reason == "budget" and p.creates == creates
    assert "daily budget of $1.00 is spent" in (job.message or "")


def test_jobs_carry_a_team_and_team_budgets_refuse(make_engine, clock):
    """a9605e4: jobs.team was never set, so team budgets never saw any spend."""
    p = FakeProvider("p", price=10.0)
    eng = make_engine(providers={"p": p})
    slack = eng.create_job(request(), user="alice", team="T_ACME", estimate=estimate_for(p))
    console = eng.create_job(request(), user="carol", estimate=estimate_for(p))
    with eng.session() as s:
        teams = dict(s.execute(select(Job.id, Job.team)).all())
    assert teams == {slack.job_id: "T_ACME", console.job_id: "local"}  # TUNEBOT_TEAM's default
    eng.set_budget("team", "T_ACME", daily=1.0, monthly=None, user=OPERATOR)
    clock.advance(SOON)
    eng.tick()
    assert eng.get_job(slack.job_id).stop_reason == "budget"
    assert eng.get_job(console.job_id).state == "running"  # another team
    with pytest.raises(EngineError, match="team T_ACME's daily budget"):
        eng.create_job(request(), user="dave", team="T_ACME", estimate=estimate_for(p))


def test_one_person_runs_at_most_the_limit_even_when_launching_at_once(make_engine):
    """a9605e4: one user ran 12 jobs at once (no limit). Twelve concurrent launches: the limit holds."""
    p = FakeProvider("p", price=1.0)
    eng = make_engine(providers={"p": p})
    limit = 4  # TUNEBOT_MAX_RUNNING_PER_USER's default
    results: list[object] = []
    barrier = threading.Barrier(12)

    def launch() -> None:
        barrier.wait()
        try:
            results.append(eng.create_job(request(), user="alice", estimate=estimate_for(p)))
        except EngineError as exc:
            results.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    refused = [r for r in results if isinstance(r, EngineError)]
    assert len(results) == 12 and len(refused) == 12 - limit, results
    assert all("TUNEBOT_MAX_RUNNING_PER_USER" in str(r) for r in refused)
    assert p.creates == limit and len(eng.list_jobs(user="alice", active_only=True)) == limit
    assert eng.create_job(request(), user="bob", estimate=estimate_for(p)).state == "running"


def test_an_approved_job_over_the_limit_waits_for_a_slot(make_engine):
    p = FakeProvider("p", price=1.0)
    eng = make_engine(providers={"p": p}, permissions=Permissions(max_running_per_user=1))
    first = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    big = eng.create_job(request(), user="alice", estimate=estimate_for(p, hours=100.0))  # needs approval
    job = eng.approve(big.job_id, approver=OPERATOR)
    assert job.state == "approved" and "waiting to launch" in (job.message or "") and p.creates == 1
    eng.stop(first.job_id, user="alice")
    eng.tick()
    assert eng.get_job(big.job_id).state == "running" and p.creates == 2
