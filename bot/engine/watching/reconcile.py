"""The reconciler: each provider's labelled instances against the database, fixed both ways.

- at the provider, in the database, open: refresh its status; terminate it if its job is finished;
- at the provider, not in the database, job active without an instance: adopt it (a crash between
  the create call and the commit, or a create call that errored although the instance exists);
- at the provider, not in the database, otherwise (no such job, job finished, job already has an
  instance): terminate it, a stray or a duplicate (a job never keeps two);
- in the database, open, not at the provider: lost; closed as gone (the monitor then recovers the job).

A provider whose listing fails is skipped for this pass: nothing is decided from a failed call. The pass never
raises: a step that fails for one instance or job is logged and named in the report's ``errors``, and the
others go on (issue 38: one broken job made `tunebot reconcile` print a traceback and stop).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlmodel import Session

from bot.engine.launching.launch import record_instance
from bot.engine.outcome.finish import close_instance, terminate_instance
from bot.engine.record import states as S
from bot.providers.base import GONE_STATUSES, Instance, ProviderError
from store.db import update_each, update_in
from store.models import Instance as InstanceRow
from store.models import Job

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    seen: int = 0
    adopted: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)  # strays and duplicates
    lost: list[str] = field(default_factory=list)
    finished_terminated: list[str] = field(default_factory=list)
    skipped_providers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "job J: what failed: why", one per failed step

    def failed(self, job_id: str | None, what: str, exc: BaseException) -> None:
        """Log and keep one failed step (never raised: the pass goes on with the others)."""
        log.warning("reconcile: %s for job %s failed", what, job_id, exc_info=exc)
        self.errors.append(f"job {job_id or '-'}: {what} failed: {type(exc).__name__}: {exc}"[:500])


def reconcile(eng: EngineContext) -> ReconcileReport:
    """One pass: one listing per provider, one read of the open rows and job states (only the columns
    it needs), one transaction for the status refreshes and lost rows; provider calls (terminating
    strays) and adoptions, which are rare, happen after it, each on its own. Never raises: what failed is
    in the report's ``errors``."""
    report = ReconcileReport()
    listings: dict[str, tuple[list[Instance], float]] = {}
    for name, provider in eng.supervisable.items():
        listed_at = eng.now()
        try:
            listed = [i for i in provider.list_instances() if i.status not in GONE_STATUSES]
        except Exception as exc:  # noqa: BLE001 - a cloud that fails is skipped, the others go on
            log.warning("reconcile: listing %s failed (%s); skipped this pass", name, exc)
            report.skipped_providers.append(name)
            if not isinstance(exc, ProviderError):
                report.failed(None, f"listing {name}", exc)
            continue
        listings[name] = (listed, listed_at)
    if not listings:
        return report
    try:
        plan = _plan(eng, listings, report)
    except Exception as exc:  # noqa: BLE001 - the database failed: nothing decided this pass
        report.failed(None, "reading the open instances", exc)
        return report
    _carry_out(eng, plan, report)
    return report


def _plan(
    eng: EngineContext, listings: dict[str, tuple[list[Instance], float]], report: ReconcileReport
) -> _Plan:
    """What the pass does, decided from the listings and one read of the open rows; the status refreshes
    written in the same transaction."""
    now = eng.now()
    with eng.session() as s:
        rows = [
            _OpenRow(*r)
            for r in s.execute(
                select(
                    InstanceRow.id,
                    InstanceRow.provider,
                    InstanceRow.provider_instance_id,
                    InstanceRow.job_id,
                    InstanceRow.status,
                    InstanceRow.launched_at,
                    InstanceRow.last_seen_at,
                    InstanceRow.price_per_hour,
                ).where(InstanceRow.ended_at.is_(None))
            )
        ]
        open_by_job: dict[str, list[_OpenRow]] = {}
        for r in rows:
            if r.job_id:
                open_by_job.setdefault(r.job_id, []).append(r)
        job_ids = sorted({i.job_id for ls, _ in listings.values() for i in ls if i.job_id} | set(open_by_job))
        states: dict[str, str] = {}
        for k in range(0, len(job_ids), 1000):
            states.update(s.execute(select(Job.id, Job.state).where(Job.id.in_(job_ids[k : k + 1000]))).all())
        plan = _Plan()
        for name, (listed, listed_at) in listings.items():
            by_pid = {r.provider_instance_id: r for r in rows if r.provider == name}
            _plan_provider(eng, name, listed, listed_at, now, by_pid, states, open_by_job, plan, report)
        _write(s, plan, now)
        s.commit()
    plan.now = now
    return plan


def _carry_out(eng: EngineContext, plan: _Plan, report: ReconcileReport) -> None:
    """The pass's provider calls and per-job steps, each on its own: one that fails is reported, the
    others go on."""
    now = plan.now
    for row in plan.lost:  # closed one by one: each under its job's lock (a final job's spend follows)
        try:
            close_instance(eng, _as_model(row), reason="lost", actor="reconciler", at=row.last_seen_at or now)
            report.lost.append(row.provider_instance_id)
        except Exception as exc:  # noqa: BLE001
            report.failed(row.job_id, f"closing lost instance {row.provider_instance_id}", exc)
    for name, inst, state in plan.adopt:
        try:
            adopted = _adopt(eng, name, inst.job_id or "", inst)
        except Exception as exc:  # noqa: BLE001
            report.failed(inst.job_id, f"adopting {name} instance {inst.instance_id}", exc)
            continue
        if adopted is None:  # ended, or has another instance by now: a stray or a duplicate
            plan.strays.append((name, inst, "duplicate" if state in S.ACTIVE else "stray"))
        elif adopted[1]:
            report.adopted.append(inst.instance_id)
    for row, why in plan.terminate:
        try:
            if terminate_instance(eng, row, reason=why, actor="reconciler"):
                report.finished_terminated.append(row.provider_instance_id)
        except Exception as exc:  # noqa: BLE001
            report.failed(row.job_id, f"terminating {row.provider_instance_id}", exc)
    for name, inst, why in plan.strays:
        try:
            _terminate_stray(eng, name, inst, why, now, report)
        except Exception as exc:  # noqa: BLE001
            report.failed(inst.job_id, f"terminating {why} {inst.instance_id}", exc)


