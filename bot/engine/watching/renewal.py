"""The tick's step renewing running jobs' storage credentials at half-life (what is left for the run, sealed
to it, and why: bot/storage/renewal.py).

An engine step: it takes the context and reads the jobs; bot/storage stays below the engine.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from bot.storage.renewal import credentials_uri, due, renewal_object

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)


def renew_due(ctx: EngineContext) -> int:
    """Renew the credentials of every running job's current run past their half-life; how many were renewed.
    The fresh credentials have the run's scope (its folder, its inputs, the checkpoints it resumes from) and
    are left sealed to the run in its own folder. A failure is logged and tried again on the next tick (the
    runner still has the other half of the lifetime)."""
    from bot.engine.launching import integrity
    from bot.engine.launching.launch import storage_root
    from bot.engine.record import runs
    from bot.engine.record import states as S
    from bot.storage import credentials
    from bot.storage.scope import scope_for
    from store.models import Job, JobRun

    now = ctx.now()
    with ctx.session() as s:  # half-life passed: issued + (expire - issued) / 2 <= now
        rows = s.execute(
            select(Job.id, Job.plan, Job.run_id, Job.credentials_issued_at, Job.credentials_expire_at).where(
                Job.state == S.RUNNING,
                Job.run_id.is_not(None),
                Job.credentials_expire_at.is_not(None),
                Job.credentials_issued_at + Job.credentials_expire_at <= 2 * now,
            )
        ).all()
    renewed = 0
    for row in rows:
        if not due(row.credentials_issued_at, row.credentials_expire_at, now):
            continue
        with ctx.session() as s:
            run = s.get(JobRun, row.run_id)
        key = integrity.run_key(ctx, row.id, row.run_id)
        if (
            run is None or key is None
        ):  # a run from before runs (legacy): relaunched with fresh ones at expiry
            continue
        root = runs.run_root(storage_root(ctx, row.id), run.id)
        spec: dict[str, Any] = row.plan or {}
        dataset = (spec.get("dataset") or {}).get("uri") if isinstance(spec.get("dataset"), dict) else None
        resume = [p.get("uri") for p in run.resume or [] if isinstance(p, dict) and p.get("uri")]
        scope = scope_for(root, dataset=dataset, base_model=spec.get("base_model"), resume=resume)
        try:
            issued = credentials.issue(ctx.settings, scope, name=run.id, now=now)
            if issued.expires_at is None:
                continue
            data = renewal_object(key, row.id, issued.env, issued.expires_at, run_id=run.id)
            _put(credentials_uri(root), data)
        except Exception as exc:  # noqa: BLE001 - tried again next tick; the runner has half a lifetime left
            log.warning("job %s: storage credentials not renewed: %s", row.id, exc)
            continue
        with ctx.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == row.id, Job.run_id == run.id)
                .values(credentials_issued_at=now, credentials_expire_at=issued.expires_at)
            )
            s.commit()
        renewed += 1
    return renewed


def _put(uri: str, data: bytes) -> None:
    """One PUT (an object store replaces an object atomically)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    fs.pipe_file(path, data)
