"""Spend: billed seconds x the price locked at launch, per instance, rolled up into a daily ledger.

An instance bills from its launch until it is confirmed gone (or until now while it lives); its
price is the one locked when it was launched, never today's catalog. The ledger holds one line per
instance (or volume) per UTC day so that "today", "this week" and "this month" are plain sums, and
each roll-up rewrites the lines it covers (idempotent: running it twice changes nothing).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy import Connection, or_, select, true
from sqlmodel import Session

from bot.engine.record.jobstate import ACTIVE
from runner.contract.spec import billed_cost
from store.models import Instance, Job, SpendEntry, VolumeRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

DAY = 86400.0
MONTH_SECONDS = 30 * DAY  # storage is priced per GB-month; a month is 30 days here


class Billed(Protocol):
    """What spend needs of an instance row (an ORM row or a plain query row)."""

    launched_at: float
    ended_at: float | None
    price_per_hour: float


def cost(start: float, end: float | None, price_per_hour: float, now: float) -> float:
    """The one spend formula: seconds billed from ``start`` until ``end`` (until ``now`` while it lasts)
    at the price locked at launch. The job's spend, the cap check, the views and every ledger line use it;
    its arithmetic is the contract's ``runner.contract.spec.billed_cost``, which the runner's stop at the cap
    uses."""
    return billed_cost((end if end is not None else now) - start, price_per_hour)


def storage_rate_per_hour(size_gb: float, price_per_gb_month: float) -> float:
    """A volume's price per hour, billed like an instance (a month is 30 days here)."""
    return size_gb * price_per_gb_month / (MONTH_SECONDS / 3600.0)


def billed_seconds(inst: Billed, now: float) -> float:
    end = inst.ended_at if inst.ended_at is not None else now
    return max(0.0, end - inst.launched_at)


def instance_cost(inst: Billed, now: float) -> float:
    return cost(inst.launched_at, inst.ended_at, inst.price_per_hour, now)


def job_instances(session: Session, job_id: str) -> list[Instance]:
    """All the job's instance rows, as the database has them now."""
    return list(
        session.execute(
            select(Instance).where(Instance.job_id == job_id).execution_options(populate_existing=True)
        ).scalars()
    )


def job_spend(session: Session, job_id: str, now: float, rows: list[Instance] | None = None) -> float:
    """The job's spend: the one formula behind the job's recorded spend, its view and the final messages.
    ``rows``: the job's instances just read by the caller (job_instances), not read again."""
    rows = job_instances(session, job_id) if rows is None else rows
    return sum(instance_cost(r, now) for r in rows)


def ended_spend(session: Session | Connection, job_ids: Collection[str], now: float) -> dict[str, float]:
    """The spend of several jobs' ended instances, as job_spend counts each; the tick's cap check adds
    the open ones it already holds. One query (for many jobs, the ended instances of every active job,
    filtered here, instead of thousands of IN-list parameters)."""
    q = select(Instance.job_id, Instance.launched_at, Instance.ended_at, Instance.price_per_hour).where(
        Instance.ended_at.is_not(None)
    )
    if len(job_ids) > 500:
        q = q.join(Job, Job.id == Instance.job_id).where(Job.state.in_(sorted(ACTIVE)))
    else:
        q = q.where(Instance.job_id.in_(sorted(job_ids)))
    wanted = set(job_ids)
    out: dict[str, float] = {}
    for job_id, launched_at, ended_at, price in session.execute(q).all():
        if job_id in wanted:
            out[job_id] = out.get(job_id, 0.0) + cost(launched_at, ended_at, price, now)
    return out


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


def _split_by_day(start: float, end: float) -> Iterable[tuple[float, float, float]]:
    """(day_start, piece start, piece end) pieces of [start, end)."""
    t = start
    while t < end:
        d0 = day_start(t)
        piece_end = min(end, d0 + DAY)
        yield d0, t, piece_end
        t = piece_end


