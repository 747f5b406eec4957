"""A new instance that never starts the runner: one retry on another host, then the job stops and says why.

The first start has its own deadline (bot/engine/launching/preflight.py: the image pull and the model download
at a stated bandwidth, plus a margin; ``jobs.start_deadline_s``). Past it, without a word from the runner, the
instance is terminated and recorded with ``end_reason = "start timeout"``. The first time, the job is
relaunched from where it was (its checkpoints, if any), the hosts that failed to start tried last; the second
time the job fails with what was paid for the wait and what to check. A start that times out is not a
preemption: it does not count as one, and it is not retried up to the retry budget (a host that cannot pull
the image, a token that cannot download the model, fail the same way everywhere).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from bot.engine.events import EngineEventKind
from bot.engine.outcome.finish import finish, terminate_instance
from bot.engine.record import states as S
from bot.engine.record.spend import instance_cost
from bot.engine.watching.recovery import relaunch
from bot.money import money
from store.models import Instance as InstanceRow
from store.models import Job

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)

START_TIMEOUT = "start timeout"  # instances.end_reason of an instance that never started the runner
MAX_START_RETRIES = 1


def start_failed(eng: EngineContext, job_id: str, row: InstanceRow | None, *, why: str) -> None:
    """Terminate the instance that did not start; relaunch once elsewhere, else fail the job saying why."""
    if row is not None:
        with eng.session() as s:
            s.execute(update(InstanceRow).where(InstanceRow.id == row.id).values(end_reason=START_TIMEOUT))
            s.commit()
        if not terminate_instance(eng, row, reason=START_TIMEOUT, actor="monitor"):
            return  # not confirmed gone: the next tick tries again (never two instances for one job)
    with eng.session() as s:
        waits = s.execute(
            select(InstanceRow.launched_at, InstanceRow.ended_at, InstanceRow.price_per_hour).where(
                InstanceRow.job_id == job_id, InstanceRow.end_reason == START_TIMEOUT
            )
        ).all()
    failed, paid = len(waits), sum(instance_cost(w, eng.now()) for w in waits)
    where = f"{row.provider} {row.gpu or ''}".strip() if row is not None else "its host"
    if failed > MAX_START_RETRIES:
        message = (
            f"{why} on {failed} hosts ({money(paid)} paid for the wait), so it was stopped "
            "instead of retried: check that hosts can pull TUNEBOT_RUNNER_IMAGE and download the model "
            "(TUNEBOT_HF_READ_TOKEN), and the runner's log on the provider's console"
        )
        if finish(eng, job_id, S.FAILED, reason=START_TIMEOUT, actor="monitor", message=message):
            text = f"Job {job_id} failed: {message}."
            eng.publish(EngineEventKind.failed, job_id, text, reason=START_TIMEOUT)
        return
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return
        moved = S.transition(
            s,
            job_id,
            S.RUNNING,
            S.RECOVERING,
            actor="monitor",
            now=now,
            reason=START_TIMEOUT,
            message=f"{why} on {where}; retrying once on another host",
        )
    if not moved:
        return
    eng.publish(
        EngineEventKind.start_retry,
        job_id,
        f"Job {job_id}: {why} on {where} (terminated; not counted as a preemption); retrying once on "
        "another host.",
        reason=START_TIMEOUT,
    )
    relaunch(eng, job_id, actor="monitor")
