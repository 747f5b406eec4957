"""The job state machine: which transitions exist, and the one function that performs them.

A transition is a conditional ``UPDATE jobs SET state = :to WHERE id = :id AND state IN (:from)``
plus an audit row, in one transaction. The condition is the concurrency guard: of fifty threads (or
bot replicas) approving or launching the same job, exactly one sees a row change; the others get
False and do nothing. Nothing that costs money happens before its claiming transition has committed.
A transition into a final state also records the job's spend (bot/engine/record/spend.py), whatever the path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select, update
from sqlmodel import Session

from bot.engine.record.jobstate import ACTIVE, FINAL, OPEN, JobState
from bot.engine.record.spend import job_spend
from store.models import AuditLog, Job, JobRun

PENDING_APPROVAL = JobState.PENDING_APPROVAL
APPROVED = JobState.APPROVED
LAUNCHING = JobState.LAUNCHING
RUNNING = JobState.RUNNING
RECOVERING = JobState.RECOVERING
SUCCEEDED = JobState.SUCCEEDED
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED
STOPPED = JobState.STOPPED

ALL_STATES = frozenset(JobState)
__all__ = [
    "ACTIVE",
    "ALL_STATES",
    "FINAL",
    "OPEN",
    "JobState",
    "allowed",
    "audit",
    "changes_since",
    "lock_job",
    "transition",
]

TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING_APPROVAL: frozenset({APPROVED, CANCELLED}),
    APPROVED: frozenset({LAUNCHING, CANCELLED}),
    # launching -> recovering: the launch failed transiently (capacity, price); retried on a tick.
    # launching -> pending_approval: only a pricier offer than the approved one is left (asked again).
    LAUNCHING: frozenset({RUNNING, RECOVERING, FAILED, STOPPED, CANCELLED, PENDING_APPROVAL}),
    # running -> pending_approval: out of memory, and the bigger GPU costs more than the cap
    # (bot/engine/watching/grow.py)
    RUNNING: frozenset({RECOVERING, SUCCEEDED, FAILED, STOPPED, PENDING_APPROVAL}),
    RECOVERING: frozenset({LAUNCHING, RUNNING, FAILED, STOPPED, SUCCEEDED}),
    # `resume`: a stopped or failed job runs again from its checkpoint (bot/engine/control/resume.py)
    STOPPED: frozenset({APPROVED, PENDING_APPROVAL}),
    FAILED: frozenset({APPROVED, PENDING_APPROVAL}),
}


# The states in which a job has a current run (bot/engine/record/runs.py); leaving them ends it.
RUN_STATES = frozenset({LAUNCHING, RUNNING})


class IllegalTransition(ValueError):
    """A transition that the state machine does not allow (a programming error)."""


def allowed(src: str, dst: str) -> bool:
    return dst in TRANSITIONS.get(src, frozenset())


def audit(
    session: Session, *, actor: str, action: str, job_id: str | None, at: float | None = None, **details: Any
) -> None:
    """Add an audit record to the current transaction."""
    session.add(
        AuditLog(
            at=time.time() if at is None else at, actor=actor, action=action, job_id=job_id, details=details
        )
    )


def transition(
    session: Session,
    job_id: str,
    src: str | Iterable[str],
    dst: str,
    *,
    actor: str,
    now: float,
    reason: str | None = None,
    commit: bool = True,
    spend: float | None = None,
    **fields: Any,
) -> bool:
    """Move the job from one of ``src`` to ``dst`` if it is still there; True when this call did it.

    Extra keyword arguments are columns set in the same UPDATE (e.g. ``approved_by``, ``claim_id``).
    Into a final state, the job's ``spend`` is derived here, once the row is ours (locked by the UPDATE):
    the sum of its instances' billed seconds x locked prices, on every path (finish, retry budget, price).
    A caller that holds the row's lock (``lock_job``) since before it read the spend passes it as ``spend``:
    it is then written in the same UPDATE, with no second read.
    """
    sources = [src] if isinstance(src, str) else list(src)
    for s in sources:
        if not allowed(s, dst):
            raise IllegalTransition(f"{s} -> {dst} is not a job transition")
    values = {"state": dst, "updated_at": now, **fields}
    if dst in FINAL and spend is not None:
        values["spend"] = spend
    ends_run = dst not in RUN_STATES and any(s in RUN_STATES for s in sources)
    if ends_run:  # the current run ends with it: nothing it signs counts any more (bot/engine/record/runs.py)
        values.update(run_id=None, token_hash=None)
    result = session.execute(update(Job).where(Job.id == job_id, Job.state.in_(sources)).values(**values))
    if result.rowcount != 1:
        if commit:
            session.rollback()
        return False
    if ends_run:
        session.execute(
            update(JobRun)
            .where(JobRun.job_id == job_id, JobRun.ended_at.is_(None))
            .values(ended_at=now, end_reason=(reason or str(dst))[:200])
        )
    if dst in FINAL:
        if spend is None:
            spend = job_spend(session, job_id, now)
            session.execute(update(Job).where(Job.id == job_id).values(spend=spend))
        fields = {**fields, "spend": round(spend, 6)}
    audit(
        session,
        actor=actor,
        action=f"transition:{'|'.join(sources)}->{dst}",
        job_id=job_id,
        at=now,
        reason=reason,
        **{k: v for k, v in fields.items() if k not in {"token_hash"}},
    )
    if commit:
        session.commit()
    return True


def lock_job(session: Session, job_id: str) -> Job | None:
    """The job's row, locked until this transaction ends, so processes deciding about one job take turns.

    PostgreSQL: SELECT ... FOR UPDATE. SQLite has no row locks: a no-op write takes the database's write
    lock, which serializes the same way (its busy timeout waits for the other writer).
    """
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(updated_at=Job.updated_at)
            .execution_options(synchronize_session=False)
        )
    return (
        session.execute(
            select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
        )
        .scalars()
        .first()
    )


def changes_since(
    session: Session, after: int | None, *, limit: int = 1000
) -> tuple[int, list[tuple[int, str, str, str | None]], bool]:
    """What happened to jobs after audit row ``after``, read back from the audit log by its primary key (no
    scan): ``(id, job_id, what, state)`` oldest first, ``what`` "created" (a create row), "resumed" (a resume
    row) or "state" (a transition, ``state`` its destination); with the newest row id read, the next call's
    ``after``, and whether the read stopped at ``limit`` rows (of every action: the cursor passes the others
    too). ``after`` None: no rows, only the newest id (where a reader starts)."""
    if after is None:
        return int(session.execute(select(func.max(AuditLog.id))).scalar() or 0), [], False
    rows = session.execute(
        select(AuditLog.id, AuditLog.job_id, AuditLog.action)
        .where(AuditLog.id > after)
        .order_by(AuditLog.id)
        .limit(limit)
    ).all()
    out: list[tuple[int, str, str, str | None]] = []
    for row_id, job_id, action in rows:
        if not job_id:
            continue
        if action == "create":
            out.append((row_id, job_id, "created", None))
        elif action == "resume":
            out.append((row_id, job_id, "resumed", None))
        elif action.startswith("transition:") and "->" in action:
            out.append((row_id, job_id, "state", action.rsplit("->", 1)[1]))
    return (rows[-1][0] if rows else after), out, len(rows) >= limit