def _upsert_lines(session: Session, lines: list[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT (source, period_start) DO UPDATE, in one executemany: a concurrent
    roll-up in another process writes the same figures, so the last writer wins harmlessly."""
    if not lines:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    stmt = dialect_insert(SpendEntry.__table__)  # Core: no ORM bulk machinery per line
    stmt = stmt.on_conflict_do_update(
        index_elements=["source", "period_start"],
        set_={c: stmt.excluded[c] for c in _LINE_COLUMNS if c not in ("source", "period_start")},
    )
    for k in range(0, len(lines), 2000):
        session.execute(stmt, lines[k : k + 2000])


_LINE_COLUMNS = (
    "source",
    "kind",
    "job_id",
    "owner",
    "team",
    "provider",
    "period_start",
    "seconds",
    "rate_per_hour",
    "amount",
    "updated_at",
)


class _InstanceLine(NamedTuple):
    """What a roll-up reads of an instance (and its job): the shape of the roll-up query's rows."""

    id: int | None
    job_id: str | None
    provider: str
    price_per_hour: float
    launched_at: float
    ended_at: float | None
    owner: str | None
    team: str | None


def roll_up_recent(ctx: EngineContext, *, scope: tuple[set[str], set[str]] | None = None) -> None:
    """The periodic roll-up: what billed since this process's last one (its first rewrites whole lines:
    a process does not know what an earlier one left; the following ones rewrite only the recent days).

    ``scope`` = (owners, teams): only their instances and volumes, and the process's last roll-up time
    is left as it was (the tick keeps budgeted people's lines current between full roll-ups)."""
    mem = ctx.memory
    now = ctx.now()
    last = mem.last_rollup if mem.last_rollup is not None else now - 2 * DAY
    lines_from = last - 3600 if mem.rolled_up_once else None
    with ctx.session() as s:
        roll_up(s, now, since=last - 3600, lines_from=lines_from, scope=scope, rolled=mem.rolled_sources)
        s.commit()
    if scope is None:
        mem.last_rollup = now
        mem.rolled_up_once = True


def roll_up(
    session: Session,
    now: float,
    *,
    since: float | None = None,
    job_id: str | None = None,
    lines_from: float | None = None,
    scope: tuple[set[str], set[str]] | None = None,
    rolled: set[str] | None = None,
    job_rows: tuple[Job, list[Instance]] | None = None,
) -> int:
    """Rewrite the ledger lines of every instance and volume that billed after ``since``.

    ``since`` defaults to two days ago: older lines are final. ``job_id`` rolls up only that job's
    instances (what finishing a job needs: its cost is independent of the rest of the ledger).
    ``lines_from``: day lines that start before this day are final and left alone (an incremental
    roll-up after a full one; None rewrites every line from launch). ``scope`` = (owners, teams): only
    the instances of their jobs and the owners' volumes. ``rolled``: the sources whose lines before
    ``lines_from`` are already written (others get all their lines; every source rolled is added).
    ``job_rows`` = (job, its instances from job_instances): with ``job_id``, the rows the caller holds
    (read under the job's lock) instead of reading them again.
    Only lines whose figures changed are written.
    Returns the number of sources rolled. Commits nothing: the caller owns the transaction.
    """
    since = now - 2 * DAY if since is None else since
    first_day = day_start(lines_from) if lines_from is not None else None
    insts = _billing_instances(session, since, job_id=job_id, scope=scope, job_rows=job_rows)
    vols = [] if job_id is not None else _billing_volumes(session, since, scope=scope)
    wanted = _day_lines(insts, vols, now, first_day=first_day, rolled=rolled)
    if rolled is not None and scope is None and job_id is None:
        # A source that stopped billing before ``since`` never comes back: forgotten (a long-lived bot
        # would otherwise keep one entry for every instance and volume it ever rolled up).
        rolled.intersection_update(k[0] for k in wanted)
    if not wanted:
        return len(insts) + len(vols)
    always = _growing_lines(insts, now, first_day=first_day, rolled=rolled)
    existing = _stored_lines(session, wanted, always)
    _upsert_lines(session, _changed_lines(wanted, existing, always))
    if rolled is not None:
        rolled.update(k[0] for k in wanted)
    return len(insts) + len(vols)


def _billing_instances(
    session: Session,
    since: float,
    *,
    job_id: str | None,
    scope: tuple[set[str], set[str]] | None,
    job_rows: tuple[Job, list[Instance]] | None,
) -> Sequence[Any]:
    """The instances (with their job's owner and team) that billed after ``since``, in id order: every
    process writes the lines in one order, so two never deadlock. With ``job_rows`` (and ``job_id``,
    without ``scope``), the caller's rows instead of a query."""
    if job_rows is not None and job_id is not None and scope is None:
        job, rows = job_rows
        return [
            _InstanceLine(
                r.id, r.job_id, r.provider, r.price_per_hour, r.launched_at, r.ended_at, job.owner, job.team
            )
            for r in sorted(rows, key=lambda r: r.id or 0)
            if r.job_id == job_id and (r.ended_at is None or r.ended_at >= since)
        ]
    iq = (
        select(
            Instance.id,
            Instance.job_id,
            Instance.provider,
            Instance.price_per_hour,
            Instance.launched_at,
            Instance.ended_at,
            Job.owner,
            Job.team,
        )
        .join(Job, Job.id == Instance.job_id, isouter=True)
        .where(or_(Instance.ended_at.is_(None), Instance.ended_at >= since))
        .order_by(Instance.id)
    )
    if job_id is not None:
        iq = iq.where(Instance.job_id == job_id)
    if scope is not None:
        iq = iq.where(or_(Job.owner.in_(sorted(scope[0])), Job.team.in_(sorted(scope[1]))))
    return session.execute(iq).all()


def _billing_volumes(
    session: Session, since: float, *, scope: tuple[set[str], set[str]] | None
) -> Sequence[Any]:
    """The volumes that billed after ``since`` (only the scope's owners' ones; none for a team-only scope)."""
    if scope is not None and not scope[0]:
        return []
    return session.execute(
        select(
            VolumeRecord.provider,
            VolumeRecord.volume_id,
            VolumeRecord.owner,
            VolumeRecord.size_gb,
            VolumeRecord.price_per_gb_month,
            VolumeRecord.first_seen_at,
            VolumeRecord.deleted_at,
        ).where(
            or_(VolumeRecord.deleted_at.is_(None), VolumeRecord.deleted_at >= since),
            VolumeRecord.owner.in_(sorted(scope[0])) if scope is not None else true(),
        )
    ).all()


def _day_lines(
    insts: Sequence[Any],
    vols: Sequence[Any],
    now: float,
    *,
    first_day: float | None,
    rolled: set[str] | None,
) -> dict[tuple[str, float], dict[str, Any]]:
    """The ledger lines these instances and volumes should have, by (source, day start)."""
    wanted: dict[tuple[str, float], dict[str, Any]] = {}

    def add(source: str, kind: str, start: float, end: float, rate_h: float, **who: Any) -> None:
        # A source this process has not rolled up yet gets all its lines, whatever lines_from says: a row
        # recorded since (by another process, an adoption billed from the provider's creation time) may
        # bill from days ago.
        lo = (
            start
            if first_day is None or (rolled is not None and source not in rolled)
            else max(start, first_day)
        )
        for d0, t0, t1 in _split_by_day(lo, end):
            wanted[(source, d0)] = {
                "source": source,
                "kind": kind,
                "job_id": who.get("job_id"),
                "owner": who.get("owner"),
                "team": who.get("team"),
                "provider": who.get("provider"),
                "period_start": d0,
                "seconds": t1 - t0,
                "rate_per_hour": rate_h,
                "amount": cost(t0, t1, rate_h, now),
                "updated_at": now,
            }

    for i in insts:
        end = i.ended_at if i.ended_at is not None else now
        add(
            f"instance:{i.id}",
            "compute",
            i.launched_at,
            end,
            i.price_per_hour,
            job_id=i.job_id,
            owner=i.owner,
            team=i.team,
            provider=i.provider,
        )
    for v in vols:
        end = v.deleted_at if v.deleted_at is not None else now
        rate_h = storage_rate_per_hour(v.size_gb, v.price_per_gb_month)
        add(
            f"volume:{v.provider}:{v.volume_id}",
            "storage",
            v.first_seen_at,
            end,
            rate_h,
            owner=v.owner,
            provider=v.provider,
        )
    return wanted


def _growing_lines(
    insts: Sequence[Any], now: float, *, first_day: float | None, rolled: set[str] | None
) -> set[tuple[str, float]]:
    """An open instance's newest line grows on every roll-up: written without reading it first (only in
    an incremental roll-up, and for sources this process has rolled before)."""
    if first_day is None:
        return set()
    return {
        (f"instance:{i.id}", day_start(now))
        for i in insts
        if i.ended_at is None and (rolled is None or f"instance:{i.id}" in rolled)
    }


def _stored_lines(
    session: Session, wanted: dict[tuple[str, float], dict[str, Any]], always: set[tuple[str, float]]
) -> dict[tuple[str, float], tuple[Any, ...]]:
    """The stored figures of the lines that may be unchanged (ended instances, volumes, older days)."""
    sources = sorted({k[0] for k in wanted if k not in always})
    cols = (
        SpendEntry.source,
        SpendEntry.period_start,
        SpendEntry.seconds,
        SpendEntry.amount,
        SpendEntry.rate_per_hour,
        SpendEntry.owner,
        SpendEntry.team,
        SpendEntry.job_id,
    )
    if not sources:
        return {}
    if len(sources) <= 500:
        q = select(*cols).where(SpendEntry.source.in_(sources))
    else:  # one range scan of the period index instead of thousands of IN lists
        q = select(*cols).where(SpendEntry.period_start >= min(k[1] for k in wanted if k not in always))
    return {(r[0], r[1]): tuple(r[2:]) for r in session.execute(q)}


def _changed_lines(
    wanted: dict[tuple[str, float], dict[str, Any]],
    existing: dict[tuple[str, float], tuple[Any, ...]],
    always: set[tuple[str, float]],
) -> list[dict[str, Any]]:
    """The lines to write: the growing ones and those whose figures differ from the stored ones, in one
    order in every process."""
    changed = [
        line
        for key, line in wanted.items()
        if key in always
        or existing.get(key)
        != (
            line["seconds"],
            line["amount"],
            line["rate_per_hour"],
            line["owner"],
            line["team"],
            line["job_id"],
        )
    ]
    changed.sort(key=lambda line: (line["source"], line["period_start"]))
    return changed