@dataclass
class _OpenRow:
    id: int
    provider: str
    provider_instance_id: str
    job_id: str | None
    status: str
    launched_at: float
    last_seen_at: float | None
    price_per_hour: float


@dataclass
class _Plan:
    status: list[dict[str, object]] = field(default_factory=list)  # changed statuses
    seen: list[int] = field(default_factory=list)  # listed, status unchanged: last_seen_at only
    lost: list[_OpenRow] = field(default_factory=list)
    adopt: list[tuple[str, Instance, str]] = field(default_factory=list)
    terminate: list[tuple[InstanceRow, str]] = field(default_factory=list)  # ours, job finished
    strays: list[tuple[str, Instance, str]] = field(default_factory=list)  # no row: stray | duplicate
    now: float = 0.0  # when the open rows were read


def _plan_provider(
    eng: EngineContext,
    name: str,
    listed: list[Instance],
    listed_at: float,
    now: float,
    by_pid: dict[str, _OpenRow],
    states: dict[str, str],
    open_by_job: dict[str, list[_OpenRow]],
    plan: _Plan,
    report: ReconcileReport,
) -> None:
    report.seen += len(listed)
    listed_ids = {i.instance_id for i in listed}
    for inst in listed:
        row = by_pid.get(inst.instance_id)
        state = states.get(inst.job_id) if inst.job_id else None
        if row is not None:
            if row.status != str(inst.status):
                plan.status.append(
                    {
                        "id": row.id,
                        "status": str(inst.status),
                        "raw_status": inst.raw_status,
                        "last_seen_at": now,
                    }
                )
            else:
                plan.seen.append(row.id)
            if state is None or state in S.FINAL or state == S.PENDING_APPROVAL:
                plan.terminate.append((_as_model(row), "job finished"))
            continue
        if not inst.job_id:
            continue  # not labelled as ours: never touched
        others = open_by_job.get(inst.job_id, [])
        if state in S.ACTIVE and not others:
            plan.adopt.append((name, inst, state))
            open_by_job[inst.job_id] = [_OpenRow(-1, name, inst.instance_id, inst.job_id, "", now, now, 0.0)]
            continue
        why = "duplicate" if state in S.ACTIVE else "stray"
        plan.strays.append((name, inst, why))
    for pid, row in by_pid.items():
        # A row committed after the listing started may simply not be listed yet.
        if pid not in listed_ids and row.launched_at < listed_at - eng.limits.lost_grace_s:
            plan.lost.append(row)


def _write(s: Session, plan: _Plan, now: float) -> None:
    """The pass's database changes, batched: executemany for statuses, IN lists for the rest."""
    update_each(s, InstanceRow, plan.status)
    update_in(s, InstanceRow, plan.seen, last_seen_at=now)


def _as_model(row: _OpenRow) -> InstanceRow:
    return InstanceRow(
        id=row.id,
        provider=row.provider,
        provider_instance_id=row.provider_instance_id,
        job_id=row.job_id,
        status=row.status,
        launched_at=row.launched_at,
        last_seen_at=row.last_seen_at,
        price_per_hour=row.price_per_hour,
    )


def _terminate_stray(
    eng: EngineContext, name: str, inst: Instance, why: str, now: float, report: ReconcileReport
) -> None:
    """Not ours in the books: terminate and audit it (no row, so spend stays exact)."""
    try:
        eng.supervisable[name].terminate(inst.instance_id)
    except ProviderError as exc:
        log.warning("reconcile: terminating %s %s failed: %s", why, inst.instance_id, exc)
        return
    with eng.session() as s:
        S.audit(
            s,
            actor="reconciler",
            action=f"terminate-{why}",
            job_id=inst.job_id,
            at=now,
            provider=name,
            instance_id=inst.instance_id,
        )
        s.commit()
    report.terminated.append(inst.instance_id)


def _adopt(eng: EngineContext, name: str, job_id: str, inst: Instance) -> tuple[InstanceRow, bool] | None:
    """Record ``inst`` as the job's instance, deciding under the job's row lock (processes take turns).

    Returns (row, adopted by this call), or None when the job may not have it any more (it ended, or it
    has another open instance by now): the caller then treats ``inst`` as a stray or a duplicate.
    """
    with eng.session() as s:
        j = S.lock_job(s, job_id)
        if j is None or j.state not in S.ACTIVE:
            s.rollback()
            return None
        open_rows = list(
            s.execute(
                select(InstanceRow).where(InstanceRow.job_id == job_id, InstanceRow.ended_at.is_(None))
            ).scalars()
        )
        same = [r for r in open_rows if (r.provider, r.provider_instance_id) == (name, inst.instance_id)]
        if same:
            s.rollback()
            return same[0], False  # another process adopted it a moment ago
        if open_rows:
            s.rollback()
            return None
        price = inst.price_per_hour if inst.price_per_hour is not None else (j.price_per_hour or 0.0)
        row = record_instance(eng, s, j, inst, price, j.offer, adopted=True)
        s.commit()
        return row, True
