"""Out of GPU memory after the runner's own back-off (runner/oom.py): the engine relaunches the job on the
cheapest offer with more memory per GPU when that stays within the job's cap, else it asks in the thread, with
what happened and what it costs (bot/engine/grow.py)."""

from __future__ import annotations

import pytest
from fakes.runner_events import checkpoint_event, signed

from bot.engine.grow import choose
from bot.providers.base import InstanceStatus
from runner.spec import EXIT_OUT_OF_MEMORY, JobSpec

from .conftest import Recorder, request
from .fakes import FakeProvider, make_estimate

OOM = "out of GPU memory at micro-batch 1 x grad_accum 8, activation checkpointing on: CUDA out of memory"


def _offer(provider: str, memory: float, total: float, count: int = 1) -> dict:
    return {
        "provider": provider,
        "offer_id": provider,
        "gpu": "g",
        "gpu_count": count,
        "gpu_memory_gb": memory,
        "total_cost": total,
        "fits": True,
    }


def test_choose_the_cheapest_bigger_card_and_check_the_cap() -> None:
    failed = _offer("small", 24, 1.0)
    offers = [
        failed,
        _offer("same", 24, 0.5),
        _offer("big", 80, 6.0),
        _offer("mid", 48, 3.0),
        _offer("two", 48, 2.0, count=2),
    ]
    within = choose(failed, offers, spent=1.5, done=0.0, limit=5.0)
    assert within.offer["provider"] == "mid" and [o["provider"] for o in within.bigger] == ["mid", "big"]
    assert within.cost == pytest.approx(4.5) and within.within_cap
    over = choose(failed, offers, spent=2.5, done=0.0, limit=5.0)
    assert over.offer["provider"] == "mid" and not over.within_cap and over.limit == 5.0
    half_done = choose(failed, offers, spent=2.5, done=0.5, limit=5.0)  # only the rest of the run is paid
    assert half_done.cost == pytest.approx(4.0) and half_done.within_cap
    biggest = choose(_offer("big", 80, 6.0), offers, spent=0.0, done=0.0, limit=99.0)
    assert biggest.offer is None


@pytest.fixture
def clouds() -> tuple[FakeProvider, FakeProvider]:
    return (
        FakeProvider("small", price=0.5, gpu="rtx-4090", memory_gb=24),
        FakeProvider("big", price=2.0, gpu="a100-80gb", memory_gb=80),
    )


def _start(make_engine, clouds, **create):  # type: ignore[no-untyped-def]
    small, big = clouds
    engine = make_engine(providers={small.name: small, big.name: big})
    rec = Recorder(engine.bus)
    job = engine.create_job(
        request(), user="alice", estimate=make_estimate([small.offer(), big.offer()]), **create
    )
    assert job.state == "running" and small.creates == 1 and big.creates == 0
    token = JobSpec.model_validate_json(small.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token
    return engine, rec, job, token


def _out_of_memory(engine, job, token) -> None:  # type: ignore[no-untyped-def]
    event = {
        "job_id": job.job_id,
        "seq": 3,
        "kind": "out_of_memory",
        "step": 0,
        "message": OOM,
        "timestamp": 1000.0,
    }
    assert engine.record_runner_event(job.job_id, token, signed(engine, event))


def test_within_the_cap_it_relaunches_on_the_bigger_gpu_from_the_same_checkpoints(make_engine, clouds, clock):  # type: ignore[no-untyped-def]
    small, big = clouds
    engine, rec, job, token = _start(make_engine, clouds, max_cost=5.0)
    first = JobSpec.model_validate_json(small.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    saved = checkpoint_event(engine, job.job_id, 2, 40, first.checkpoint.uri)  # the first run's checkpoint
    assert engine.record_runner_event(job.job_id, token, saved)
    clock.advance(600)  # 10 minutes on the small card: $0.08
    _out_of_memory(engine, job, token)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "running" and view.provider == "big" and view.gpu == "a100-80gb"
    assert big.creates == 1 and small.live() == []  # the card that ran out is gone, one instance runs
    second = JobSpec.model_validate_json(big.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    # it resumes where it was: a new run (issue 28), from the checkpoint the first one saved
    assert [(p.uri, p.step) for p in second.resume] == [(saved["checkpoint_uri"], 40)]
    said = next(e.message for e in rec.events if e.kind == "out_of_memory")
    assert "ran out of GPU memory on small rtx-4090" in said and "micro-batch 1" in said
    assert "Relaunching on big a100-80gb x1 (on-demand, 80 GB per GPU)" in said
    assert "expected total $2.08" in said and "within the $5.00 accepted (cap $5.00)" in said
    engine.tick()  # the old outcome does not grow it again
    assert big.creates == 1 and engine.get_job(job.job_id).state == "running"


def test_above_the_cap_it_asks_with_the_cost_and_an_approval_relaunches_it(make_engine, clouds, clock):
    small, big = clouds
    engine, rec, job, token = _start(make_engine, clouds, max_cost=1.5)
    clock.advance(600)
    _out_of_memory(engine, job, token)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "pending_approval" and big.creates == 0 and small.live() == []  # nothing bills
    assert view.estimated_cost == pytest.approx(2.08, abs=0.01)
    said = next(e.message for e in rec.events if e.kind == "out_of_memory")
    assert "cheapest GPU with more memory is big a100-80gb" in said
    assert "expected total $2.08" in said and "above the $1.50 accepted" in said and "Approve" in said
    assert "approval_needed" in rec.kinds()
    engine.tick()
    assert big.creates == 0  # it waits for the person
    assert engine.approve(job.job_id, approver="bob").state == "running"
    assert big.creates == 1 and engine.get_job(job.job_id).provider == "big"


def test_the_exit_code_alone_is_enough_and_no_bigger_card_fails_with_why(make_engine, clock):
    small = FakeProvider("small", price=0.5, gpu="rtx-4090", memory_gb=24)
    engine = make_engine(providers={small.name: small})
    job = engine.create_job(request(), user="alice", estimate=make_estimate([small.offer()]), max_cost=9.0)
    small.set_status(next(iter(small.instances)), InstanceStatus.exited, EXIT_OUT_OF_MEMORY)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "failed" and "No offer of this estimate has more memory" in (view.message or "")
    assert small.live() == []


def test_a_run_that_backed_off_is_recorded_at_the_configuration_that_ran(engine, fake):  # type: ignore[no-untyped-def]
    """The runner's metrics say the micro-batch, accumulation and checkpointing it trained with after an
    out-of-memory back-off; the calibration compares the planner with that, not with the request."""
    from sqlalchemy import select

    from store.models import CalibrationRun

    job = engine.create_job(
        request(batch_size=4, grad_accum=2, gradient_checkpointing=False),
        user="alice",
        estimate=make_estimate([fake.offer()]),
    )
    token = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token
    metrics = {
        "max_memory_reserved_gb": 20.5,
        "tokens_per_second": 900.0,
        "micro_batch_size": 1.0,
        "grad_accum": 8.0,
        "gradient_checkpointing": 1.0,
    }
    event = {
        "job_id": job.job_id,
        "seq": 5,
        "kind": "finished",
        "step": 10,
        "metrics": metrics,
        "timestamp": 1000.0,
    }
    assert engine.record_runner_event(job.job_id, token, signed(engine, event))
    with engine.session() as s:
        (row,) = s.execute(select(CalibrationRun)).scalars().all()
    assert (row.request["batch_size"], row.request["grad_accum"]) == (1, 8)
    assert row.request["gradient_checkpointing"] is True and row.max_memory_reserved_gb == 20.5
