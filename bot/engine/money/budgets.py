"""Per-user and per-team daily and monthly budgets: alerts at 80 and 90 percent, a stop at 100.

Each level fires once per budget period: the alert row's unique key (scope, name, period, level)
is the guard, so two scheduler passes (or two replicas) never send the same alert twice.

At 100% a budget is spent: new launches it covers are refused (bot/engine/launching/admission.py, with the
budget's name and who can raise it) and its running jobs are asked to stop gracefully (they checkpoint
first, the existing stop path) on every check until the budget is raised or the period ends. A job is
covered by its owner's user budget and its team's team budget (``jobs.team``: the Slack workspace, or
TUNEBOT_TEAM for the console and the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, or_, select
from sqlalchemy.exc import IntegrityError

from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.record.spend import period_bounds, roll_up_recent
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


@dataclass(frozen=True)
class Spent:
    """A budget at (or past) 100% in its current period."""

    scope: str  # user | team
    name: str
    period: str  # daily | monthly
    amount: float
    limit: float

    def describe(self) -> str:
        word = "today" if self.period == "daily" else "this month"
        return (
            f"{self.scope} {self.name}'s {self.period} budget of {money(self.limit)} is spent "
            f"({money(self.amount)} {word})"
        )

    def how_to_raise(self, who: str, command: str = "budget") -> str:
        """``who`` and ``command``: the policy's who_raises_budgets and budget_command."""
        return f"{who} can raise it: `{command} set {self.scope} {self.name} {self.period}=AMOUNT`"


def spent_budgets(
    eng: EngineContext, *, owner: str | None = None, team: str | None = None, roll_up: bool = True
) -> list[Spent]:
    """The budgets at 100% that cover this owner and team (all budgets when both are None).

    ``roll_up``: first bring their ledger lines up to now (only theirs), so a refusal is never a minute
    late."""
    with eng.session() as s:
        q = select(Budget)
        if owner is not None or team is not None:
            q = q.where(
                or_(
                    and_(Budget.scope == "user", Budget.name == (owner or "")),
                    and_(Budget.scope == "team", Budget.name == (team or "")),
                )
            )
        budgets = list(s.execute(q).scalars())
    if not budgets:
        return []
    if roll_up and (owner is not None or team is not None):
        roll_up_recent(eng, scope=({owner} - {None}, {team} - {None}))  # type: ignore[arg-type]
    now = eng.now()
    out: list[Spent] = []
    with eng.session() as s:
        for b in budgets:
            for period, key in (("daily", "today"), ("monthly", "month")):
                limit = getattr(b, period)
                if not limit:
                    continue
                start, end = period_bounds(key, now)
                amount = spent(s, b.scope, b.name, start, end)
                if amount >= limit:
                    out.append(Spent(b.scope, b.name, period, amount, limit))
    return out


def check(eng: EngineContext) -> list[EngineEvent]:
    """Raise the alerts that the current spend has crossed (call after a spend roll-up), and stop the
    running jobs of every budget at 100%."""
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
    spent_note = (
        " New launches it covers are refused and its running jobs stop after a checkpoint until it is raised."
        if level >= 100
        else ""
    )
    return EngineEvent(
        kind=EngineEventKind.budget_alert,
        user=b.name if b.scope == "user" else None,
        message=f"{b.scope.capitalize()} {b.name} has spent {money(amount)} of the {attr} budget "
        f"{money(limit)} {word} ({level}%).{spent_note}",
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
