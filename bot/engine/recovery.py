"""Recovery after a preemption: close the lost instance, then relaunch on the next best offer.

The relaunch uses the same checkpoint folder in its JobSpec, so the runner resumes from the newest
complete checkpoint. Each relaunch spends one unit of the retry budget; past it the job fails
with that reason instead of burning money in a loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import update

from bot.engine import states as S
from bot.engine.crash import crashpoint
from bot.engine.events import EngineEventKind
from bot.engine.finish import close_instance, open_instances, terminate_instance
from bot.engine.launch import claim, launch_job
from store.models import Instance as InstanceRow
from store.models import Job

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
            return False  # never run two instances for one job: wait until the old one is confirmed gone
    claim_id = claim(eng, job_id, actor=actor)
    if claim_id is None:
        return False
    return launch_job(eng, job_id, claim_id, actor=actor)
