"""Supervision decisions as a table: a job's facts and what was observed in, one action out (no database)."""

from __future__ import annotations

import pytest

from bot.engine.record.jobstate import JobState
from bot.engine.watching.supervise import Action, Do, JobFacts, Observation, SupervisionLimits, decide

T = 1_000_000.0  # "now"
LIMITS = SupervisionLimits(stop_grace_s=120, idle_stop_s=1800, heartbeat_timeout_s=600, cap_horizon_s=60)


def running(**kw) -> JobFacts:  # type: ignore[no-untyped-def]
    base = {"id": "j", "state": JobState.RUNNING, "last_event_at": T - 10, "started_at": T - 100}
    return JobFacts(**{**base, **kw})


def seen(verdict: str = "running", **kw) -> Observation:  # type: ignore[no-untyped-def]
    return Observation(**{"verdict": verdict, "launched_at": T - 100, **kw})


STOP = {"stop_requested_at": T - 30, "stop_reason": "user"}

TABLE = [
    # (case, job, observation, expected action)
    ("approved: launch", JobFacts("j", JobState.APPROVED), None, Action(Do.launch)),
    ("launching: take over a dead launch", JobFacts("j", JobState.LAUNCHING), None, Action(Do.take_over)),
    ("recovering: relaunch", JobFacts("j", JobState.RECOVERING), None, Action(Do.relaunch)),
    (
        "recovering with a stop asked: stopped, not relaunched",
        JobFacts("j", JobState.RECOVERING, **STOP),
        None,
        Action(Do.finish, JobState.STOPPED, "user"),
    ),
    ("awaiting approval: nothing", JobFacts("j", JobState.PENDING_APPROVAL), None, Action()),
    ("final: nothing", JobFacts("j", JobState.SUCCEEDED), seen("exited", exit_code=0), Action()),
    (
        "runner said finished: succeeded whatever the provider says",
        running(outcome="finished"),
        seen("running"),
        Action(Do.finish, JobState.SUCCEEDED, "finished"),
    ),
    (
        "runner said plateau: stopped (plateau)",
        running(outcome="plateau"),
        seen("error"),
        Action(Do.finish, JobState.STOPPED, "plateau"),
    ),
    (
        "runner out of memory at every back-off level: a bigger GPU (grow.py)",
        running(outcome="out_of_memory", message="out of GPU memory at micro-batch 1"),
        seen("running"),
        Action(Do.grow, reason="out of memory", message="out of GPU memory at micro-batch 1"),
    ),
    (
        "exit code 76 before its event was read: a bigger GPU too",
        running(),
        seen("exited", exit_code=76),
        Action(Do.grow, reason="out of memory"),
    ),
    (
        "runner said failed: failed with its own words",
        running(outcome="failed", message="runner: CUDA out of memory"),
        seen("running"),
        Action(Do.finish, JobState.FAILED, "runner failed", "runner: CUDA out of memory"),
    ),
    (
        "runner stopped itself at the spend cap (no bot was alive): stopped (budget)",
        running(outcome="budget", max_cost=1.0),
        seen("exited", exit_code=79),
        Action(Do.finish, JobState.STOPPED, "budget"),
    ),
    (
        "exit 79 before its event was read: stopped (budget), not failed",
        running(max_cost=1.0),
        seen("exited", exit_code=79),
        Action(Do.finish, JobState.STOPPED, "budget"),
    ),
    (
        "healthy and under its cap: nothing",
        running(max_cost=10.0),
        seen(spent=1.0, burn_per_hour=1.0),
        Action(),
    ),
    (
        "exit 0: succeeded",
        running(),
        seen("exited", exit_code=0),
        Action(Do.finish, JobState.SUCCEEDED, "finished"),
    ),
    (
        "exit 1: failed with the code (apply adds the runner's last words)",
        running(),
        seen("exited", exit_code=1),
        Action(Do.finish, JobState.FAILED, "runner exited with code 1", exit_code=1),
    ),
    (
        "exit 78: the runner could not be installed on a stock image: a failed start, retried once elsewhere",
        running(),
        seen("exited", exit_code=78),
        Action(
            Do.start_failed,
            reason="the runner could not be installed on the host (exit 78: fetching the staged wheel, "
            "its SHA-256 check or pip install failed; the host's log says which)",
        ),
    ),
    (
        "preempted: recover",
        running(),
        seen("preempted", exit_code=75),
        Action(Do.preempt, reason="instance preempted"),
    ),
    (
        "instance gone: recover, closing it",
        running(),
        seen("gone"),
        Action(Do.preempt, reason="instance gone", gone=True),
    ),
    (
        "no instance at all: recover",
        running(),
        Observation(verdict="gone"),
        Action(Do.preempt, reason="instance gone", gone=True),
    ),
    (
        "exited after a stop we asked for: stopped, not failed",
        running(**STOP),
        seen("exited", exit_code=143),
        Action(Do.finish, JobState.STOPPED, "user"),
    ),
    (
        "preempted after a stop we asked for: stopped, not relaunched",
        running(**STOP),
        seen("preempted"),
        Action(Do.finish, JobState.STOPPED, "user"),
    ),
    ("stop asked, still saving within the grace: wait", running(**STOP), seen("running"), Action()),
    (
        "stop asked, past the grace: stopped",
        running(stop_requested_at=T - 121, stop_reason="user"),
        seen("running"),
        Action(Do.finish, JobState.STOPPED, "user"),
    ),
    (
        "stop asked, provider down past the grace: stopped (finish terminates and confirms)",
        running(stop_requested_at=T - 121, stop_reason="budget"),
        seen("error"),
        Action(Do.finish, JobState.STOPPED, "budget"),
    ),
    (
        "stop asked before this instance was launched: nothing to save, stopped at once",
        running(stop_requested_at=T - 200, stop_reason="user"),
        seen("provisioning", launched_at=T - 100),
        Action(Do.finish, JobState.STOPPED, "user"),
    ),
    ("provider down: nothing decided", running(last_event_at=T - 5000), seen("error"), Action()),
    (
        "no event for the idle limit: stopped (idle)",
        running(last_event_at=T - 1801),
        seen("running"),
        Action(Do.stop_now, reason="idle"),
    ),
    (
        "no event yet, started long ago: idle too",
        running(last_event_at=None, started_at=T - 1801),
        seen("running", launched_at=T - 1801),
        Action(Do.stop_now, reason="idle"),
    ),
    (
        "no heartbeat past the timeout but not idle: recover",
        JobFacts("j", JobState.RUNNING, last_event_at=T - 601, started_at=T - 601),
        seen("running", launched_at=T - 700),
        Action(Do.preempt, reason="no heartbeat for 600 s"),
    ),
    (
        "a fresh relaunch counts from its launch, not the old event",
        running(last_event_at=T - 900),
        seen("running", launched_at=T - 30),
        Action(),
    ),
    (
        "provisioning for twice the heartbeat: stuck, recover elsewhere",
        running(last_event_at=None),
        seen("provisioning", launched_at=T - 1201),
        Action(Do.preempt, reason="instance stuck in provisioning"),
    ),
    (
        "provisioning for a while: wait",
        running(last_event_at=None),
        seen("provisioning", launched_at=T - 900),
        Action(),
    ),
    (
        "unknown status for twice the heartbeat: stuck",
        running(last_event_at=T - 1300),
        seen("unknown", launched_at=T - 1300),
        Action(Do.preempt, reason="instance stuck in unknown"),
    ),
    (
        "first start (no word from this host yet) inside its deadline: no heartbeat or idle rule, wait",
        running(last_event_at=None, started_at=T - 2500, start_deadline_s=7200),
        seen("running", launched_at=T - 2500),
        Action(),
    ),
    (
        "first start still provisioning inside its deadline: wait past twice the heartbeat",
        running(last_event_at=None, start_deadline_s=7200),
        seen("provisioning", launched_at=T - 5000),
        Action(),
    ),
    (
        "first start past its deadline: the start failed (retried once elsewhere, not a preemption)",
        running(last_event_at=None, start_deadline_s=900),
        seen("provisioning", launched_at=T - 901),
        Action(Do.start_failed, reason="the runner did not start within 15 min"),
    ),
    (
        "a relaunch downloading the model again: its own start deadline, not the heartbeat",
        running(last_event_at=T - 4000, start_deadline_s=3600),
        seen("running", launched_at=T - 3000),
        Action(),
    ),
    (
        "heard from this host: the heartbeat rule again",
        running(last_event_at=T - 601, start_deadline_s=3600),
        seen("running", launched_at=T - 700),
        Action(Do.preempt, reason="no heartbeat for 600 s"),
    ),
    # Issue 38: liveness is the heartbeat, whatever the report cadence; idleness is no progress.
    (
        "no event for an hour, but a beat 20 s ago with a step 5 s before it: alive and busy, nothing",
        running(last_event_at=T - 3600, started_at=T - 4000),
        seen("running", launched_at=T - 4000, heard_at=T - 20, active_at=T - 25),
        Action(),
    ),
    (
        "beats go on but no step for the idle limit: stopped (idle), not relaunched",
        running(last_event_at=T - 3600, started_at=T - 4000),
        seen("running", launched_at=T - 4000, heard_at=T - 20, active_at=T - 1801),
        Action(Do.stop_now, reason="idle"),
    ),
    (
        "no beat and no event past the timeout: recover",
        running(last_event_at=T - 700),
        seen("running", launched_at=T - 4000, heard_at=T - 601, active_at=T - 601),
        Action(Do.preempt, reason="no heartbeat for 600 s"),
    ),
    (
        "silent past the timeout, but its provider sees the runner's process alive: not dead, nothing",
        running(last_event_at=T - 700),
        seen("running", launched_at=T - 4000, alive=True),
        Action(),
    ),
    (
        "its provider sees it alive, but no progress for the idle limit: stopped (idle)",
        running(last_event_at=T - 1801),
        seen("running", launched_at=T - 4000, alive=True),
        Action(Do.stop_now, reason="idle"),
    ),
    (
        "projected spend reaches the cap within the next period: graceful stop (budget)",
        running(max_cost=5.0),
        seen(spent=4.99, burn_per_hour=1.0),
        Action(Do.stop, reason="budget"),
    ),
    (
        "just under the cap after the next period: nothing",
        running(max_cost=5.0),
        seen(spent=4.9, burn_per_hour=1.0),
        Action(),
    ),
    (
        "the cap applies while provisioning too",
        running(max_cost=1.0),
        seen("provisioning", spent=1.2),
        Action(Do.stop, reason="budget"),
    ),
    (
        "idle outranks the cap",
        running(max_cost=1.0, last_event_at=T - 2000),
        seen(spent=5.0),
        Action(Do.stop_now, reason="idle"),
    ),
]


@pytest.mark.parametrize(("case", "job", "obs", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_decide(case: str, job: JobFacts, obs: Observation | None, expected: Action) -> None:
    assert decide(job, obs, T, LIMITS) == expected


def test_every_action_is_in_the_table() -> None:
    assert {row[3].do for row in TABLE} == set(Do)
