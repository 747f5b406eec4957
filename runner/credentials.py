"""The runner's side of short-lived storage credentials: switch to renewed ones, or stop in time.

The bot gives a runner storage credentials scoped to its job and valid until TUNEBOT_CREDENTIALS_EXPIRE_AT
(bot/storage/credentials.py), and from their half-life on leaves fresh ones at TUNEBOT_CREDENTIALS_URI (in
the run's own folder), signed with the run's key and sealed to it (runner/contract/sealed.py: no other run,
and no host that held this job before, can read them; bot/storage/renewal.py). A ``Watcher`` thread reads that
object from half-life on; a newer, validly signed one replaces the process's AWS_* variables and s3fs's cached
clients (new clients read the new keys; ``generation`` tells CheckpointStore to make its own again). If none
has come when only ``margin`` is left, it calls ``on_expiring``: the trainer saves a checkpoint while the
credentials still work and exits with EXIT_CREDENTIALS, and the bot relaunches it with fresh ones.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from runner.contract.integrity import CREDENTIALS, key_from_env, verify
from runner.contract.sealed import SealError, open_sealed

EXPIRE_ENV = "TUNEBOT_CREDENTIALS_EXPIRE_AT"
URI_ENV = "TUNEBOT_CREDENTIALS_URI"
KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MAX_OBJECT_BYTES = 64 * 1024

generation = 0  # bumped on every switch: whoever caches a filesystem makes a new one


def margin_for(lifetime: float) -> float:
    """How long before expiry a runner that was not renewed stops: time to save a checkpoint."""
    return max(5.0, min(600.0, lifetime / 4))


def apply(env: dict[str, str], expires_at: float) -> None:
    """Use these credentials from now on (this process and its s3fs clients)."""
    global generation
    for name in KEYS:
        if name in env:
            os.environ[name] = env[name]
    os.environ[EXPIRE_ENV] = f"{expires_at:.0f}"
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:  # pragma: no cover - the runner image has s3fs
        pass
    generation += 1


def read_renewal(
    uri: str, key: bytes | None, job_id: str, run_id: str | None = None
) -> tuple[dict[str, str], float] | None:
    """The renewed credentials at ``uri`` when they were sealed for this run and signed with its key; None
    otherwise."""
    import fsspec

    try:
        with fsspec.open(uri, "rb") as fh:
            raw = fh.read(MAX_OBJECT_BYTES + 1)
    except Exception:  # noqa: BLE001 - not there (yet), unreadable: try again later
        return None
    if len(raw) > MAX_OBJECT_BYTES or key is None:
        return None
    try:
        obj = open_sealed(key, CREDENTIALS, job_id, run_id, raw)
    except SealError:
        return None
    if not verify(key, CREDENTIALS, obj):
        return None
    env, expires = obj.get("env"), obj.get("expires_at")
    if obj.get("job_id") != job_id or not isinstance(env, dict) or not isinstance(expires, int | float):
        return None
    return {k: str(v) for k, v in env.items() if k in KEYS}, float(expires)


class Watcher:
    """Follows this runner's credentials; ``None`` from ``start`` when they do not expire."""

    def __init__(
        self,
        job_id: str,
        expires_at: float,
        uri: str | None,
        on_expiring: Callable[[], None],
        *,
        clock: Callable[[], float] = time.time,
        run_id: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.run_id = run_id
        self.expires_at = expires_at
        self.uri = uri
        self.on_expiring = on_expiring
        self.clock = clock
        self.started = clock()
        self.renewed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunebot-credentials", daemon=True)

    @classmethod
    def start(
        cls, job_id: str, on_expiring: Callable[[], None], *, run_id: str | None = None
    ) -> Watcher | None:
        try:
            expires_at = float(os.environ[EXPIRE_ENV])
        except (KeyError, ValueError):
            return None
        watcher = cls(job_id, expires_at, os.environ.get(URI_ENV), on_expiring, run_id=run_id)
        watcher._thread.start()
        return watcher

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        key = key_from_env()
        while not self._stop.is_set():
            wait = self.step(key)
            if wait is None:
                return
            self._stop.wait(wait)

    def step(self, key: bytes | None) -> float | None:
        """One look: switch to renewed credentials, or give up in time; seconds until the next look, None
        when done (``on_expiring`` was called)."""
        now = self.clock()
        lifetime = max(1.0, self.expires_at - self.started)
        if self.uri and now >= self.started + lifetime / 2:
            found = read_renewal(self.uri, key, self.job_id, self.run_id)
            if found is not None and found[1] > self.expires_at:
                apply(*found)
                self.started, self.expires_at = now, found[1]
                self.renewed += 1
                print(f"storage credentials renewed until {time.ctime(found[1])}", flush=True)
                return 0.0
        remaining = self.expires_at - now
        if remaining <= margin_for(lifetime):
            print("storage credentials expiring, not renewed: saving and exiting", flush=True)
            self.on_expiring()
            return None
        return max(0.5, min(30.0, lifetime / 20, remaining / 4))
