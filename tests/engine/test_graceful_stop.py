"""A graceful stop on a cloud (issue 38 item 1): the bot asks a live runner to save, waits for its report
within a bounded grace, acknowledges the checkpoint, then terminates.

The engine is real (SQLite and PostgreSQL), the cloud the in-memory fake (no signal path to its runner: no
``preempt``), and the runner is played by the test: it beats and reports as runner/report.py does. The real
runner on a fake cloud host is tests/chat/test_e2e_cloud_stop.py; the runner's side of the request is
tests/runner/test_stop_request.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.runner_events import checkpoint_event, job_key

from bot.engine.outcome.stop_request import MIN_WORK_S, grace_s
from bot.engine.record.jobstate import JobState
from bot.engine.watching.supervise import Action, Do, JobFacts, Observation, SupervisionLimits, decide
from runner.contract.spec import JobSpec
from runner.contract.stop import asked, request_uri
from store.models import Job, RunCheckpoint

from .conftest import estimate_for, request
from .test_liveness import beat, started, write_beat

# --- the wait, decided (pure) ------------------------------------------------------------------------------

T = 1_000_000.0
LIMITS = SupervisionLimits(stop_grace_s=300, idle_stop_s=1800, heartbeat_timeout_s=600, cap_horizon_s=10)
FINISH = Action(Do.finish, JobState.STOPPED, "user")


def stopping(**kw) -> JobFacts:  # type: ignore[no-untyped-def]
    base = {"id": "j", "state": JobState.RUNNING, "last_event_at": T - 40, "started_at": T - 100}
    return JobFacts(**{**base, "stop_requested_at": T - 20, "stop_reason": "user", **kw})


def seen(**kw) -> Observation:  # type: ignore[no-untyped-def]
    return Observation(**{"verdict": "running", "launched_at": T - 100, "heard_at": T - 1, **kw})


LONG_AGO = {"launched_at": T - 1000, "heard_at": T - 700}  # started long ago, last heard 700 s ago

CASES = [
    ("within its grace, beating: wait for the checkpoint", stopping(), seen(stop_grace_s=60), Action()),
    (
        "its checkpoint reported: at once",
        stopping(),
        seen(stop_grace_s=60, said_stopped=True),
        FINISH,
    ),
    ("past its own grace: terminate", stopping(), seen(stop_grace_s=15), FINISH),
    (
        "a grace over the limit: the limit",
        stopping(stop_requested_at=T - 301),
        seen(stop_grace_s=900),
        FINISH,
    ),
    (
        "silent past the heartbeat timeout: at once",
        stopping(last_event_at=T - 700),
        seen(**LONG_AGO),
        FINISH,
    ),
    ("no word from this instance yet: nothing to save", stopping(last_event_at=None), seen(), FINISH),
    ("launched after the stop: nothing to save", stopping(stop_requested_at=T - 200), seen(), FINISH),
    ("the cap reached: the grace never bills past it", stopping(max_cost=1.0), seen(spent=1.0), FINISH),
    ("below the cap: wait", stopping(max_cost=1.0), seen(stop_grace_s=60, spent=0.9), Action()),
    (
        "silent, but its provider sees the process alive: not dead, wait",
        stopping(last_event_at=T - 700),
        seen(**LONG_AGO, alive=True, stop_grace_s=60),
        Action(),
    ),
]


@pytest.mark.parametrize(("case", "job", "obs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_wait_for_a_stopped_runners_checkpoint(
    case: str, job: JobFacts, obs: Observation, expected: Action
) -> None:
    assert decide(job, obs, T, LIMITS) == expected, case


def test_the_grace_is_a_beat_a_step_two_saves_and_a_tick_by_the_quote_at_most_the_setting() -> None:
    # 100 steps of 2 s, an output saved in 10 s: a checkpoint up to 6x it, two of them (one may still upload).
    phases = {"warmup": 2.0, "steps": 150.0, "optimizer": 30.0, "logging": 18.0, "output": 10.0}
    assert grace_s(phases, 100, beat_s=30, tick_s=10, most_s=900) == pytest.approx(30 + 2 + 2 * 60 + 10)
    assert grace_s(phases, 100, beat_s=30, tick_s=10, most_s=120) == 120  # TUNEBOT_STOP_GRACE bounds it
    tiny = {"steps": 0.5, "output": 0.01}  # a tiny job's quote: a floor for a busy host
    assert grace_s(tiny, 100, beat_s=2, tick_s=1, most_s=300) == 2 + MIN_WORK_S + 1
    assert grace_s(None, 100, beat_s=30, tick_s=10, most_s=300) == 300  # no quote by phase: the setting


# --- the stop, on the engine -------------------------------------------------------------------------------


def _running(engine, fake, clock) -> tuple[str, JobSpec]:  # type: ignore[no-untyped-def]
    """A job whose runner started on its instance and beats (its signed heartbeat heard by the engine)."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    write_beat(engine, job, beat(job, 0, step=7))
    engine.tick()
    return job, JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])


