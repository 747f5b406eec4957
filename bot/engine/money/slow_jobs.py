"""A slow job says so before its cap cuts it (issue 36): in its thread (Slack, and `tunebot serve`'s log or
the console without it), once, when after the first few percent of its steps it projects well over its quoted
time or past its cap (bot/engine/pace.py), and again only when it gets materially worse.

What was said is kept in the audit log (action ``pace``, with the projection), read before anything is said:
a restarted bot, or a second process on the same database, says nothing twice. The projection decides no
money; the cap's stop is the tick's (watching/supervise.py, pace.cap_due), which asks this module.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from bot.engine.context import EngineContext
from bot.engine.events import EngineEventKind
from bot.engine.pace import Pace, pace, worse
from bot.engine.record import states as S
from store.models import AuditLog

log = logging.getLogger(__name__)

ACTION = "pace"


def projection(job: Any, spent: float, burn_per_hour: float) -> Pace | None:
    """The pace of a running job from its row's columns (supervise.JobFacts) and what it has spent."""
    return pace(
        step=job.last_step,
        max_steps=job.max_steps,
        spent=spent,
        price_per_hour=burn_per_hour or job.price_per_hour,
        quoted_hours=job.estimated_hours,
        eta_seconds=job.eta_seconds,
        max_cost=job.max_cost,
    )


def tell(ctx: EngineContext, job: Any, spent: float, burn_per_hour: float) -> bool:
    """Say in the job's thread that it runs slower than quoted, when it does and has not been told so (or it
    got materially worse since); True when it was said now."""
    if job.outcome is not None or job.stop_requested_at is not None:
        return False
    if getattr(job, "sweep_id", None) is not None:
        # A sweep's run pauses at its stage boundaries (billed, its step still) and its cap covers its stage,
        # not its last step: its own projection would cry slow at every boundary. The sweep keeps its runs
        # within the sweep's max_cost and says what it spent (bot/engine/control/sweeps.py).
        return False
    now = projection(job, spent, burn_per_hour)
    if now is None or not now.slow:
        return False
    said = ctx.memory.pace_said.get(job.id)
    if said is not None and not worse(now, *said):
        return False
    said = _last_said(ctx, job.id)  # the audit log's, which another process may have written since
    if said is not None and not worse(now, *said):
        ctx.memory.pace_said[job.id] = said
        return False
    with ctx.session() as s:
        S.audit(
            s,
            actor="engine",
            action=ACTION,
            job_id=job.id,
            at=ctx.now(),
            slower=round(now.slower, 4),
            cost=round(now.cost, 6),
            hours=round(now.hours, 4),
            step=now.step,
            cap_step=now.cap_step,
        )
        s.commit()
    ctx.memory.pace_said[job.id] = (now.slower, now.cap_step is not None)
    ctx.publish(
        EngineEventKind.warning,
        job.id,
        f"Job {job.id}: {now.line(job.id)}",
        pace={"slower": now.slower, "cost": now.cost, "hours": now.hours, "cap_step": now.cap_step},
    )
    return True


def tell_safely(ctx: EngineContext, job: Any, spent: float, burn_per_hour: float) -> None:
    try:
        tell(ctx, job, spent, burn_per_hour)
    except Exception:  # noqa: BLE001 - a warning never stops supervision
        log.exception("job %s: could not tell its pace", job.id)


def _last_said(ctx: EngineContext, job_id: str) -> tuple[float, bool] | None:
    """(how much slower, whether its cap cut it) as last said in the job's thread; None if never."""
    with ctx.session() as s:
        details = s.execute(
            select(AuditLog.details)
            .where(AuditLog.job_id == job_id, AuditLog.action == ACTION)
            .order_by(AuditLog.at.desc(), AuditLog.id.desc())
            .limit(1)
        ).scalar()
    if not isinstance(details, dict):
        return None
    return float(details.get("slower") or 0.0), details.get("cap_step") is not None
