"""Renewing a running job's storage credentials before they expire: a job longer than their lifetime still
finishes.

Plan (docs/security.md): at half-life of a run's credentials the bot makes fresh ones for the same scope and
leaves them in the run's own folder, ``<job folder>/runs/<run id>/credentials.json``, signed with the run's
key (runner/contract/integrity.py, purpose "credentials") and sealed to it (runner/contract/sealed.py: AES-GCM
under a key derived from the run's key, the job and run ids bound in). The run's folder is outside every other
run's credentials where storage is scoped, and the seal keeps the object unreadable to anyone but that run
where it is not (a store that cannot scope, a host that ran the job before and still holds its old
credentials). The runner (runner/credentials.py) reads the object from half-life on and switches to the newer
credentials in place; if none came - the bot was down for half a lifetime - it saves a checkpoint and exits
with EXIT_CREDENTIALS (77) before they expire, and the bot relaunches it with fresh ones (a new run) like a
preemption. It works for a bot with or without a public URL (the object is pulled, like progress.json), and
the instance is never given anything long-lived.

This module is what the object is and where it goes (pure); the tick's step that renews each job due is
bot/engine/watching/renewal.py.
"""

from __future__ import annotations

from runner.contract.integrity import CREDENTIALS, sign
from runner.contract.sealed import seal

CREDENTIALS_FILE = "credentials.json"
RENEWED_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def credentials_uri(run_root: str) -> str:
    """Where a run's renewed credentials are left for its runner (in the run's own folder)."""
    return f"{run_root.rstrip('/')}/{CREDENTIALS_FILE}"


def renewal_object(
    key: bytes, job_id: str, env: dict[str, str], expires_at: float, run_id: str | None = None
) -> bytes:
    """The object a runner accepts: the new keys and when they expire, signed with the run's key and sealed to
    the run (pure but for the seal's random nonce)."""
    body = {
        "version": 2,
        "job_id": job_id,
        "run_id": run_id,
        "expires_at": expires_at,
        "env": {k: env[k] for k in RENEWED_KEYS if k in env},
    }
    return seal(key, CREDENTIALS, job_id, run_id, sign(key, CREDENTIALS, body))


def due(issued_at: float | None, expire_at: float | None, now: float) -> bool:
    """Half of the current credentials' life has passed (pure)."""
    if issued_at is None or expire_at is None:
        return False
    return now >= issued_at + (expire_at - issued_at) / 2
