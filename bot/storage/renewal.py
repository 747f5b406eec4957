"""Renewing a running job's storage credentials before they expire: a job longer than their lifetime still
finishes.

Plan (docs/security.md): at half-life of a running job's credentials the bot makes fresh ones for the same
scope and leaves them in the job's own folder, ``<job folder>/credentials.json``, signed with the job's key
(runner/integrity.py, purpose "credentials"). Only that job's credentials (and the bot) can read its folder
where storage is scoped, and only the job's key signs what the runner will accept. The runner
(runner/credentials.py) reads the object from half-life on and switches to the newer credentials in place;
if none came - the bot was down for half a lifetime - it saves a checkpoint and exits with
EXIT_CREDENTIALS (77) before they expire, and the bot relaunches it with fresh ones like a preemption. It
works for a bot with or without a public URL (the object is pulled, like progress.json), and the instance
is never given anything long-lived.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from runner.integrity import CREDENTIALS, sign

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)

CREDENTIALS_FILE = "credentials.json"
RENEWED_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def credentials_uri(job_root: str) -> str:
    """Where a job's renewed credentials are left for its runner."""
    return f"{job_root.rstrip('/')}/{CREDENTIALS_FILE}"


def renewal_object(key: bytes, job_id: str, env: dict[str, str], expires_at: float) -> bytes:
    """The signed object a runner accepts: the new keys and when they expire (pure)."""
    body = {
        "version": 1,
        "job_id": job_id,
        "expires_at": expires_at,
        "env": {k: env[k] for k in RENEWED_KEYS if k in env},
    }
    return json.dumps(sign(key, CREDENTIALS, body)).encode()


def due(issued_at: float | None, expire_at: float | None, now: float) -> bool:
    """Half of the current credentials' life has passed (pure)."""
    if issued_at is None or expire_at is None:
        return False
    return now >= issued_at + (expire_at - issued_at) / 2


def renew_due(ctx: EngineContext) -> int:
    """Renew the credentials of every running job past their half-life; how many were renewed. A failure
    is logged and tried again on the next tick (the runner still has the other half of the lifetime)."""
    from bot.engine import integrity
    from bot.engine import states as S
    from bot.engine.launch import storage_root
    from bot.storage import credentials
    from bot.storage.scope import scope_for
    from store.models import Job

    now = ctx.now()
    with ctx.session() as s:  # half-life passed: issued + (expire - issued) / 2 <= now
        rows = s.execute(
            select(Job.id, Job.plan, Job.credentials_issued_at, Job.credentials_expire_at).where(
                Job.state == S.RUNNING,
                Job.credentials_expire_at.is_not(None),
                Job.credentials_issued_at + Job.credentials_expire_at <= 2 * now,
            )
        ).all()
    renewed = 0
    for row in rows:
        if not due(row.credentials_issued_at, row.credentials_expire_at, now):
            continue
        root = storage_root(ctx, row.id)
        spec: dict[str, Any] = row.plan or {}
        dataset = (spec.get("dataset") or {}).get("uri") if isinstance(spec.get("dataset"), dict) else None
        scope = scope_for(root, dataset=dataset, base_model=spec.get("base_model"))
        try:
            issued = credentials.issue(ctx.settings, scope, name=row.id, now=now)
            if issued.expires_at is None:
                continue
            data = renewal_object(integrity.job_key(ctx, row.id), row.id, issued.env, issued.expires_at)
            _put(credentials_uri(root), data)
        except Exception as exc:  # noqa: BLE001 - tried again next tick; the runner has half a lifetime left
            log.warning("job %s: storage credentials not renewed: %s", row.id, exc)
            continue
        with ctx.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == row.id)
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
