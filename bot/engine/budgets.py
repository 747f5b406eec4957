"""Per-user and per-team daily and monthly budgets, with alerts at 80, 90 and 100 percent.

Each level fires once per budget period: the alert row's unique key (scope, name, period, level)
is the guard, so two scheduler passes (or two replicas) never send the same alert twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.spend import period_bounds
from bot.money import money
from store.models import Budget, BudgetAlert, SpendEntry

if TYPE_CHECKING:
    from sqlmodel import Session

    from bot.engine.context import EngineContext

ALERT_LEVELS = (80, 90, 100)


def spent(session: Session, scope: str, name: str, start: float, end: float) -> float:
    col = SpendEntry.owner if scope == "user" else SpendEntry.team
    total = session.execute(
        select(func.coalesce(func.sum(SpendEntry.amount), 0.0)).where(
            col == name, SpendEntry.period_start >= start - 1, SpendEntry.period_start < end
        )
    ).scalar_one()
    return float(total)


def budgeted(eng: EngineContext) -> tuple[set[str], set[str]]:
    """(users, teams) that have a budget: whose spend a tick keeps current in the ledger."""
    with eng.session() as s:
        rows = s.execute(select(Budget.scope, Budget.name)).all()
    return {n for sc, n in rows if sc == "user"}, {n for sc, n in rows if sc == "team"}


def check(eng: EngineContext) -> list[EngineEvent]:
    """Raise the alerts that the current spend has crossed (call after a spend roll-up)."""
    now = eng.now()
    d = datetime.fromtimestamp(now, UTC)
    periods = {
        "daily": (f"day:{d:%Y-%m-%d}", period_bounds("today", now)),
        "monthly": (f"month:{d:%Y-%m}", period_bounds("month", now)),
    }
    events: list[EngineEvent] = []
    with eng.session() as s:
        budgets = list(s.execute(select(Budget)).scalars())
    for b in budgets:
        for attr, (period, (start, end)) in periods.items():
            limit = getattr(b, attr)
            if not limit:
                continue
            with eng.session() as s:
                amount = spent(s, b.scope, b.name, start, end)
            levels = [lv for lv in ALERT_LEVELS if amount >= limit * lv / 100.0]
            if not levels:
                continue
            level = max(levels)
            fired = False
            for lv in levels:  # record every crossed level, announce the highest new one
                with eng.session() as s:
                    s.add(
                        BudgetAlert(
                            scope=b.scope,
                            name=b.name,
                            period=period,
                            level=lv,
                            spent=amount,
                            limit=limit,
                            at=now,
                        )
                    )
                    try:
                        s.commit()
                        fired = fired or lv == level
                        if lv != level:
                            events.append(_event(b, attr, lv, amount, limit, now))
                    except IntegrityError:
                        s.rollback()
            if fired:
                events.append(_event(b, attr, level, amount, limit, now))
    for ev in events:
        eng.bus.publish(ev)
    return events


def _event(b: Budget, attr: str, level: int, amount: float, limit: float, now: float) -> EngineEvent:
    word = "today" if attr == "daily" else "this month"
    return EngineEvent(
        kind=EngineEventKind.budget_alert,
        user=b.name if b.scope == "user" else None,
        message=f"{b.scope.capitalize()} {b.name} has spent {money(amount)} of the {attr} budget "
        f"{money(limit)} {word} ({level}%).",
        data={
            "scope": b.scope,
            "name": b.name,
            "period": attr,
            "level": level,
            "spent": round(amount, 4),
            "limit": limit,
        },
        at=now,
    )
