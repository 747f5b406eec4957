"""Whether a job may start renting: spent budgets refuse it, the per-user running limit makes it wait.

Checked where money starts to be committed, whatever the door: when a job is created (a refusal, with
the budget's name and who can raise it, or the limit) and when a launch claims it (an approved job whose
budget is spent meanwhile is cancelled; one over the running limit stays approved until a slot frees; a
relaunch after a preemption whose budget is spent stops). Creations of one person are serialized by a
per-owner lock held while counting and inserting, so twelve concurrent launches cannot all pass a
count of zero.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from sqlalchemy import func, select, text, update

from bot.engine.money import budgets as budgets_mod
from bot.engine.record.jobstate import ACTIVE, RENTING, JobState
from store.models import Job

if TYPE_CHECKING:
    from collections.abc import Collection

    from sqlmodel import Session

    from bot.engine.context import EngineContext
    from store.models import Job as JobRow


def lock_owner(session: Session, owner: str) -> None:
    """Serialize decisions about one person's jobs until this transaction ends.

    PostgreSQL: a transaction-scoped advisory lock keyed by the owner. SQLite: a no-op write takes the
    database's write lock (the busy timeout makes the other writer wait), like states.lock_job."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Job)
            .where(Job.id == "")
            .values(updated_at=Job.updated_at)
            .execution_options(synchronize_session=False)
        )
        return
    key = int.from_bytes(hashlib.sha256(f"owner:{owner}".encode()).digest()[:8], "big", signed=True)
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def running_count(
    session: Session, owner: str, states: Collection[str], *, besides: str | None = None
) -> int:
    q = select(func.count()).select_from(Job).where(Job.owner == owner, Job.state.in_(states))
    if besides is not None:
        q = q.where(Job.id != besides)
    return int(session.execute(q).scalar_one())


def budget_refusal(ctx: EngineContext, *, owner: str, team: str | None) -> str | None:
    """Why a new launch for this owner and team is refused by a spent budget, or None."""
    spent = budgets_mod.spent_budgets(ctx, owner=owner, team=team)
    if not spent:
        return None
    first = spent[0]
    return (
        f"{first.describe()}: new launches are refused until it is raised; "
        f"{first.how_to_raise(ctx.policy.who_raises_budgets(), ctx.policy.budget_command())}"
    )


def check_budgets(ctx: EngineContext, *, owner: str, team: str | None) -> None:
    """Raise when a spent budget covers a new job of this owner and team (before any lock is taken:
    it rolls their spend up first, in its own transaction)."""
    from bot.engine.api import EngineError

    refusal = budget_refusal(ctx, owner=owner, team=team)
    if refusal:
        raise EngineError(refusal)


def check_running(ctx: EngineContext, session: Session, *, owner: str) -> None:
    """Raise when ``owner`` runs as many jobs as one person may (call under ``lock_owner``)."""
    from bot.engine.api import EngineError

    # An approved job launches at once: it counts as running already.
    decision = ctx.policy.can_run_another(owner, running_count(session, owner, ACTIVE))
    if not decision:
        raise EngineError(decision.reason)


def launch_blocker(ctx: EngineContext, job: JobRow) -> tuple[str, str] | None:
    """("budget", why) when a spent budget refuses this launch, ("limit", why) when it must wait for a
    running slot, else None. Relaunches (recovering) are not counted again: the job already runs.
    Opens its own sessions: call it before the claim's transaction."""
    refusal = budget_refusal(ctx, owner=job.owner, team=job.team)
    if refusal:
        return "budget", refusal
    if job.state == JobState.APPROVED:
        with ctx.session() as s:
            running = running_count(s, job.owner, RENTING, besides=job.id)
        decision = ctx.policy.can_run_another(job.owner, running)
        if not decision:
            return "limit", f"waiting to launch: {decision.reason}"
    return None
