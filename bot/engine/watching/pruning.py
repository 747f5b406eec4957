"""Superseded runs' folders are deleted, so a job's storage does not grow with every preemption.

Each run of a job writes under ``<job folder>/runs/<run id>/`` (bot/engine/record/runs.py): its checkpoints,
its progress object, its renewed credentials, its output. A run is superseded once a newer run of the job
exists (a relaunch after a preemption, a resume, growth). Its folder is deleted by the bot (the reconcile
pass) once nothing that run was given can write there any more - its storage credentials have expired (the
last ones were made while it was current, so at most their lifetime after it ended, plus ``GRACE_S``) and no
instance of it is open - except what the bot pinned:

- the acknowledged checkpoints the job resumes from: the current run's resume list and the job's newest
  acknowledged checkpoints (what the next relaunch would get, and a stopped job's result);
- the results: every output a run reported with its digest (what the Hub push reads), the job's output and
  its last checkpoint.

Where runners get no expiring credentials (a local folder, or the bot's own keys: bot/storage/credentials.py)
only the grace applies. A pruned run is marked (``job_runs.pruned_at``) and never listed again.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, exists, select, update
from sqlalchemy.orm import aliased

from bot.engine.record import runs
from bot.engine.record import states as S
from store.models import Instance, Job, JobRun

if TYPE_CHECKING:
    from bot.engine.context import EngineContext
    from bot.settings import Settings

log = logging.getLogger(__name__)

GRACE_S = 600.0  # past the credentials' lifetime: a renewal made just as the run was replaced
BATCH = 50  # runs pruned per pass at most (each lists and deletes a folder)
# the job's newest acknowledged checkpoints kept (bot/engine/record/runs.newest_acknowledged)
PINNED_POINTS = 4
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def hold_s(settings: Settings) -> float:
    """How long a replaced run's folder stays whole: its credentials' lifetime plus GRACE_S where runners get
    expiring credentials (an S3 store that scopes them), GRACE_S alone otherwise."""
    from bot.storage.credentials import Mode, choose

    base = settings.checkpoint_base_uri or ""
    expiring = base.startswith("s3://") and choose(settings)[0] is not Mode.static
    return (float(settings.storage_credentials_s) if expiring else 0.0) + GRACE_S


def prune_superseded(ctx: EngineContext) -> int:
    """Delete the folders of superseded runs whose credentials have expired, all but what is pinned; how many
    runs were pruned. A failure is logged and the run tried again on the next pass."""
    from bot.engine.launching.launch import storage_root

    now = ctx.now()
    newer = aliased(JobRun)
    with ctx.session() as s:
        rows = s.execute(
            select(JobRun.id, JobRun.job_id, JobRun.instance)
            .where(
                JobRun.pruned_at.is_(None),
                JobRun.ended_at.is_not(None),
                JobRun.ended_at <= now - hold_s(ctx.settings),
                exists().where(and_(newer.job_id == JobRun.job_id, newer.number > JobRun.number)),
            )
            .order_by(JobRun.ended_at)
            .limit(BATCH)
        ).all()
    pruned = 0
    for row in rows:
        if not _RUN_ID.match(row.id) or _instance_open(ctx, row.job_id, row.instance):
            continue
        try:
            root = runs.run_root(storage_root(ctx, row.job_id), row.id)
            deleted, kept = _prune(root, _pinned(ctx, row.job_id))
        except Exception as exc:  # noqa: BLE001 - storage trouble: the next pass tries again
            log.warning("job %s: pruning run %s failed: %s", row.job_id, row.id, exc)
            continue
        with ctx.session() as s:
            s.execute(
                update(JobRun).where(JobRun.id == row.id, JobRun.pruned_at.is_(None)).values(pruned_at=now)
            )
            S.audit(
                s,
                actor="engine",
                action="run-pruned",
                job_id=row.job_id,
                at=now,
                run=row.id,
                deleted=deleted,
                kept=kept,
            )
            s.commit()
        pruned += 1
    return pruned


def _instance_open(ctx: EngineContext, job_id: str, instance: str | None) -> bool:
    """Whether the run's instance is still open in the books (its host may still write)."""
    if not instance or ":" not in instance:
        return False
    provider, instance_id = instance.split(":", 1)
    with ctx.session() as s:
        return (
            s.execute(
                select(Instance.id).where(
                    Instance.job_id == job_id,
                    Instance.provider == provider,
                    Instance.provider_instance_id == instance_id,
                    Instance.ended_at.is_(None),
                )
            ).first()
            is not None
        )


def _pinned(ctx: EngineContext, job_id: str) -> list[str]:
    """What the bot keeps of the job's runs: the checkpoints it resumes from and the results."""
    with ctx.session() as s:
        job = s.get(Job, job_id)
        current = (
            s.execute(select(JobRun.resume).where(JobRun.job_id == job_id).order_by(JobRun.number.desc()))
            .scalars()
            .first()
        )
        outputs = s.execute(
            select(JobRun.output_uri).where(JobRun.job_id == job_id, JobRun.output_uri.is_not(None))
        ).scalars()
        pins = [p["uri"] for p in runs.resume_points(s, job_id, limit=PINNED_POINTS)]
        pins += [p.get("uri") for p in current or [] if isinstance(p, dict)]
        pins += list(outputs)
    if job is not None:
        pins += [job.output_uri, job.last_checkpoint_uri]
    return sorted({p for p in pins if p})


def _prune(root: str, pinned: list[str]) -> tuple[int, list[str]]:
    """Delete everything under ``root`` that is not a pinned folder or in one: (files deleted, pins kept)."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(root)
    base = base.rstrip("/")
    if not fs.exists(base):
        return 0, []
    keep = []
    for uri in pinned:
        _, path = fsspec.core.url_to_fs(uri)
        path = path.rstrip("/")
        if path == base or path.startswith(base + "/"):
            keep.append(path)
    if not keep:
        count = len(fs.find(base))
        fs.rm(base, recursive=True)
        return count, []

    def pinned_path(path: str) -> bool:
        return any(path == k or path.startswith(k + "/") for k in keep)

    doomed = [p for p in fs.find(base) if not pinned_path(p.rstrip("/"))]
    if doomed:
        fs.rm(doomed)
    if _is_local(fs):  # folders left empty (an object store has none); one holding a pin is not empty
        dirs: list[Any] = [d for d in fs.find(base, withdirs=True) if fs.isdir(d)]
        for d in sorted(dirs, key=len, reverse=True):
            with contextlib.suppress(OSError):
                fs.rmdir(d)
    return len(doomed), [k.removeprefix(base + "/") for k in keep]


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol
