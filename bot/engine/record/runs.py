"""Runs: each launch of a job has its own key, folder and credentials, and ends for good.

A run is one launch of a job: the first start, a relaunch after a preemption, a resume, growth to a bigger
GPU, a start retried on another host. Whatever an instance got (environment, key, credentials) stays with its
host's owner after the instance is gone (../shared/docs/security.md), so nothing of one run may act for the
next:

- **Key.** Each run has a random secret kept here (``job_runs.secret``); its key is derived from the master
  key, the job id, the run id and that secret (bot/engine/launching/integrity.py ``run_key``). The bot accepts
  events, checkpoints and outputs signed with the key of the job's *current* run only (``jobs.run_id``); a run
  stops being current when its job leaves launching/running (bot/engine/record/states.py ``transition`` ends
  it, in the same UPDATE: preempted, start timeout, growth, finished, stopped, failed) or a new launch
  replaces it. The report token goes with it.
- **Folder.** A run writes only under ``<job folder>/runs/<run id>/``: its checkpoints and progress object
  (``checkpoints/``), its output (``output/``) and the credentials the bot renews for it. Its storage
  credentials reach that folder, its inputs and - read-only - the checkpoints it resumes from
  (bot/storage/scope.py): a host of an earlier run cannot read or write the next run's folder where the
  store scopes credentials, and cannot read what is left there for the next run where it does not (sealed:
  runner/contract/sealed.py).
- **Checkpoints.** A checkpoint counts only once acknowledged: announced by a signed event of the run that
  wrote it while that run was current, with its manifest's SHA-256 (``run_checkpoints``). A new run is told
  which ones to resume from (``JobSpec.resume``, newest first, pinned by those digests); a checkpoint a
  former host signs afterwards, or a manifest it rewrites, is never loaded.
- **Output.** The output a run reported in its signed terminal event, with its manifest's digest
  (``job_runs.output_*``), is what the bot pushes to the Hub (bot/engine/outcome/hub_push.py).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update

from bot.engine.record import states as S
from store.db import insert_for
from store.models import Job, JobRun, RunCheckpoint

if TYPE_CHECKING:
    from sqlmodel import Session

    from bot.engine.context import EngineContext
    from runner.contract.spec import RunnerEvent

RUNS_DIR = "runs"
RESUME_POINTS = 2  # the newest acknowledged checkpoints a run may resume from (an older one if one fails)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def run_root(job_root: str, run_id: str) -> str:
    """A run's own folder under its job's folder."""
    return f"{job_root.rstrip('/')}/{RUNS_DIR}/{run_id}"


def checkpoint_folder(root: str) -> str:
    return f"{root}/checkpoints"


def output_folder(root: str) -> str:
    return f"{root}/output"


def resume_points(s: Session, job_id: str, limit: int = RESUME_POINTS) -> list[dict[str, Any]]:
    """The job's newest acknowledged checkpoints, newest first, as JobSpec.resume items."""
    rows = s.execute(
        select(RunCheckpoint.uri, RunCheckpoint.step, RunCheckpoint.manifest_sha256)
        .where(RunCheckpoint.job_id == job_id)
        .order_by(RunCheckpoint.step.desc(), RunCheckpoint.acknowledged_at.desc(), RunCheckpoint.id.desc())
        .limit(limit)
    ).all()
    return [{"uri": r.uri, "step": r.step, "manifest_sha256": r.manifest_sha256} for r in rows]


@dataclass(frozen=True)
class Acknowledged:
    uri: str
    step: int


def newest_acknowledged(ctx: EngineContext, job_id: str, *, present: bool = True) -> Acknowledged | None:
    """The job's newest acknowledged checkpoint (what a resume continues from, and a stopped job's result),
    None when it has none. ``present``: only one whose COMPLETE marker is still in storage (a run prunes its
    older checkpoints)."""
    from bot.engine.record import results

    with ctx.session() as s:
        points = resume_points(s, job_id, limit=4)
    for p in points:
        if not present or results.exists(f"{p['uri'].rstrip('/')}/{results.MARKER}"):
            return Acknowledged(p["uri"], p["step"])
    return None


