"""Approval covers what a job may spend (issue 19): max_cost counts, and a launch never rents a pricier offer
than the approved one beyond what was accepted without asking again (first launch or relaunch)."""

from __future__ import annotations

import math

import pytest

from bot.engine.api import EngineError, PermissionDenied
from bot.engine.permissions import OPERATOR, Permissions
from bot.providers.base import InstanceStatus

from .conftest import Recorder, request
from .fakes import FakeProvider, make_estimate


def test_max_cost_counts_for_approval_and_has_a_limit(engine, fake):
    """a9605e4: only the chosen offer's estimate was compared, so max_cost=$1,000,000 on a $1 job launched."""
    est = make_estimate([fake.offer()], hours=1.0)  # $1.00
    for huge in (1_000_000.0, math.inf):
        with pytest.raises(EngineError, match="max_cost"):
            engine.create_job(request(), user="alice", estimate=est, max_cost=huge)
    assert fake.creates == 0 and engine.list_jobs() == []
    job = engine.create_job(request(), user="alice", estimate=est, max_cost=500.0)
    assert job.state == "pending_approval" and job.max_cost == 500.0 and fake.creates == 0
    with pytest.raises(PermissionDenied, match="your own job"):
        engine.approve(job.job_id, approver="alice")
    assert engine.approve(job.job_id, approver=OPERATOR).state == "running"  # no admins: the operator
    small = engine.create_job(request(), user="alice", estimate=est, max_cost=20.0)
    assert small.state == "running"  # at most $20: under the $50 approval amount


def _two_clouds(make_engine, **kw):  # type: ignore[no-untyped-def]
    cheap = FakeProvider("cheap", price=1.0, interruptible=True)
    h100 = FakeProvider("h100", price=60.0, gpu="h100-80gb")
    eng = make_engine(providers={"cheap": cheap, "h100": h100}, **kw)
    return eng, cheap, h100, make_estimate([cheap.offer(), h100.offer()], hours=1.44)


def test_no_capacity_never_falls_back_to_a_pricier_offer_without_asking(make_engine):
    """a9605e4: the chosen $1.44 offer had no capacity, so launch rented the $60/h H100 without asking."""
    eng, cheap, h100, est = _two_clouds(make_engine, permissions=Permissions(admins=frozenset({"boss"})))
    rec = Recorder(eng.bus)
    cheap.capacity = False
    job = eng.create_job(request(), user="alice", estimate=est)
    assert h100.creates == 0 and cheap.creates == 0
    assert job.state == "pending_approval", job
    assert job.provider == "h100" and job.estimated_cost == pytest.approx(60.0 * 1.44)  # the proposal
    assert "needs approval again" in rec.events[-1].message and "h100" in rec.events[-1].message
    assert rec.kinds()[-1] == "approval_needed"
    with pytest.raises(PermissionDenied):
        eng.approve(job.job_id, approver="alice")
    with pytest.raises(PermissionDenied, match="only admins"):
        eng.approve(job.job_id, approver="mallory")
    approved = eng.approve(job.job_id, approver="boss")
    assert approved.state == "running" and approved.provider == "h100" and h100.creates == 1


def test_relaunch_after_a_preemption_asks_before_a_pricier_offer(make_engine):
    eng, cheap, h100, est = _two_clouds(make_engine)
    job = eng.create_job(request(), user="alice", estimate=est)
    assert job.state == "running" and job.provider == "cheap"
    cheap.capacity = False
    for iid in list(cheap.instances):
        cheap.set_status(iid, InstanceStatus.preempted)
    eng.tick()
    after = eng.get_job(job.job_id)
    assert after.state == "pending_approval" and h100.creates == 0
    assert "relaunching" in (after.message or "")


def test_a_fallback_within_what_was_accepted_is_rented_at_once(make_engine):
    cheap = FakeProvider("cheap", price=1.0)
    near = FakeProvider("near", price=1.2)
    eng = make_engine(providers={"cheap": cheap, "near": near})
    cheap.capacity = False
    job = eng.create_job(
        request(), user="alice", estimate=make_estimate([cheap.offer(), near.offer()], hours=1.0)
    )
    assert job.state == "running" and job.provider == "near" and near.creates == 1  # $1.20 <= cap $2.00
