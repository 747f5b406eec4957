"""Spend: billed seconds x the price locked at launch, per instance, rolled up into a daily ledger.

An instance bills from its launch until it is confirmed gone (or until now while it lives); its
price is the one locked when it was launched, never today's catalog. The ledger holds one line per
instance (or volume) per UTC day so that "today", "this week" and "this month" are plain sums, and
each roll-up rewrites the lines it covers (idempotent: running it twice changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlmodel import Session

from store.db import insert_for
from store.models import Instance, Job, SpendEntry, VolumeRecord

DAY = 86400.0
MONTH_SECONDS = 30 * DAY  # storage is priced per GB-month; a month is 30 days here


def billed_seconds(inst: Instance, now: float) -> float:
    end = inst.ended_at if inst.ended_at is not None else now
    return max(0.0, end - inst.launched_at)


def instance_cost(inst: Instance, now: float) -> float:
    return billed_seconds(inst, now) * inst.price_per_hour / 3600.0


def job_spend(session: Session, job_id: str, now: float) -> float:
    """The job's spend: the one formula behind the job's recorded spend, its view and the final messages."""
    rows = (
        session.execute(
            select(Instance).where(Instance.job_id == job_id).execution_options(populate_existing=True)
        )
        .scalars()
        .all()
    )
    return sum(instance_cost(r, now) for r in rows)


def day_start(ts: float) -> float:
    d = datetime.fromtimestamp(ts, UTC)
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """UTC start and end of today / this week (Monday) / this month."""
    d = datetime.fromtimestamp(now, UTC)
    today = datetime(d.year, d.month, d.day, tzinfo=UTC)
    if period == "today":
        start = today
    elif period == "week":
        start = today - timedelta(days=today.weekday())
    elif period == "month":
        start = datetime(d.year, d.month, 1, tzinfo=UTC)
    else:
        raise ValueError(f"unknown period {period!r}: use today, week or month")
    return start.timestamp(), now


def _split_by_day(start: float, end: float) -> Iterable[tuple[float, float]]:
    """(day_start, seconds) pieces of [start, end)."""
    t = start
    while t < end:
        d0 = day_start(t)
        piece_end = min(end, d0 + DAY)
        yield d0, piece_end - t
        t = piece_end


def _upsert(
    session: Session,
    existing: dict[tuple[str, float], SpendEntry],
    entry: SpendEntry,
    new: list[SpendEntry],
) -> None:
    row = existing.get((entry.source, entry.period_start))
    if row is None:
        new.append(entry)
        existing[(entry.source, entry.period_start)] = entry
    else:
        row.seconds, row.amount, row.rate_per_hour, row.updated_at = (
            entry.seconds,
            entry.amount,
            entry.rate_per_hour,
            entry.updated_at,
        )
        row.owner, row.team, row.job_id = entry.owner, entry.team, entry.job_id


def _insert_new(session: Session, new: list[SpendEntry]) -> None:
    """New lines, 500 to a statement, as INSERT ... ON CONFLICT DO UPDATE: another process rolling up the
    same day at the same moment writes the same lines, and the two converge (no uq_spend_source_period
    error)."""
    key = ("source", "period_start")
    cols = [c.name for c in SpendEntry.__table__.columns if c.name != "id"]
    for k in range(0, len(new), 500):
        rows = [{c: getattr(e, c) for c in cols} for e in new[k : k + 500]]
        stmt = insert_for(session, SpendEntry).values(rows)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=list(key), set_={c: stmt.excluded[c] for c in cols if c not in key}
            )
        )


def roll_up(session: Session, now: float, *, since: float | None = None) -> int:
    """Rewrite the ledger lines of every instance and volume that billed after ``since``.

    ``since`` defaults to two days ago: older lines are final. Returns the number of sources rolled.
    Commits nothing: the caller owns the transaction.
    """
    since = now - 2 * DAY if since is None else since
    insts = session.execute(
        select(Instance, Job.owner, Job.team)
        .join(Job, Job.id == Instance.job_id, isouter=True)
        .where(or_(Instance.ended_at.is_(None), Instance.ended_at >= since))
        .order_by(Instance.id)  # every process writes the lines in one order: no deadlock between them
    ).all()
    vols = (
        session.execute(
            select(VolumeRecord)
            .where(or_(VolumeRecord.deleted_at.is_(None), VolumeRecord.deleted_at >= since))
            .order_by(VolumeRecord.id)
        )
        .scalars()
        .all()
    )
    sources = [f"instance:{i.id}" for i, _, _ in insts] + [f"volume:{v.provider}:{v.volume_id}" for v in vols]
    existing: dict[tuple[str, float], SpendEntry] = {}
    new: list[SpendEntry] = []
    for chunk in range(0, len(sources), 500):
        for row in session.execute(
            select(SpendEntry).where(SpendEntry.source.in_(sources[chunk : chunk + 500]))
        ).scalars():
            existing[(row.source, row.period_start)] = row
    for inst, owner, team in insts:
        end = inst.ended_at if inst.ended_at is not None else now
        for d0, secs in _split_by_day(inst.launched_at, end):
            _upsert(
                session,
                existing,
                SpendEntry(
                    source=f"instance:{inst.id}",
                    kind="compute",
                    job_id=inst.job_id,
                    owner=owner,
                    team=team,
                    provider=inst.provider,
                    period_start=d0,
                    seconds=secs,
                    rate_per_hour=inst.price_per_hour,
                    amount=secs * inst.price_per_hour / 3600.0,
                    updated_at=now,
                ),
                new,
            )
    for vol in vols:
        end = vol.deleted_at if vol.deleted_at is not None else now
        rate_h = vol.size_gb * vol.price_per_gb_month / (MONTH_SECONDS / 3600.0)
        for d0, secs in _split_by_day(vol.first_seen_at, end):
            _upsert(
                session,
                existing,
                SpendEntry(
                    source=f"volume:{vol.provider}:{vol.volume_id}",
                    kind="storage",
                    owner=vol.owner,
                    provider=vol.provider,
                    period_start=d0,
                    seconds=secs,
                    rate_per_hour=rate_h,
                    amount=secs * rate_h / 3600.0,
                    updated_at=now,
                ),
                new,
            )
    _insert_new(session, new)
    return len(sources)
