"""The weekly report: who launched, approved and stopped what (the audit log), each finished job's
estimate against its actual cost and time, spend per day by person, idle volumes and budgets used.

A typed ``WeeklyReport`` (api.py) published as a ``weekly_report`` event: the chat renders it (and its
spend chart), the engine knows nothing of Slack. The period is the seven whole UTC days before today
(scheduled on a Monday: last Monday to Sunday). ``describe`` is pure (audit rows -> entries).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import func, select

from bot.engine.api import AuditEntry, FinishedJob, WeeklyReport
from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.money.reports import budgets, volume_view
from bot.engine.record.spend import DAY, billed_seconds, day_start, roll_up_recent
from bot.engine.views import ts
from store.models import AuditLog, Instance, Job, SpendEntry, VolumeRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

MAX_ACTIONS = 200


class Said(NamedTuple):
    """An audit row as people say it: what was done, in words, and its figures (the chat formats them)."""

    action: str
    detail: str | None = None
    amounts: dict[str, float] = {}  # noqa: RUF012  (a NamedTuple default, never mutated)
    days: float | None = None


def describe(action: str, actor: str, details: dict[str, Any]) -> Said | None:
    """What an audit row people care about says, or None (launch claims, adoptions, reaping...)."""
    reason = details.get("reason")
    if action == "create":
        offer = details.get("offer") or {}
        where = " ".join(str(offer[k]) for k in ("provider", "gpu") if offer.get(k))
        total = offer.get("total_cost")
        amounts = {"estimated": float(total)} if isinstance(total, int | float) else {}
        return Said("launched", where or None, amounts)
    if action.startswith("transition:") and action.endswith("->approved"):
        return Said("approved")
    if action.startswith("transition:") and action.endswith("->cancelled"):
        return Said("rejected") if reason == "rejected" else Said("cancelled", reason)
    if action == "stop-requested":
        return Said("stopped", reason if reason and reason != "user" else None)
    if action == "volume-delete":
        return Said("deleted volume")
    if action == "volume-keep":
        days = details.get("days")
        return Said("kept volume", days=float(days) if isinstance(days, int | float) else None)
    if action == "set-budget":
        keys = ("daily", "monthly")
        amounts = {k: float(details[k]) for k in keys if isinstance(details.get(k), int | float)}
        return Said("set budget", amounts=amounts)
    return None


def _target(row: AuditLog, jobs: dict[str, Job]) -> str | None:
    d = row.details or {}
    if row.action.startswith("volume-"):
        return f"{d.get('provider')}:{d.get('volume_id')}"
    if row.action == "set-budget":
        return f"{d.get('scope')} {d.get('name')}"
    job = jobs.get(row.job_id or "")
    if job is not None:
        req = job.request or {}
        return f"{req.get('model', '')} {req.get('method', '')}".strip() or None
    return None


def weekly_report(ctx: EngineContext, *, publish: bool = True) -> WeeklyReport:
    now = ctx.now()
    roll_up_recent(ctx)
    end = day_start(now)
    start = end - 7 * DAY
    days = [start + i * DAY for i in range(7)]
    with ctx.session() as s:
        rows = list(
            s.execute(
                select(AuditLog).where(AuditLog.at >= start, AuditLog.at < end).order_by(AuditLog.at)
            ).scalars()
        )
        finished = list(
            s.execute(
                select(Job).where(Job.finished_at >= start, Job.finished_at < end).order_by(Job.finished_at)
            ).scalars()
        )
        ids = {r.job_id for r in rows if r.job_id} | {j.id for j in finished}
        jobs = (
            {j.id: j for j in s.execute(select(Job).where(Job.id.in_(sorted(ids)))).scalars()} if ids else {}
        )
        instances: dict[str, list[Instance]] = defaultdict(list)
        if finished:
            for inst in s.execute(
                select(Instance).where(Instance.job_id.in_([j.id for j in finished]))
            ).scalars():
                instances[inst.job_id or ""].append(inst)
        daily: dict[str, list[float]] = defaultdict(lambda: [0.0] * 7)
        for owner, period, amount in s.execute(
            select(SpendEntry.owner, SpendEntry.period_start, func.sum(SpendEntry.amount))
            .where(SpendEntry.period_start >= start, SpendEntry.period_start < end)
            .group_by(SpendEntry.owner, SpendEntry.period_start)
        ).all():
            index = int((float(period) - start) // DAY)
            if 0 <= index < 7:
                daily[owner or "-"][index] += float(amount)
        idle_cutoff = now - ctx.settings.volume_idle_days * DAY
        idle = list(
            s.execute(
                select(VolumeRecord).where(
                    VolumeRecord.deleted_at.is_(None), VolumeRecord.idle_since < idle_cutoff
                )
            ).scalars()
        )
    actions = []
    for row in rows:
        described = describe(row.action, row.actor, row.details or {})
        if described is None:
            continue
        actions.append(
            AuditEntry(
                at=ts(row.at),  # type: ignore[arg-type]
                actor=row.actor,
                action=described.action,  # type: ignore[arg-type]
                job_id=row.job_id,
                target=_target(row, jobs),
                detail=described.detail,
                amounts=described.amounts,
                days=described.days,
            )
        )
    report = WeeklyReport(
        start=ts(start),  # type: ignore[arg-type]
        end=ts(end),  # type: ignore[arg-type]
        total=round(sum(sum(v) for v in daily.values()), 6),
        days=[datetime.fromtimestamp(d, UTC).strftime("%Y-%m-%d") for d in days],
        daily_by_person={k: [round(a, 6) for a in v] for k, v in daily.items()},
        actions=actions[-MAX_ACTIONS:],
        finished=[_finished(j, instances.get(j.id, []), now) for j in finished],
        idle_volumes=sorted((volume_view(v, now) for v in idle), key=lambda v: -v.cost_per_month),
        budgets=budgets(ctx),
    )
    if publish:
        ctx.bus.publish(
            EngineEvent(
                kind=EngineEventKind.weekly_report,
                channel=ctx.settings.summary_channel,
                message=f"Weekly report {report.days[0]} to {report.days[-1]}",  # figures: the chat's
                data={"report": report.model_dump(mode="json")},
                at=now,
            )
        )
    return report


def _finished(job: Job, instances: list[Instance], now: float) -> FinishedJob:
    req = job.request or {}
    return FinishedJob(
        job_id=job.id,
        owner=job.owner,
        model=str(req.get("model", "")),
        method=str(req.get("method", "")),
        state=job.state,
        stop_reason=job.stop_reason,
        provider=job.provider,
        gpu=job.gpu,
        estimated_cost=job.estimated_cost,
        actual_cost=round(job.spend, 6),
        estimated_hours=job.estimated_hours,
        actual_hours=round(sum(billed_seconds(i, now) for i in instances) / 3600, 4),
    )
