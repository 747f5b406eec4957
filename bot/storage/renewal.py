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

This module is what the object is and where it goes (pure); the tick's step that renews each job due is
bot/engine/renewal.py.
"""

from __future__ import annotations

import json

from runner.integrity import CREDENTIALS, sign

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
