"""Recovery after a preemption: close the lost instance, then relaunch on the next best offer.

The relaunch uses the same checkpoint folder in its JobSpec, so the runner resumes from the newest
complete checkpoint. Each relaunch spends one unit of the retry budget; past it the job fails
with that reason instead of burning money in a loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select, update

from bot.engine.crash import crashpoint
from bot.engine.events import EngineEventKind
from bot.engine.launching.launch import claim, launch_job
from bot.engine.outcome.finish import close_instance, open_instances, terminate_instance
from bot.engine.record import states as S
from store.models import AuditLog, Job
from store.models import Instance as InstanceRow

if TYPE_CHECKING:
    from bot.engine.context import EngineContext


def mark_preempted(eng: EngineContext, job_id: str, row: InstanceRow | None, *, why: str, gone: bool) -> bool:
    """running -> recovering (one preemption), then end the lost instance. True when this call did it."""
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return False
        if not S.transition(
            s,
            job_id,
            S.RUNNING,
            S.RECOVERING,
            actor="monitor",
            now=now,
            reason=why,
            preemptions=job.preemptions + 1,
            message=why,
        ):
            return False
        preemptions = job.preemptions + 1
    crashpoint("recover.after_mark")
    if row is not None:
        with eng.session() as s:
            s.execute(update(InstanceRow).where(InstanceRow.id == row.id).values(end_reason="preempted"))
            s.commit()
        if gone:
            close_instance(eng, row, reason="preempted", actor="monitor")
        else:
            terminate_instance(eng, row, reason="preempted", actor="monitor")
    crashpoint("recover.after_terminate")
    eng.publish(
        EngineEventKind.preempted,
        job_id,
        f"Job {job_id} was preempted ({why}); relaunching from its last checkpoint.",
        reason=why,
        preemptions=preemptions,
    )
    return True


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
    return launch_job(eng, job_id, claim_id, actor=actor)


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
                f"`tunebot stop {job_id}`."
            )
            if job.message != message:  # the message only: the time it entered recovering stays its own
                waiting = (Job.id == job_id, Job.state == S.RECOVERING)
                s.execute(update(Job).where(*waiting).values(message=message))
                s.commit()
            return
        message = (
            f"{CLOUD_UNREACHABLE}: {row.provider} did not confirm that {where} is gone for "
            f"{(now - since) / 60:.0f} min (since {at}). It may still be running and billing: {console}; the "
            f"bot keeps trying to terminate it. Next: once {row.provider} answers, `tunebot resume {job_id}`."
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
