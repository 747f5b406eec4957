"""Job creation, approval, idempotency, launch and stop: the lifecycle as a user sees it."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from bot.engine.api import EngineError, PermissionDenied
from bot.engine.permissions import OPERATOR
from bot.engine.record.states import IllegalTransition, transition
from store.models import AuditLog, Instance, Job

from .conftest import Recorder, estimate_for, request


def test_create_locks_price_estimate_and_cap_then_launches(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=2.0), max_cost=5.0)
    assert job.state == "running"
    assert job.price_per_hour == pytest.approx(1.0)
    assert job.estimated_cost == pytest.approx(2.0)
    assert job.max_cost == 5.0
    assert fake.creates == 1
    # The JobSpec travels in the environment with a per-job token; only its hash is stored.
    env = fake.launch_requests[0].env
    from runner.contract.spec import JobSpec

    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    assert spec.job_id == job.job_id and spec.report.token
    assert spec.checkpoint.uri.endswith(f"{job.job_id}/runs/{spec.run_id}/checkpoints")  # the run's own
    with engine.session() as s:
        row = s.get(Job, job.job_id)
        assert row.token_hash and spec.report.token not in row.token_hash
        audit = s.execute(select(AuditLog.action).where(AuditLog.job_id == job.job_id)).scalars().all()
    assert "create" in audit and any(a.endswith("->launching") for a in audit)
    assert rec.kinds()[:2] == ["job_created", "job_started"]


def test_same_idempotency_key_returns_same_job(engine, fake):
    est = estimate_for(fake)
    a = engine.create_job(request(), user="alice", estimate=est, idempotency_key="slack:T1:abc")
    b = engine.create_job(request(), user="alice", estimate=est, idempotency_key="slack:T1:abc")
    assert a.job_id == b.job_id
    assert fake.creates == 1
    c = engine.create_job(request(), user="alice", estimate=est, idempotency_key="slack:T1:other")
    assert c.job_id != a.job_id


def test_expensive_job_needs_approval_by_someone_else(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    assert job.state == "pending_approval"
    assert "approval_needed" in rec.kinds()
    assert fake.creates == 0
    with pytest.raises(PermissionDenied):
        engine.approve(job.job_id, approver="alice")
    assert engine.get_job(job.job_id).state == "pending_approval"
    with pytest.raises(PermissionDenied, match="the operator approves it"):  # no admins: no member approves
        engine.approve(job.job_id, approver="bob")
    ok = engine.approve(job.job_id, approver=OPERATOR)  # `tunebot approve JOB` on the bot's machine
    assert ok.state == "running" and fake.creates == 1
    again = engine.approve(job.job_id, approver=OPERATOR)  # a second click is a no-op that says so
    assert "already" in (again.message or "")
    assert fake.creates == 1


def test_stop_before_approval_cancels(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=100.0))
    with pytest.raises(PermissionDenied):
        engine.stop(job.job_id, user="mallory")
    assert engine.stop(job.job_id, user="alice").state == "cancelled"
    assert engine.approve(job.job_id, approver=OPERATOR).state == "cancelled"
    assert fake.creates == 0


def test_price_rise_above_tolerance_stops_the_launch_with_reason(engine, fake):
    est = estimate_for(fake)
    fake.live_price = 1.5  # +50% > 10% tolerance
    job = engine.create_job(request(), user="alice", estimate=est)
    assert job.state == "stopped" and job.stop_reason == "price"
    assert "price" in (job.message or "")
    assert fake.creates == 0


def test_price_rise_within_tolerance_locks_the_live_price(engine, fake):
    est = estimate_for(fake)
    fake.live_price = 1.05
    job = engine.create_job(request(), user="alice", estimate=est)
    assert job.state == "running" and job.price_per_hour == pytest.approx(1.05)
    with engine.session() as s:
        inst = s.execute(select(Instance)).scalars().one()
    assert inst.price_per_hour == pytest.approx(1.05)


def test_no_capacity_falls_back_to_next_offer(make_engine, fake):
    from .fakes import FakeProvider

    other = FakeProvider("other", price=1.2)
    eng = make_engine(providers={"fake": fake, "other": other})
    fake.capacity = False
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake, other))
    assert job.state == "running" and job.provider == "other"
    assert other.creates == 1 and fake.creates == 0


def test_missing_dataset_and_unknown_choice_are_refused(engine, fake):
    with pytest.raises(EngineError, match="dataset"):
        engine.create_job(request(dataset=None), user="alice", estimate=estimate_for(fake))
    with pytest.raises(EngineError, match="unknown offer"):
        engine.create_job(request(), user="alice", estimate=estimate_for(fake), choice="nope")


def test_offer_key_choice(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake), choice="fake:fake-1:od")
    assert job.provider == "fake"


def test_state_machine_refuses_illegal_transitions(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    with engine.session() as s, pytest.raises(IllegalTransition):
        transition(s, job.job_id, "succeeded", "running", actor="x", now=0.0)
    with engine.session() as s:  # a transition from a state the job is not in changes nothing
        assert not transition(s, job.job_id, "approved", "launching", actor="x", now=0.0)
    assert engine.get_job(job.job_id).state == "running"


def test_user_stop_is_graceful_then_final(engine, fake, clock):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    clock.advance(600)
    view = engine.stop(job.job_id, user="alice")
    # FakeProvider has no graceful stop: the engine terminates and confirms at once.
    assert view.state == "stopped" and view.stop_reason == "user"
    assert fake.live() == []
    assert view.spend == pytest.approx(600 / 3600 * 1.0, abs=1e-5)
    assert "stopped" in rec.kinds()


def test_the_runner_trains_the_estimated_plan_on_every_launch(engine, fake, clock):
    """The plan the estimate priced is stored once (jobs.plan) and is what each launch hands the runner:
    model, steps, tokens per sequence, LoRA targets, whatever the request said; a relaunch uses it again."""
    from bot.planner.training import training_plan_without_model
    from bot.providers.base import InstanceStatus
    from runner.contract.spec import JobSpec

    req = request(seq_len=2048)
    est = estimate_for(fake)
    est.training = training_plan_without_model(req).model_copy(
        update={"max_steps": 123, "seq_len": 512, "micro_batch_size": 3, "lora_targets": ["q_proj", "v_proj"]}
    )
    job = engine.create_job(req, user="alice", estimate=est)
    clock.advance(600)
    fake.set_status(fake.live()[0].instance_id, InstanceStatus.preempted)
    engine.tick()  # relaunched
    specs = [JobSpec.model_validate_json(r.env["TUNEBOT_JOB_SPEC"]) for r in fake.launch_requests]
    assert len(specs) == 2
    for spec in specs:
        assert spec.base_model == est.training.base_model == "tiny"
        assert (spec.max_steps, spec.seq_len, spec.micro_batch_size) == (123, 512, 3)
        assert spec.lora.target_modules == ["q_proj", "v_proj"]
    with engine.session() as s:
        row = s.get(Job, job.job_id)
        assert row.plan["max_steps"] == 123 and row.plan["seq_len"] == 512  # stored once, under one name
        assert row.request["seq_len"] == 2048  # what was asked stays what was asked
