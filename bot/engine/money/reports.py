"""What people read back from the engine: job lists, spend reports, budgets, volumes (and setting a budget).

Plain queries over the store with the context; every figure is derived from the ledger or the
instances (a view rolls spend up first, so it is current to the second).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import func, select

from bot.engine.api import (
    BudgetView,
    EngineError,
    JobView,
    PermissionDenied,
    SpendLine,
    SpendReport,
    VolumeView,
)
from bot.engine.context import EngineContext
from bot.engine.money import budgets as budgets_mod
from bot.engine.money import volumes as volumes_mod
from bot.engine.permissions import OPERATOR, Permissions
from bot.engine.record import states as S
from bot.engine.record.spend import job_spend, period_bounds, roll_up_recent
from bot.engine.views import job_view, ts
from store.models import Budget, Job, SpendEntry, VolumeRecord


def check_read(policy: Permissions, viewer: str | None, owner: str) -> None:
    """PermissionDenied unless ``viewer`` may see a job of ``owner`` (None: the bot itself, always)."""
    if viewer is None:
        return
    decision = policy.can_read(viewer, owner)
    if not decision:
        raise PermissionDenied(decision.reason)


def check_read_user(policy: Permissions, viewer: str | None, whose: str | None) -> None:
    """PermissionDenied unless ``viewer`` may see ``whose`` jobs and spend (None: everyone's)."""
    if viewer is None:
        return
    decision = policy.can_read_user(viewer, whose)
    if not decision:
        raise PermissionDenied(decision.reason)


def list_jobs(
    ctx: EngineContext,
    *,
    user: str | None = None,
    active_only: bool = False,
    heard: Callable[[EngineContext, Job], int | None] | None = None,
) -> list[JobView]:
    """``heard``: the step a running job's newest heartbeat claims (the service hands down
    bot/engine/watching/progress.py ``step_heard``)."""
    with ctx.session() as s:
        q = select(Job)
        if user:
            q = q.where(Job.owner == user)
        if active_only:
            q = q.where(Job.state.in_(sorted(S.OPEN)))
        jobs = list(s.execute(q.order_by(Job.created_at.desc()).limit(200)).scalars())
        now = ctx.now()
        return [
            job_view(
                j,
                spend=j.spend if j.state in S.FINAL else job_spend(s, j.id, now),
                heard_step=heard(ctx, j) if heard is not None else None,
            )
            for j in jobs
        ]


def spend(
    ctx: EngineContext, period: Literal["today", "week", "month"], *, user: str | None = None
) -> SpendReport:
    now = ctx.now()
    start, end = period_bounds(period, now)
    roll_up_recent(ctx)
    with ctx.session() as s:
        base = select(SpendEntry).where(SpendEntry.period_start >= start - 1)
        if user:
            base = base.where(SpendEntry.owner == user)
        sub = base.subquery()

        def lines(col: Any) -> list[SpendLine]:
            rows = s.execute(
                select(col, func.sum(sub.c.amount)).group_by(col).order_by(func.sum(sub.c.amount).desc())
            ).all()
            return [SpendLine(key=str(k or "-"), amount=round(float(a), 6)) for k, a in rows]

        by_user = lines(sub.c.owner)
        budgets = {b.name: b for b in s.execute(select(Budget).where(Budget.scope == "user")).scalars()}
        for line in by_user:
            b = budgets.get(line.key)
            if b is not None:
                line.budget = b.daily if period == "today" else b.monthly if period == "month" else None
        total = float(s.execute(select(func.coalesce(func.sum(sub.c.amount), 0.0))).scalar_one())
        return SpendReport(
            period=period,
            start=ts(start),
            end=ts(end),
            total=round(total, 6),
            by_user=by_user,
            by_provider=lines(sub.c.provider),
            by_job=lines(sub.c.job_id)[:50],
        )


def volume_view(r: VolumeRecord, now: float) -> VolumeView:
    return VolumeView(
        provider=r.provider,
        volume_id=r.volume_id,
        name=r.name,
        size_gb=r.size_gb,
        price_per_gb_month=r.price_per_gb_month,
        cost_per_month=r.size_gb * r.price_per_gb_month,
        cost_so_far=round(volumes_mod.cost_so_far(r, now), 4),
        idle_since=ts(r.idle_since),
        owner=r.owner,
        tracked=r.tracked,
    )


VOLUME_WINDOW_S = 60.0  # TUNEBOT_VOLUMES_PER_MINUTE counts asks in this window


def _volume_ask(ctx: EngineContext, viewer: str, now: float) -> None:
    """Count one member's `volumes`; EngineError past TUNEBOT_VOLUMES_PER_MINUTE in the last minute."""
    limit = ctx.settings.volumes_per_minute
    memory = ctx.memory
    with memory.volumes_lock:
        asks = [t for t in memory.volume_asks.get(viewer, []) if now - t < VOLUME_WINDOW_S]
        if len(asks) >= limit:
            memory.volume_asks[viewer] = asks
            wait = max(1, int(VOLUME_WINDOW_S - (now - asks[0]) + 0.999))
            raise EngineError(
                f"you asked for the volumes {len(asks)} times in the last minute, the most one person may "
                f"(TUNEBOT_VOLUMES_PER_MINUTE={limit}); the list changes slowly: ask again in {wait} s"
            )
        asks.append(now)
        memory.volume_asks[viewer] = asks
        if len(memory.volume_asks) > 10_000:  # forget the quiet ones
            for who in [w for w, ts_ in memory.volume_asks.items() if not ts_ or now - ts_[-1] >= 60]:
                del memory.volume_asks[who]


def _sync_volumes(ctx: EngineContext, now: float, *, cached: bool) -> None:
    """List every cloud's volumes into the table; ``cached``: not when a listing is younger than
    TUNEBOT_VOLUMES_CACHE_SECONDS (one listing for everyone who asks meanwhile)."""
    memory = ctx.memory
    with memory.volumes_sync_lock:  # members asking together wait for one listing, not one each
        last = memory.volumes_synced_at
        if cached and last is not None and 0 <= now - last < ctx.settings.volumes_cache_s:
            return
        volumes_mod.sync(ctx)
        memory.volumes_synced_at = now


def volumes(
    ctx: EngineContext, *, viewer: str | None = None, policy: Permissions | None = None
) -> list[VolumeView]:
    """Every live volume (``viewer`` None: the bot itself, the operator: fresh from the clouds). A member
    asks at most TUNEBOT_VOLUMES_PER_MINUTE times a minute, answered from a listing at most
    TUNEBOT_VOLUMES_CACHE_SECONDS old, and sees only the tracked volumes of their own jobs (admins and
    TUNEBOT_TEAM_READ: all)."""
    policy = policy or ctx.policy
    now = ctx.now()
    member = viewer is not None and viewer != OPERATOR
    if member:
        _volume_ask(ctx, viewer, now)  # type: ignore[arg-type]
    _sync_volumes(ctx, now, cached=member)
    with ctx.session() as s:
        rows = list(s.execute(select(VolumeRecord).where(VolumeRecord.deleted_at.is_(None))).scalars())
    if viewer is not None and not policy.sees_everyone(viewer):
        rows = [r for r in rows if r.tracked and r.owner == viewer]
    return [volume_view(r, now) for r in rows]


def budgets(
    ctx: EngineContext, *, viewer: str | None = None, policy: Permissions | None = None
) -> list[BudgetView]:
    """Every budget and what was spent against it (``viewer`` None: the bot itself, the operator). A member
    ``viewer`` sees only their own user budget: the others' rows are other people's spend (a team's, the
    whole team's); admins and TUNEBOT_TEAM_READ see all."""
    policy = policy or ctx.policy
    roll_up_recent(ctx)  # what was spent up to now (a tick rolls up at most once a minute)
    now = ctx.now()
    day, _ = period_bounds("today", now)
    month, _ = period_bounds("month", now)
    with ctx.session() as s:
        out = []
        for b in s.execute(select(Budget).order_by(Budget.scope, Budget.name)).scalars():
            if (
                viewer is not None
                and not policy.sees_everyone(viewer)
                and (b.scope, b.name) != ("user", viewer)
            ):
                continue
            out.append(
                BudgetView(
                    scope=b.scope,
                    name=b.name,
                    daily=b.daily,
                    monthly=b.monthly,
                    spent_today=round(budgets_mod.spent(s, b.scope, b.name, day, now + 1), 6),
                    spent_month=round(budgets_mod.spent(s, b.scope, b.name, month, now + 1), 6),
                )
            )
        return out


def set_budget(
    ctx: EngineContext,
    policy: Permissions,
    scope: Literal["user", "team"],
    name: str,
    *,
    daily: float | None,
    monthly: float | None,
    user: str,
) -> BudgetView:
    if scope not in ("user", "team"):
        raise EngineError("scope must be user or team")
    decision = policy.can_set_budget(user)
    if not decision:
        raise PermissionDenied(decision.reason)
    now = ctx.now()
    with ctx.session() as s:
        b = s.execute(select(Budget).where(Budget.scope == scope, Budget.name == name)).scalars().first()
        if b is None:
            b = Budget(scope=scope, name=name)
            s.add(b)
        b.daily, b.monthly, b.updated_by, b.updated_at = daily, monthly, user, now
        S.audit(
            s,
            actor=user,
            action="set-budget",
            job_id=None,
            at=now,
            scope=scope,
            name=name,
            daily=daily,
            monthly=monthly,
        )
        s.commit()
    return next(v for v in budgets(ctx) if v.scope == scope and v.name == name)
