"""Recovery after a preemption: close the lost instance, then relaunch on the next best offer.

The relaunch uses the same checkpoint folder in its JobSpec, so the runner resumes from the newest
complete checkpoint. Each relaunch spends one unit of the retry budget; past it the job fails
with that reason instead of burning money in a loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from bot.engine.crash import crashpoint
from bot.engine.events import EngineEventKind
from bot.engine.launching.launch import claim, launch_claimed
from bot.engine.outcome.finish import close_instance, open_instances, terminate_instance
from bot.engine.record import states as S
from bot.money import money
from store.models import AuditLog, Job, JobRun
from store.models import Instance as InstanceRow

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)


def mark_preempted(eng: EngineContext, job_id: str, row: InstanceRow | None, *, why: str, gone: bool) -> bool:
    """running -> recovering (one preemption), once the runner's last words are in; True when this call did
    it.

    The lost instance is ended first (asked to stop where its provider can ask, so its runner saves a
    checkpoint on the way out, then terminated and confirmed gone) and its progress object read once more,
    while the job's run is still current: the checkpoint the runner reported on its way out is acknowledged
    (bot/engine/record/runs.py) and the relaunch resumes from it. Ending the run first, as before, refused
    that report (issue 38: checkpoint-647 was saved, the relaunch started from step 0)."""
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return False
    if row is not None:
        _end_lost_instance(eng, row, gone=gone)
    _read_last_words(eng, job_id)
    crashpoint("recover.after_terminate")
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return False
        preemptions = job.preemptions + 1
        lost = _lost_work(eng, job, row)
        if not S.transition(
            s,
            job_id,
            S.RUNNING,
            S.RECOVERING,
            actor="monitor",
            now=now,
            reason=why,
            preemptions=preemptions,
            message=why,
        ):
            return False
    crashpoint("recover.after_mark")
    eng.publish(
        EngineEventKind.preempted,
        job_id,
        f"Job {job_id} was preempted ({why}); {lost.sentence()}",
        reason=why,
        preemptions=preemptions,
        checkpoint_step=lost.checkpoint_step,
        lost_steps=lost.steps,
        lost_cost=lost.cost,
    )
    return True


def _end_lost_instance(eng: EngineContext, row: InstanceRow, *, gone: bool) -> None:
    """The lost instance's end: a gone one closed (billed until seen gone); another asked to stop gracefully
    where its provider can (SIGTERM: the runner saves and reports), then terminated and confirmed gone."""
    with eng.session() as s:  # the host to avoid next time, whatever happens below
        s.execute(update(InstanceRow).where(InstanceRow.id == row.id).values(end_reason="preempted"))
        s.commit()
    if gone:
        close_instance(eng, row, reason="preempted", actor="monitor")
        return
    provider = eng.supervisable.get(row.provider)
    graceful = getattr(provider, "preempt", None)
    if callable(graceful) and getattr(provider, "sees_runner_process", False):
        try:  # returns once the runner exited (or the grace passed and it was killed)
            graceful(row.provider_instance_id, eng.limits.stop_grace_s)
        except Exception as exc:  # noqa: BLE001 - already exited, or gone: the terminate below settles it
            log.info("graceful stop of %s/%s: %s", row.provider, row.provider_instance_id, exc)
    terminate_instance(eng, row, reason="preempted", actor="monitor")


def _read_last_words(eng: EngineContext, job_id: str) -> None:
    """Read the job's progress object once more, its run still current: the runner's words on its way out."""
    from bot.engine.watching import progress

    try:
        with eng.session() as s:
            job = s.get(Job, job_id)
        if job is not None and job.state == S.RUNNING:
            progress.pull(eng, job)
    except Exception:  # noqa: BLE001 - an unreadable object must not keep the job from its relaunch
        log.exception("job %s: reading the runner's last words failed", job_id)


@dataclass(frozen=True)
class LostWork:
    """What a preemption costs the job: the checkpoint it resumes from, the steps trained again, about how
    much."""

    checkpoint_step: int | None
    steps: int
    cost: float | None

    def sentence(self) -> str:
        """What the job's thread reads after "was preempted (why); ". Pure."""
        again = ""
        if self.steps > 0:
            cost = f", about {money(self.cost)}" if self.cost is not None else ""
            again = f"the {self.steps} step(s) since are trained and billed again{cost}"
        if self.checkpoint_step is not None:
            return f"relaunching from its checkpoint at step {self.checkpoint_step}" + (
                f": {again}." if again else "."
            )
        if self.steps > 0:
            return f"it has no checkpoint yet, so it restarts from the beginning: {again}."
        return "it has no checkpoint yet, so it restarts from the beginning (no step was reported before)."


