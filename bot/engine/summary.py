"""The daily spend summary: a few aggregate queries, fast on tens of thousands of jobs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from bot.engine import states as S
from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.spend import DAY, day_start, period_bounds, roll_up_recent
from bot.money import money
from store.models import Job, SpendEntry, VolumeRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext


def daily_summary(eng: EngineContext, *, day: str = "yesterday") -> EngineEvent:
    """One UTC day's spend (yesterday for the scheduled post; "today" so far on demand), month to date,
    by user and provider; jobs by state; idle volumes."""
    now = eng.now()
    roll_up_recent(eng)
    today = day_start(now)
    start = today if day == "today" else today - DAY  # the day summarized (today: so far, e.g. the demo)
    end = start + DAY
    month_start, _ = period_bounds("month", now)
    with eng.session() as s:

        def total(lo: float, hi: float) -> float:
            return float(
                s.execute(
                    select(func.coalesce(func.sum(SpendEntry.amount), 0.0)).where(
                        SpendEntry.period_start >= lo, SpendEntry.period_start < hi
                    )
                ).scalar_one()
            )

        spent_day = total(start, end)
        spent_today = total(today, today + DAY)
        spent_month = total(month_start, today + DAY)
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
    label = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d")
    done = ", ".join(f"{n} {state}" for state, n in sorted(finished.items())) or "none"
    top = ", ".join(f"{u or '-'} {money(float(a))}" for u, a in by_user) or "nobody"
    message = (
        f"Spend on {label}: {money(spent_day)} (today so far {money(spent_today)}, month to date "
        f"{money(spent_month)}). Top: {top}. Jobs finished: {done}. Active: {active}, awaiting approval: "
        f"{pending}. Idle volumes: {idle_vols} ({money(float(idle_cost))}/month)."
    )
    ev = EngineEvent(
        kind=EngineEventKind.daily_summary,
        message=message,
        channel=eng.settings.summary_channel,
        data={
            "day": label,
            "spent": round(spent_day, 4),
            "spent_today": round(spent_today, 4),
            "spent_month": round(spent_month, 4),
            "by_user": [(u, round(float(a), 4)) for u, a in by_user],
            "by_provider": [(p, round(float(a), 4)) for p, a in by_provider],
            "finished": finished,
            "active": active,
            "pending_approval": pending,
            "idle_volumes": int(idle_vols),
            "idle_volume_cost_per_month": round(float(idle_cost), 4),
        },
        at=now,
    )
    eng.bus.publish(ev)
    return ev
