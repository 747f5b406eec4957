"""The daily spend summary: a few aggregate queries, fast on tens of thousands of jobs, into a typed
``DailySummary`` (api.py) that the chat renders."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from bot.engine.api import DailySummary, SpendLine
from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.record import states as S
from bot.engine.record.spend import DAY, day_start, period_bounds, roll_up_recent
from store.models import Job, SpendEntry, VolumeRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext


def daily_summary(eng: EngineContext, *, day: str = "yesterday") -> DailySummary:
    """One UTC day's spend (yesterday for the scheduled post; "today" so far on demand), month to date,
    by user and provider; jobs by state; idle volumes. Published as a daily_summary event whose data is
    {"summary": DailySummary as JSON}: the chat renders it, the engine writes no sentence about it."""
    now = eng.now()
    roll_up_recent(eng)
    today = day_start(now)
    start = today if day == "today" else today - DAY  # the day summarized (today: so far, e.g. the demo)
    end = start + DAY
    month_start, _ = period_bounds("month", now)
    with eng.session() as s:

        def total(lo: float, hi: float, kind: str | None = None) -> float:
            q = select(func.coalesce(func.sum(SpendEntry.amount), 0.0)).where(
                SpendEntry.period_start >= lo, SpendEntry.period_start < hi
            )
            if kind is not None:
                q = q.where(SpendEntry.kind == kind)
            return float(s.execute(q).scalar_one())

        spent_day = total(start, end)
        spent_today = total(today, today + DAY)
        spent_month = total(month_start, today + DAY)
        storage_day = total(start, end, "storage")
        storage_today = total(today, today + DAY, "storage")
        storage_month = total(month_start, today + DAY, "storage")
        by_user = s.execute(
            select(SpendEntry.owner, func.sum(SpendEntry.amount))
            .where(SpendEntry.period_start >= start, SpendEntry.period_start < end)
            .group_by(SpendEntry.owner)
            .order_by(func.sum(SpendEntry.amount).desc())
            .limit(10)
        ).all()
        by_provider = s.execute(
            select(SpendEntry.provider, func.sum(SpendEntry.amount))
            .where(SpendEntry.period_start >= start, SpendEntry.period_start < end)
            .group_by(SpendEntry.provider)
            .order_by(func.sum(SpendEntry.amount).desc())
        ).all()
        finished = dict(
            s.execute(
                select(Job.state, func.count())
                .where(Job.finished_at >= start, Job.finished_at < end)
                .group_by(Job.state)
            ).all()
        )
        active = int(
            s.execute(
                select(func.count()).select_from(Job).where(Job.state.in_(sorted(S.ACTIVE)))
            ).scalar_one()
        )
        pending = int(
            s.execute(
                select(func.count()).select_from(Job).where(Job.state == S.PENDING_APPROVAL)
            ).scalar_one()
        )
        idle_cutoff = now - eng.settings.volume_idle_days * DAY
        idle_vols, idle_cost = s.execute(
            select(
                func.count(),
                func.coalesce(func.sum(VolumeRecord.size_gb * VolumeRecord.price_per_gb_month), 0.0),
            ).where(VolumeRecord.deleted_at.is_(None), VolumeRecord.idle_since < idle_cutoff)
        ).one()
    summary = DailySummary(
        day=datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d"),
        spent=round(spent_day, 4),
        spent_today=round(spent_today, 4),
        spent_month=round(spent_month, 4),
        storage=round(storage_day, 4),
        storage_today=round(storage_today, 4),
        storage_month=round(storage_month, 4),
        by_user=[SpendLine(key=u or "-", amount=round(float(a), 4)) for u, a in by_user],
        by_provider=[SpendLine(key=p or "-", amount=round(float(a), 4)) for p, a in by_provider],
        finished={str(k): int(n) for k, n in finished.items()},
        active=active,
        pending_approval=pending,
        idle_volumes=int(idle_vols),
        idle_volume_cost_per_month=round(float(idle_cost), 4),
    )
    eng.bus.publish(
        EngineEvent(
            kind=EngineEventKind.daily_summary,
            message=f"Daily spend summary for {summary.day}",
            channel=eng.settings.summary_channel,
            data={"summary": summary.model_dump(mode="json")},
            at=now,
        )
    )
    return summary