def _lost_work(eng: EngineContext, job: Job, row: InstanceRow | None) -> LostWork:
    """The checkpoint the relaunch resumes from (the newest acknowledged one still in storage), the steps
    trained since (the runner's last step by its events or its heartbeat) and their share of the lost
    instance's cost (its row, or, where a reconcile already closed it, the job's newest)."""
    from bot.engine.record import runs
    from bot.engine.record.spend import instance_cost
    from bot.engine.watching import progress

    newest = runs.newest_acknowledged(eng, job.id)
    beat = progress.heard(eng, job.id, job.run_id)
    step = max(job.last_step or 0, beat.step if beat is not None else 0)
    start = _run_start_step(eng, job.run_id)
    resumes = newest.step if newest is not None else 0
    steps = max(0, step - resumes)
    cost = None
    if row is None:
        with eng.session() as s:
            last = select(InstanceRow).where(InstanceRow.job_id == job.id).order_by(InstanceRow.id.desc())
            row = s.execute(last.limit(1)).scalars().first()
    if row is not None and step > start:
        with eng.session() as s:
            fresh = s.get(InstanceRow, row.id) or row
            billed = instance_cost(fresh, eng.now())
        cost = billed * min(1.0, steps / (step - start))
    return LostWork(newest.step if newest is not None else None, steps, cost)


def _run_start_step(eng: EngineContext, run_id: str | None) -> int:
    """The step the job's current run started from (its first resume point; 0 without one)."""
    if not run_id:
        return 0
    with eng.session() as s:
        run = s.get(JobRun, run_id)
    points = [p for p in (run.resume if run is not None else []) or [] if isinstance(p, dict)]
    step = points[0].get("step") if points else 0
    return step if isinstance(step, int) else 0


def relaunch(eng: EngineContext, job_id: str, *, actor: str = "recovery") -> bool:
    """Close whatever the job still has open, then claim and launch again."""
    for row in open_instances(eng, job_id):
        if not terminate_instance(eng, row, reason="preempted", actor=actor):
            # never run two instances for one job: wait until the old one is confirmed gone, not forever
            not_confirmed(eng, job_id, row, actor=actor)
            return False
    claim_id = claim(eng, job_id, actor=actor)
    if claim_id is None:
        return False
    return launch_claimed(eng, job_id, claim_id, actor=actor)


def recovering_since(eng: EngineContext, job_id: str) -> float | None:
    """When the job last entered ``recovering`` (its audit record)."""
    with eng.session() as s:
        return s.execute(
            select(AuditLog.at)
            .where(AuditLog.job_id == job_id, AuditLog.action.like("transition:%->recovering"))
            .order_by(AuditLog.at.desc())
            .limit(1)
        ).scalar()


def not_confirmed(eng: EngineContext, job_id: str, row: InstanceRow, *, actor: str) -> None:
    """The lost instance's cloud does not confirm it is gone (its API does not answer): the job says so and
    what to do; past TUNEBOT_CLOUD_DOWN_GIVE_UP it fails with reason "cloud unreachable" (the instance stays
    on the books and the reaper keeps terminating it), instead of recovering forever."""
    import time as _time

    from bot.engine.launching.launch import CLOUD_UNREACHABLE

    now = eng.now()
    since = recovering_since(eng, job_id) or now
    give_up = eng.settings.cloud_down_give_up_s
    at = _time.strftime("%H:%M UTC", _time.gmtime(since))
    where = f"instance {row.provider_instance_id} at {row.provider}"
    console = f"check the {row.provider} console and destroy {row.provider_instance_id} if it is still there"
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RECOVERING:
            return
        if now - since < give_up:
            until = _time.strftime("%H:%M UTC", _time.gmtime(since + give_up))
            message = (
                f"{CLOUD_UNREACHABLE}: {row.provider} has not confirmed that {where} is gone since {at}; the "
                f"job relaunches once it does, and fails at {until} if it does not. Next: {console}, or "
                f"`stop {job_id}`."
            )
            if job.message != message:  # the message only: the time it entered recovering stays its own
                waiting = (Job.id == job_id, Job.state == S.RECOVERING)
                s.execute(update(Job).where(*waiting).values(message=message))
                s.commit()
            return
        message = (
            f"{CLOUD_UNREACHABLE}: {row.provider} did not confirm that {where} is gone for "
            f"{(now - since) / 60:.0f} min (since {at}). It may still be running and billing: {console}; the "
            f"bot keeps trying to terminate it. Next: once {row.provider} answers, `resume {job_id}`."
        )[:1000]
        done = S.transition(
            s,
            job_id,
            S.RECOVERING,
            S.FAILED,
            actor=actor,
            now=now,
            reason=CLOUD_UNREACHABLE,
            message=message,
            finished_at=now,
        )
    if done:
        eng.publish(EngineEventKind.failed, job_id, f"Job {job_id} failed: {message}")