def test_a_stopped_cloud_runner_is_asked_and_its_checkpoint_kept_before_the_terminate(engine, fake, clock):  # type: ignore[no-untyped-def]
    """9a0c9c1 terminated at once: the job stopped with "No checkpoint was saved", its runner never knew."""
    job, spec = _running(engine, fake, clock)
    clock.advance(5)
    view = engine.stop(job, user="alice")
    assert view.state == "running" and len(fake.live()) == 1  # not terminated: the runner is asked first
    raw = Path(request_uri(spec.checkpoint.uri)).read_bytes()
    assert asked(raw, job_key(engine, job), job, spec.run_id) == "user"  # signed with the run's own key
    clock.advance(3)
    engine.tick()
    assert engine.get_job(job).state == "running" and len(fake.live()) == 1  # within its grace: waits

    # The runner saved where it was and reported it (its `preempted` event), then the bot terminates.
    saved = Path(spec.checkpoint.uri) / "checkpoint-42"
    saved.mkdir(parents=True)
    (saved / "COMPLETE").write_text("step 42\n")
    goodbye = checkpoint_event(engine, job, 5, 42, spec.checkpoint.uri, kind="preempted")
    assert engine.record_runner_event(job, spec.report.token, goodbye)
    clock.advance(2)
    engine.tick()
    view = engine.get_job(job)
    assert view.state == "stopped" and view.stop_reason == "user" and fake.live() == []
    assert view.checkpoint_step == 42 and view.checkpoint_uri == goodbye["checkpoint_uri"]
    with engine.session() as s:
        assert s.query(RunCheckpoint.step).filter(RunCheckpoint.job_id == job).all() == [(42,)]
    # Billed until the terminate, the wait included (the fake bills its price per hour from its launch).
    assert view.spend == pytest.approx(fake.price * 10 / 3600, rel=0.01)


def test_a_runner_that_does_not_answer_is_terminated_once_its_grace_is_over(engine, fake, clock, settings):  # type: ignore[no-untyped-def]
    job, _ = _running(engine, fake, clock)
    clock.advance(5)
    engine.stop(job, user="alice")
    clock.advance(10)
    engine.tick()
    assert engine.get_job(job).state == "running"
    clock.advance(settings.stop_grace_s)  # past any job's grace: TUNEBOT_STOP_GRACE
    engine.tick()
    view = engine.get_job(job)
    assert view.state == "stopped" and fake.live() == [] and view.checkpoint_step is None


def test_a_runner_without_a_heartbeat_is_not_waited_for(engine, fake, clock):  # type: ignore[no-untyped-def]
    """Dead, or from before heartbeats: nothing would read the request; terminated at once, as before."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    clock.advance(5)
    assert engine.stop(job, user="alice").state == "stopped" and fake.live() == []
    with engine.session() as s:
        spec = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
        assert s.get(Job, job).stop_reason == "user"
    assert not Path(request_uri(spec.checkpoint.uri)).exists()
