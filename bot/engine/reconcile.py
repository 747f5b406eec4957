"""The reconciler: each provider's labelled instances against the database, fixed both ways.

- at the provider, in the database, open: refresh its status; terminate it if its job is finished;
- at the provider, not in the database, job active without an instance: adopt it (a crash between
  the create call and the commit, or a create call that errored although the instance exists);
- at the provider, not in the database, otherwise (no such job, job finished, job already has an
  instance): terminate it, a stray or a duplicate (a job never keeps two);
- in the database, open, not at the provider: lost; closed as gone (the monitor then recovers the job).

A provider whose listing fails is skipped for this pass: nothing is decided from a failed call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select

from bot.engine import states as S
from bot.engine.finish import close_instance, terminate_instance
from bot.engine.launch import record_instance
from bot.providers.base import GONE_STATUSES, Instance, ProviderError
from store.models import Instance as InstanceRow
from store.models import Job

if TYPE_CHECKING:
    from bot.engine.service import Engine

log = logging.getLogger(__name__)
ADOPTABLE = (S.LAUNCHING, S.RUNNING, S.RECOVERING, S.APPROVED)


@dataclass
class ReconcileReport:
    seen: int = 0
    adopted: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)  # strays and duplicates
    lost: list[str] = field(default_factory=list)
    finished_terminated: list[str] = field(default_factory=list)
    skipped_providers: list[str] = field(default_factory=list)


def reconcile(eng: Engine) -> ReconcileReport:
    report = ReconcileReport()
    for name, provider in eng.providers.items():
        listed_at = eng.now()
        try:
            listed = [i for i in provider.list_instances() if i.status not in GONE_STATUSES]
        except ProviderError as exc:
            log.warning("reconcile: listing %s failed (%s); skipped this pass", name, exc)
            report.skipped_providers.append(name)
            continue
        _reconcile_provider(eng, name, listed, report, listed_at)
    return report


def _reconcile_provider(
    eng: Engine, name: str, listed: list[Instance], report: ReconcileReport, listed_at: float
) -> None:
    report.seen += len(listed)
    now = eng.now()
    with eng.session() as s:
        rows = list(
            s.execute(
                select(InstanceRow).where(InstanceRow.provider == name, InstanceRow.ended_at.is_(None))
            ).scalars()
        )
        by_pid = {r.provider_instance_id: r for r in rows}
        job_ids = {i.job_id for i in listed if i.job_id} | {r.job_id for r in rows if r.job_id}
        jobs: dict[str, Job] = {}
        ids = list(job_ids)
        for k in range(0, len(ids), 500):
            for j in s.execute(select(Job).where(Job.id.in_(ids[k : k + 500]))).scalars():
                jobs[j.id] = j
        open_by_job: dict[str, list[InstanceRow]] = {}
        for r in s.execute(select(InstanceRow).where(InstanceRow.ended_at.is_(None))).scalars():
            if r.job_id:
                open_by_job.setdefault(r.job_id, []).append(r)
    listed_ids = {i.instance_id for i in listed}
    to_terminate: list[tuple[InstanceRow, str]] = []
    for inst in listed:
        row = by_pid.get(inst.instance_id)
        job = jobs.get(inst.job_id) if inst.job_id else None
        if row is not None:
            if row.status != str(inst.status):
                with eng.session() as s:
                    r = s.get(InstanceRow, row.id)
                    if r is not None:
                        r.status, r.raw_status, r.last_seen_at = str(inst.status), inst.raw_status, now
                        s.commit()
            if job is None or job.state in S.FINAL or job.state == S.PENDING_APPROVAL:
                to_terminate.append((row, "job finished"))
            continue
        if not inst.job_id:
            continue  # not labelled as ours: never touched
        others = open_by_job.get(inst.job_id, [])
        if job is not None and job.state in ADOPTABLE and not others:
            adopted = _adopt(eng, name, job.id, inst)
            if adopted is not None:
                new_row, mine = adopted
                open_by_job[inst.job_id] = [new_row]
                if mine:
                    report.adopted.append(inst.instance_id)
                continue
        why = "duplicate" if (job is not None and job.state in ADOPTABLE) else "stray"
        temp = InstanceRow(
            provider=name,
            provider_instance_id=inst.instance_id,
            job_id=inst.job_id,
            label=inst.label,
            price_per_hour=inst.price_per_hour or 0.0,
            launched_at=now,
        )
        to_terminate.append((temp, why))
    for row, why in to_terminate:
        if row.id is None:
            # Not ours in the books: terminate and record it (audited, zero-length so spend stays exact).
            provider = eng.providers[name]
            try:
                provider.terminate(row.provider_instance_id)
            except ProviderError as exc:
                log.warning("reconcile: terminating %s %s failed: %s", why, row.provider_instance_id, exc)
                continue
            with eng.session() as s:
                S.audit(
                    s,
                    actor="reconciler",
                    action=f"terminate-{why}",
                    job_id=row.job_id,
                    at=now,
                    provider=name,
                    instance_id=row.provider_instance_id,
                )
                s.commit()
            report.terminated.append(row.provider_instance_id)
        elif terminate_instance(eng, row, reason=why, actor="reconciler"):
            report.finished_terminated.append(row.provider_instance_id)
    for pid, row in by_pid.items():
        # A row committed after the listing started may simply not be listed yet.
        if pid not in listed_ids and row.launched_at < listed_at - eng.lost_grace_s:
            close_instance(eng, row, reason="lost", actor="reconciler", at=row.last_seen_at or now)
            report.lost.append(pid)


def _adopt(eng: Engine, name: str, job_id: str, inst: Instance) -> tuple[InstanceRow, bool] | None:
    """Record ``inst`` as the job's instance, deciding under the job's row lock (processes take turns).

    Returns (row, adopted by this call), or None when the job may not have it any more (it ended, or it
    has another open instance by now): the caller then treats ``inst`` as a stray or a duplicate.
    """
    with eng.session() as s:
        j = S.lock_job(s, job_id)
        if j is None or j.state not in ADOPTABLE:
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
