"""A job's chart data: every step from step 1, evals, learning rate, preemptions and resumes."""

from __future__ import annotations

from fakes.runner_events import signed

from bot.engine.outcome.series import EventRow, fold
from bot.providers.base import InstanceStatus
from runner.contract.spec import JobSpec

from .conftest import estimate_for, request


def row(seq: int, kind: str, step: int, *, loss: float | None = None, at: float | None = None, **payload):  # noqa: ANN003, ANN201
    return EventRow(seq, kind, step, loss, 1000.0 + seq if at is None else at, payload)


def test_points_give_every_step_and_a_resumed_run_overrides_the_steps_it_redid() -> None:
    events = [
        row(0, "started", 0),
        row(1, "progress", 3, loss=2.0, points=[[1, 3.0, 1e-4], [2, 2.5, 2e-4], [3, 2.0, 2e-4]]),
        row(2, "progress", 5, loss=1.5, points=[[4, 1.8, 2e-4], [5, 1.5, 1e-4]], evals=[[4, 1.9]]),
        row(3, "checkpoint", 5, loss=1.5),  # no points: nothing new
        row(4, "progress", 7, loss=1.2, points=[[6, 1.3, 1e-4], [7, 1.2, 1e-4]]),
        # a hard loss of the host: resumed from the step-5 checkpoint and trained 6 and 7 again
        row(5, "started", 5, loss=1.5, message="resumed from .../checkpoint-5"),
        row(
            6,
            "progress",
            8,
            loss=1.0,
            points=[[6, 1.25, 1e-4], [7, 1.1, 5e-5], [8, 1.0, 0.0]],
            evals=[[8, 1.2]],
        ),
    ]
    data = fold(events, recoveries=[1004.5])
    assert [s for s, _ in data["train"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert dict(data["train"])[6] == 1.25 and dict(data["train"])[7] == 1.1  # the newest run's values
    assert data["eval"] == [(4, 1.9), (8, 1.2)]
    assert dict(data["lr"])[1] == 1e-4 and dict(data["lr"])[8] == 0.0
    assert data["preemptions"] == [7]  # the engine found it gone after the step-7 report
    assert data["resumes"] == [5]


def test_older_runners_without_points_chart_their_reports_and_say_when_preempted() -> None:
    events = [
        row(0, "started", 0),
        row(1, "progress", 9, loss=2.0, learning_rate=1e-4),
        row(2, "preempted", 12, loss=1.8),
        row(3, "started", 12, loss=1.8),
        row(4, "progress", 20, loss=1.5, learning_rate=5e-5),
    ]
    data = fold(events, recoveries=[1002.5])
    assert data["train"] == [(9, 2.0), (20, 1.5)] and data["lr"] == [(9, 1e-4), (20, 5e-5)]
    assert data["preemptions"] == [12]  # the runner's own event; the engine's transition is the same one
    assert data["resumes"] == [12]


def test_the_engine_serves_the_series_of_a_preempted_and_resumed_job(engine, fake, clock) -> None:  # noqa: ANN001
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token

    def send(seq: int, kind: str, step: int, **kw) -> None:  # noqa: ANN003
        event = {
            "job_id": job.job_id,
            "seq": seq,
            "kind": kind,
            "step": step,
            "timestamp": 1000.0 + seq,
            **kw,
        }
        assert engine.record_runner_event(job.job_id, token, signed(engine, event))

    send(0, "started", 0)
    send(1, "progress", 4, loss=2.5, learning_rate=2e-4, points=[[s, 3.0 - s / 4, 2e-4] for s in range(1, 5)])
    clock.advance(30)
    iid = next(iter(fake.instances))
    fake.set_status(iid, InstanceStatus.preempted)
    engine.tick()  # preempted by the provider (no runner event): relaunched
    clock.advance(30)
    token = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token
    send(2, "started", 4, loss=2.0)
    send(3, "progress", 6, loss=1.5, points=[[5, 1.8, 1e-4], [6, 1.5, 1e-4]], evals=[[6, 1.7]])
    series = engine.series(job.job_id)
    assert [s for s, _ in series.train] == [1, 2, 3, 4, 5, 6]
    assert series.eval == [(6, 1.7)] and len(series.lr) == 6
    assert series.preemptions == [4] and series.resumes == [4]
    assert (series.model, series.method) == (job.model, job.method)
    assert series.gpu == job.gpu and series.provider == job.provider
