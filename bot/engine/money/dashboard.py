"""App Home as the team's dashboard: running jobs, spend per hour now, the month by person and team
against budgets (with a projection), idle volumes. What an admin and a member see is the engine's
policy (permissions.py): admins everything, members their own (everyone's with TUNEBOT_TEAM_READ).

Read from the store only (never a provider call: App Home is published on every open and on each job's
change of state). The projection is pure (``project_month``): month to date plus the last seven days'
daily pace for the days left; a month younger than seven days uses the days it has.
"""

from __future__ import annotations

import calendar
from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import func, select

from bot.engine.api import Dashboard, SpendPace
from bot.engine.context import EngineContext
from bot.engine.money.reports import volume_view
from bot.engine.permissions import Permissions
from bot.engine.record import states as S
from bot.engine.record.spend import (
    DAY,
    day_start,
    job_spend,
    period_bounds,
    roll_up_recent,
    storage_rate_per_hour,
)
from bot.engine.views import job_view, ts
from store.models import Budget, Instance, Job, SpendEntry, VolumeRecord

PACE_DAYS = 7
MY_JOBS = 10


def project_month(month_to_date: float, recent: float, *, now: float, month_start: float, days: int) -> float:
    """Month to date plus the recent daily pace for the rest of the month. ``recent`` is what was spent in
    the last PACE_DAYS days (or since the month began, when that is shorter)."""
    elapsed_days = max((now - month_start) / DAY, 1 / 24)
    window = min(PACE_DAYS, elapsed_days)
    left = max(0.0, days - elapsed_days)
    return month_to_date + recent / window * left


def dashboard(ctx: EngineContext, policy: Permissions, user: str) -> Dashboard:
    now = ctx.now()
    everyone = policy.sees_everyone(user)  # what this person reads: admins; all with TUNEBOT_TEAM_READ
    month_start, _ = period_bounds("month", now)
    when = datetime.fromtimestamp(now, UTC)
    days = calendar.monthrange(when.year, when.month)[1]
    pace_start = max(month_start, day_start(now) - (PACE_DAYS - 1) * DAY)
    roll_up_recent(ctx)
    with ctx.session() as s:
        mine = list(
            s.execute(
                select(Job).where(Job.owner == user).order_by(Job.created_at.desc()).limit(MY_JOBS)
            ).scalars()
        )
        active = select(Job).where(Job.state.in_(sorted(S.ACTIVE)))
        if not everyone:
            active = active.where(Job.owner == user)
        running = list(s.execute(active.order_by(Job.created_at.desc()).limit(90)).scalars())

        def spent(column, since: float) -> dict[str, float]:  # noqa: ANN001
            rows = s.execute(
                select(column, func.sum(SpendEntry.amount))
                .where(SpendEntry.period_start >= since)
                .group_by(column)
            ).all()
            return {str(k): float(a) for k, a in rows if k is not None}

        month_by = {"user": spent(SpendEntry.owner, month_start), "team": spent(SpendEntry.team, month_start)}
        pace_by = {"user": spent(SpendEntry.owner, pace_start), "team": spent(SpendEntry.team, pace_start)}
        hourly: dict[str, dict[str, float]] = {"user": defaultdict(float), "team": defaultdict(float)}
        for owner, team, price in s.execute(
            select(Job.owner, Job.team, Instance.price_per_hour)
            .join(Job, Job.id == Instance.job_id)
            .where(Instance.ended_at.is_(None))
        ).all():
            hourly["user"][owner] += float(price or 0.0)
            if team:
                hourly["team"][team] += float(price or 0.0)
        volumes = list(s.execute(select(VolumeRecord).where(VolumeRecord.deleted_at.is_(None))).scalars())
        for v in volumes:
            per_hour = storage_rate_per_hour(v.size_gb, v.price_per_gb_month)
            if v.owner:
                hourly["user"][v.owner] += per_hour
        budgets = {(b.scope, b.name): b.monthly for b in s.execute(select(Budget)).scalars()}
        mine_views = [_view(s, j, now) for j in mine]
        running_views = [_view(s, j, now) for j in running]

    def paces(scope: str) -> list[SpendPace]:
        names = set(month_by[scope]) | set(hourly[scope]) | {n for sc, n in budgets if sc == scope}
        if not everyone:
            names = {user} if scope == "user" else set()
        out = [
            SpendPace(
                scope=scope,  # type: ignore[arg-type]
                name=name,
                month_to_date=round(month_by[scope].get(name, 0.0), 6),
                projected_month=round(
                    project_month(
                        month_by[scope].get(name, 0.0),
                        pace_by[scope].get(name, 0.0),
                        now=now,
                        month_start=month_start,
                        days=days,
                    ),
                    6,
                ),
                budget=budgets.get((scope, name)),
                per_hour_now=round(hourly[scope].get(name, 0.0), 6),
            )
            for name in names
        ]
        return sorted(out, key=lambda p: (-p.month_to_date, p.name))

    people, teams = paces("user"), paces("team")
    if everyone:
        total = sum(month_by["user"].values())
        recent = sum(pace_by["user"].values())
        per_hour = sum(hourly["user"].values())
    else:
        total = month_by["user"].get(user, 0.0)
        recent = pace_by["user"].get(user, 0.0)
        per_hour = hourly["user"].get(user, 0.0)
    idle_cutoff = now - ctx.settings.volume_idle_days * DAY
    idle = [
        v
        for v in volumes
        if v.idle_since is not None and v.idle_since < idle_cutoff and (everyone or v.owner == user)
    ]
    idle.sort(key=lambda v: -(v.size_gb * v.price_per_gb_month))
    return Dashboard(
        user=user,
        is_admin=policy.is_admin(user),
        team_view=everyone,
        at=ts(now),  # type: ignore[arg-type]
        month_start=ts(month_start),  # type: ignore[arg-type]
        days_in_month=days,
        mine=mine_views,
        running=running_views,
        per_hour_now=round(per_hour, 6),
        month_to_date=round(total, 6),
        projected_month=round(project_month(total, recent, now=now, month_start=month_start, days=days), 6),
        people=people,
        teams=teams,
        idle_volumes=[volume_view(v, now) for v in idle],
        manageable=[
            f"{v.provider}:{v.volume_id}"
            for v in idle
            if policy.can_manage_volume(user, owner=v.owner, tracked=v.tracked)
        ],
    )


def _view(s, job: Job, now: float):  # noqa: ANN001, ANN202
    return job_view(job, spend=job.spend if job.state in S.FINAL else job_spend(s, job.id, now))
