"""Out of GPU memory after the runner's own back-off (runner/oom.py): the engine relaunches the job on the
cheapest offer with more memory per GPU when that stays within the job's cap, else it asks in the thread, with
what happened and what it costs (bot/engine/watching/grow.py)."""

from __future__ import annotations

import pytest
from fakes.runner_events import checkpoint_event, signed

from bot.engine.permissions import OPERATOR
from bot.engine.watching.grow import choose
from bot.providers.base import InstanceStatus
from runner.contract.spec import EXIT_OUT_OF_MEMORY, JobSpec

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


def test_within_the_cap_it_relaunches_on_the_bigger_gpu_from_the_same_checkpoints(make_engine, clock):  # type: ignore[no-untyped-def]
    """A bigger card within the accepted hourly price (and its tolerance, TUNEBOT_PRICE_TOLERANCE) and the
    accepted cost: relaunched at once (a pricier one is a new approval: the tests below)."""
    clouds = (
        FakeProvider("small", price=0.5, gpu="rtx-4090", memory_gb=24),
        FakeProvider("big", price=0.55, gpu="a100-80gb", memory_gb=80),
    )
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
    assert "expected total $0.63" in said and "within the $5.00 accepted (cap $5.00)" in said
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
    assert engine.approve(job.job_id, approver=OPERATOR).state == "running"
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


# ---- issue 28, item 5: growth is a new approval ------------------------------------------------------------


def _host_says(engine, fake, job_id: str, events: list[dict]) -> None:  # type: ignore[no-untyped-def]
    """Events signed the way the job's host can sign them (with the key its instance got)."""
    from .test_runner_trust import as_host

    env = fake.launch_requests[-1].env
    token = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"]).report.token
    for event in events:
        assert engine.record_runner_event(job_id, token, as_host({"job_id": job_id, **event}, env))


def _cheap_and_h100() -> tuple[FakeProvider, FakeProvider]:
    return (
        FakeProvider("cheap", price=0.40, gpu="rtx-4090", memory_gb=24),
        FakeProvider("h100", price=60.0, gpu="h100-80gb", memory_gb=80),
    )


def test_a_claimed_out_of_memory_near_the_end_does_not_buy_a_60_dollar_gpu(make_engine, clock):  # type: ignore[no-untyped-def]
    """eac3cff: a host that reported out-of-memory at step 99 of 100 got its job relaunched on a $60/h H100
    without any approval, although the approved job was a $0.40/h one (the projected rest of the run, 1%,
    fitted the cap)."""
    cheap, h100 = _cheap_and_h100()
    engine = make_engine(providers={cheap.name: cheap, h100.name: h100})
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=make_estimate([cheap.offer(), h100.offer()]))
    assert job.state == "running" and job.provider == "cheap" and job.price_per_hour == 0.40
    clock.advance(60)
    _host_says(
        engine,
        cheap,
        job.job_id,
        [
            {"seq": 1, "kind": "progress", "step": 99, "max_steps": 100, "loss": 1.0, "timestamp": 1.0},
            {"seq": 2, "kind": "out_of_memory", "step": 99, "message": OOM, "timestamp": 2.0},
        ],
    )
    engine.tick()
    view = engine.get_job(job.job_id)
    assert h100.creates == 0 and view.state == "pending_approval", view
    assert cheap.live() == []  # nothing bills while it waits
    ask = next(e for e in rec.events if e.kind == "approval_needed")
    assert "h100 h100-80gb x1" in ask.message and "$60.00/h" in ask.message, ask.message
    assert "h100-80gb" in ask.data["reason"] and "$60.00/h" in ask.data["reason"]
    assert "$0.40/h accepted" in ask.data["reason"] and "growing is a new approval" in ask.data["reason"]
    engine.tick()
    assert h100.creates == 0  # it waits for a person
    assert engine.approve(job.job_id, approver=OPERATOR).state == "running" and h100.creates == 1


def test_a_relaunch_after_a_preemption_near_the_end_asks_before_a_pricier_offer(make_engine, clock):  # type: ignore[no-untyped-def]
    """The same claim through a preemption: "step 99 of 100", then the host goes away (its owner can cause
    that on a marketplace); the approved offer has no capacity: the $60/h one is asked for, not rented."""
    cheap, h100 = _cheap_and_h100()
    engine = make_engine(providers={cheap.name: cheap, h100.name: h100})
    job = engine.create_job(request(), user="alice", estimate=make_estimate([cheap.offer(), h100.offer()]))
    _host_says(
        engine,
        cheap,
        job.job_id,
        [{"seq": 1, "kind": "progress", "step": 99, "max_steps": 100, "loss": 1.0, "timestamp": 1.0}],
    )
    cheap.capacity = False
    for iid in list(cheap.instances):
        cheap.set_status(iid, InstanceStatus.preempted)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert h100.creates == 0 and view.state == "pending_approval", view
    said = view.message or ""
    assert "$60.00/h" in said and "accepted for this job" in said, said


def test_choose_checks_the_hourly_price_too() -> None:
    failed = {**_offer("small", 24, 1.0), "price_per_hour": 0.4}
    big = {**_offer("big", 80, 0.6), "price_per_hour": 60.0}
    near = {**_offer("near", 48, 0.5), "price_per_hour": 0.44}
    pricey = choose(failed, [failed, big], spent=0.1, done=0.99, limit=0.8, price_limit=0.44)
    assert pricey.within_cap and not pricey.within_price  # the claimed 1% left fits; the $/h does not
    fine = choose(failed, [failed, big, near], spent=0.1, done=0.5, limit=0.8, price_limit=0.44)
    assert fine.offer["provider"] == "near" and fine.within_cap and fine.within_price
