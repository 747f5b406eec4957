"""Double clicks and races: fifty concurrent approvals/launches make one job and one instance."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from bot.engine.api import EngineError
from bot.engine.permissions import OPERATOR, Permissions
from store.models import Instance, Job

from .conftest import estimate_for, request
from .fakes import FakeProvider


class SlowProvider(FakeProvider):
    """Widens the race window: a launch takes a while, as a real create call does."""

    def launch(self, request):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        return super().launch(request)


def test_fifty_concurrent_approvals_and_launches_make_one_instance(make_engine):
    slow = SlowProvider("slow")
    admins = frozenset(f"user{i}" for i in range(50))  # fifty people who may approve, clicking at once
    eng = make_engine(providers={"slow": slow}, permissions=Permissions(admins=admins))
    job = eng.create_job(request(), user="alice", estimate=estimate_for(slow, hours=100.0))
    assert job.state == "pending_approval"
    barrier = threading.Barrier(50)

    def click(i: int) -> str:
        barrier.wait()
        if i % 2:
            return eng.approve(job.job_id, approver=f"user{i}").state
        return eng.launch(job.job_id, user=f"user{i}").state

    with ThreadPoolExecutor(50) as pool:
        states = list(pool.map(click, range(50)))
    assert all(s in ("pending_approval", "approved", "launching", "running") for s in states)
    final = eng.get_job(job.job_id)
    assert final.state == "running"
    assert slow.creates == 1
    with eng.session() as s:
        assert s.execute(select(func.count()).select_from(Instance)).scalar_one() == 1
        approver = s.get(Job, job.job_id).approved_by
    assert approver and approver != "alice"


def test_concurrent_creates_with_one_idempotency_key_make_one_job(make_engine):
    slow = SlowProvider("slow")
    eng = make_engine(providers={"slow": slow})
    est = estimate_for(slow)
    barrier = threading.Barrier(20)

    def create(_: int) -> str:
        barrier.wait()
        return eng.create_job(request(), user="alice", estimate=est, idempotency_key="slack:retry-1").job_id

    with ThreadPoolExecutor(20) as pool:
        ids = set(pool.map(create, range(20)))
    assert len(ids) == 1
    with eng.session() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1
    assert slow.creates == 1


def test_two_engines_on_one_database_launch_once(make_engine):
    slow = SlowProvider("slow")
    a = make_engine(providers={"slow": slow})
    b = make_engine(providers={"slow": slow})
    a.auto_launch = b.auto_launch = False
    job = a.create_job(request(), user="alice", estimate=estimate_for(slow))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda e: e.tick(), [a, b]))
    assert slow.creates == 1
    assert a.get_job(job.job_id).state == "running"
    try:
        a.approve(job.job_id, approver=OPERATOR)
    except EngineError:
        raise AssertionError("a late approval must be a no-op, not an error") from None
    assert slow.creates == 1