def start(ctx: EngineContext, job_id: str, claim_id: str, job_root: str) -> JobRun | None:
    """The run of this launch, made current (None when the claim is no longer this launch's).

    A new run, unless the job's current run never got an instance (a launch taken over after its process
    died between the create call and recording it: the instance it may have created carries that run's key
    and is adopted by its label). The previous run, if any, ends here. The job's checkpoint folder becomes the
    run's; what this process remembers of the previous progress object is dropped."""
    now = ctx.now()
    with ctx.session() as s:
        job = S.lock_job(s, job_id)
        if job is None or job.state != S.LAUNCHING or job.claim_id != claim_id:
            s.rollback()
            return None
        if job.run_id:
            current = s.get(JobRun, job.run_id)
            if current is not None and current.ended_at is None and current.instance is None:
                s.expunge(current)  # handed back loaded: the rollback would expire it, detached (issue 38)
                s.rollback()
                return current
            s.execute(
                update(JobRun)
                .where(JobRun.id == job.run_id, JobRun.ended_at.is_(None))
                .values(ended_at=now, end_reason="replaced")
            )
        number = (s.execute(select(func.count()).where(JobRun.job_id == job_id)).scalar() or 0) + 1
        run = JobRun(
            id=f"r{number}-{secrets.token_hex(4)}",
            job_id=job_id,
            number=number,
            secret=secrets.token_hex(32),
            created_at=now,
            resume=resume_points(s, job_id),
        )
        s.add(run)
        s.flush()
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                run_id=run.id,
                token_hash=None,
                checkpoint_uri=checkpoint_folder(run_root(job_root, run.id)),
                progress_window=None,
                updated_at=now,
            )
        )
        S.audit(
            s,
            actor="engine",
            action="run-started",
            job_id=job_id,
            at=now,
            run=run.id,
            resume=[p["uri"] for p in run.resume],
        )
        s.commit()
        s.refresh(run)
        s.expunge(run)
    ctx.memory.progress_seen.pop(job_id, None)
    ctx.memory.progress_stat.pop(job_id, None)
    return run


def set_instance(s: Session, run_id: str | None, provider: str, instance_id: str) -> None:
    """Record which instance runs the run (part of the caller's transaction)."""
    if run_id:
        s.execute(
            update(JobRun)
            .where(JobRun.id == run_id, JobRun.instance.is_(None))
            .values(instance=f"{provider}:{instance_id}")
        )


def _under(uri: str | None, folder: str | None) -> bool:
    if not uri or not folder:
        return False
    folder = folder.rstrip("/")
    return uri.startswith(folder + "/") and ".." not in uri.split("/") and "%2e" not in uri.lower()


def acknowledge(
    s: Session,
    job: Any,
    run_id: str,
    events: list[RunnerEvent],
    *,
    output_prefix: str | None,
    now: float,
) -> None:
    """Record what the current run's signed events vouch for (part of the caller's transaction, which holds
    the job's row lock and has checked that ``run_id`` is still the job's current run): each checkpoint in
    the run's checkpoint folder with its manifest's digest, and the output its terminal event names."""
    from runner.contract.spec import EventKind

    folder = job.checkpoint_uri
    for e in events:
        digest = e.manifest_sha256 if e.manifest_sha256 and _SHA256.match(e.manifest_sha256) else None
        if digest is None:
            continue
        saved = (EventKind.checkpoint, EventKind.preempted, EventKind.budget)  # budget: saved at the cap
        if e.kind in saved and _under(e.checkpoint_uri, folder):
            if e.checkpoint_uri != f"{folder.rstrip('/')}/checkpoint-{e.step}":
                continue  # a checkpoint is named by its step
            stmt = insert_for(s, RunCheckpoint).values(
                job_id=job.id,
                run_id=run_id,
                step=e.step,
                uri=e.checkpoint_uri,
                manifest_sha256=digest,
                acknowledged_at=now,
            )
            s.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "run_id", "step"]))
        elif e.kind in (EventKind.finished, EventKind.plateau) and e.output_uri:
            if output_prefix and (e.output_uri.rstrip("/") == output_prefix.rstrip("/")):
                s.execute(
                    update(JobRun)
                    .where(JobRun.id == run_id, JobRun.job_id == job.id)
                    .values(output_uri=e.output_uri, output_manifest_sha256=digest)
                )


def acknowledged(s: Session, job_id: str, uri: str) -> bool:
    """Whether this checkpoint of the job was acknowledged."""
    return (
        s.execute(
            select(RunCheckpoint.id).where(RunCheckpoint.job_id == job_id, RunCheckpoint.uri == uri)
        ).first()
        is not None
    )


def reported_output(ctx: EngineContext, job_id: str) -> JobRun | None:
    """The newest run of the job that reported an output with its manifest's digest."""
    with ctx.session() as s:
        row = (
            s.execute(
                select(JobRun)
                .where(JobRun.job_id == job_id, JobRun.output_manifest_sha256.is_not(None))
                .order_by(JobRun.number.desc())
            )
            .scalars()
            .first()
        )
        if row is not None:
            s.expunge(row)
        return row


def latest(ctx: EngineContext, job_id: str) -> JobRun | None:
    """The job's newest run (current or not)."""
    with ctx.session() as s:
        row = (
            s.execute(select(JobRun).where(JobRun.job_id == job_id).order_by(JobRun.number.desc()))
            .scalars()
            .first()
        )
        if row is not None:
            s.expunge(row)
        return row
