"""Optional Weights & Biases logging with a fixed run id, so a resumed run continues the same W&B run.

W&B never holds up training for more than a few seconds. ``mode: online`` (what the bot asks for when it has
a WANDB_API_KEY) logs to W&B under ``wandb.project`` / ``wandb.entity`` and gives the run's URL for the job's
thread. W&B's server that takes no TCP connection within 2 s is not asked at all; one that answers slowly or
with errors gets ``INIT_TIMEOUT_S`` (TUNEBOT_WANDB_INIT_TIMEOUT, 3 s) where wandb.init would wait 90 s, on
every start and resume, while the GPU bills. Then the run logs offline instead, and ``note`` says so for the
thread. The account lookup wandb makes before init is not bounded by its init_timeout, so it is switched off
(``x_disable_viewer``: it only fills in informational settings).

``mode: offline`` writes to ./wandb (or WANDB_DIR) without network. WANDB_MODE=offline|disabled (or
WANDB_DISABLED=true) in the runner's environment wins over the spec. An offline run's folder is copied to
``<checkpoint uri>/wandb/`` when the run ends (``save_offline``), so it outlives the instance: ``wandb sync``
uploads it later. The API key comes from the WANDB_API_KEY environment variable, never from the spec.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from runner.contract.spec import WANDB_INIT_TIMEOUT_S, JobSpec

INIT_TIMEOUT_ENV = "TUNEBOT_WANDB_INIT_TIMEOUT"
INIT_TIMEOUT_S = WANDB_INIT_TIMEOUT_S
PROBE_TIMEOUT_S = 2.0  # a TCP connection to W&B's server, tried first
DEFAULT_BASE_URL = "https://api.wandb.ai"
WANDB_MODES = ("online", "offline", "dryrun", "disabled", "shared", "run")


def wanted_mode(spec_mode: str, env: dict[str, str] | None = None) -> str:
    """The mode to log in: WANDB_DISABLED / WANDB_MODE in the environment win when they ask for less."""
    env = dict(os.environ) if env is None else env
    forced = str(env.get("WANDB_MODE", "")).strip().lower()
    if forced == "disabled" or str(env.get("WANDB_DISABLED", "")).strip().lower() in ("1", "true", "yes"):
        return "disabled"
    if forced in ("offline", "dryrun") and spec_mode == "online":
        return "offline"
    return spec_mode


def init_timeout() -> float:
    try:
        return max(0.5, float(os.environ.get(INIT_TIMEOUT_ENV, INIT_TIMEOUT_S)))
    except ValueError:
        return INIT_TIMEOUT_S


class WandbLog:
    def __init__(self) -> None:
        self.run: Any = None
        self.run_id: str | None = None
        self.url: str | None = None  # the run's page (online runs)
        self.mode: str = "disabled"
        self.note: str | None = None  # said once in the job's thread: W&B unreachable, logging offline
        self.offline_dir: Path | None = None  # this run's offline folder (to keep with the checkpoints)
        self.init_seconds = 0.0
        self._rows: list[tuple[int, dict[str, Any]]] = []  # logged, not yet sent (``flush``)

    def start(self, spec: JobSpec, run_id: str | None, config: dict[str, Any]) -> str | None:
        """Start or resume the W&B run; return its id (saved in checkpoints) or None when not logging."""
        if os.environ.get("WANDB_MODE", "online").strip().lower() not in WANDB_MODES:
            os.environ.pop("WANDB_MODE")  # an empty or unknown value fails every wandb.init
        mode = wanted_mode(spec.wandb.mode)
        if mode == "disabled":
            return run_id
        try:
            import wandb
        except Exception:  # wandb is optional; a broken install must not stop training
            return run_id
        started = time.monotonic()
        self.run_id = run_id or spec.wandb.run_id or f"{spec.job_id[:40]}-{uuid.uuid4().hex[:8]}"
        kwargs = dict(
            project=spec.wandb.project or "tunebot",
            entity=spec.wandb.entity,
            id=self.run_id,
            resume="allow",
            name=spec.job_id,
            config=config,
            dir=os.environ.get("WANDB_DIR") or None,
        )
        if mode == "online":
            timeout = init_timeout()
            unreachable = _unreachable(os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL)
            if unreachable:
                self.note = f"W&B is unreachable ({unreachable}): logging offline"
            else:
                try:
                    _skip_account_lookup(wandb)
                    self.run = wandb.init(
                        mode="online", settings=wandb.Settings(init_timeout=timeout), **kwargs
                    )
                except Exception as exc:  # slow, failing or refusing: log offline rather than wait
                    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                    self.note = f"W&B did not start within {timeout:g} s ({reason}): logging offline"
                    _teardown(wandb)
                    self.run = None
            if self.note:
                print(f"note: {self.note}", flush=True)
                mode = "offline"
        if self.run is None:
            self.run = _init_offline(wandb, kwargs)
            if self.run is None:
                self.note = None
        self.mode = mode if self.run is not None else "disabled"
        self.init_seconds = time.monotonic() - started
        if self.run is not None and mode == "online":
            url = getattr(self.run, "url", None)
            self.url = str(url) if url else None
            if self.url:
                print(f"W&B run: {self.url}", flush=True)
        if self.run is not None and mode == "offline":
            run_dir = getattr(self.run, "dir", None)  # <wandb dir>/offline-run-<time>-<id>/files
            self.offline_dir = Path(run_dir).parent if run_dir else None
        return self.run_id

    def log(self, values: dict[str, Any], step: int) -> None:
        """Kept until ``flush`` (the loop flushes at its reports): no W&B call per step in a loop whose steps
        are bound by Python dispatch."""
        if self.run is not None:
            self._rows.append((step, values))

    def flush(self) -> None:
        """Send the rows kept since the last flush, in step order (W&B drops a step older than its last)."""
        rows, self._rows = sorted(self._rows, key=lambda r: r[0]), []
        if self.run is None:
            return
        for step, values in rows:
            try:
                self.run.log(values, step=step)
            except Exception:
                pass

    def finish(self, exit_code: int = 0) -> None:
        self.flush()
        if self.run is not None:
            try:
                self.run.finish(exit_code=exit_code)
            except Exception:
                pass
            self.run = None

    def save_offline(self, checkpoint_uri: str) -> str | None:
        """Copy this run's offline folder to ``<checkpoint uri>/wandb/<folder>`` (after ``finish``), so that
        ``wandb sync`` can upload it once the instance is gone; returns where it went."""
        folder = self.offline_dir
        if folder is None or not folder.is_dir():
            return None
        import fsspec

        target = f"{checkpoint_uri.rstrip('/')}/wandb/{folder.name}"
        try:
            fs, root = fsspec.core.url_to_fs(target)
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    remote = f"{root}/{path.relative_to(folder).as_posix()}"
                    fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                    fs.put_file(str(path), remote)
        except Exception as exc:  # the training result matters more than its W&B log
            print(
                f"note: the offline W&B run was not saved to {target} ({type(exc).__name__}: {exc})",
                flush=True,
            )
            return None
        print(f"offline W&B run saved: {target} (upload it with `wandb sync`)", flush=True)
        return target


def sync_hint(checkpoint_uri: str) -> str:
    """Where a job's offline W&B runs are kept and how to upload them (for the thread's note)."""
    return (
        f"its files are kept in {checkpoint_uri.rstrip('/')}/wandb/; upload them with "
        "`wandb sync <folder>` once W&B is reachable"
    )


def _unreachable(base_url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why W&B's server cannot be reached at all (no TCP connection within ``timeout``), else None.

    A closed port or an unknown host is known in milliseconds; wandb would retry it for its whole init
    timeout. Behind a proxy (HTTPS_PROXY / HTTP_PROXY) the direct connection says nothing: not probed."""
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    parts = urlsplit(base_url)
    host = parts.hostname
    if not host:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable: {exc.strerror or type(exc).__name__}"


def _skip_account_lookup(wandb: Any) -> None:
    """wandb looks the account up (a server call not bounded by init_timeout, ~10 s when unreachable) only
    to fill in informational settings; switch it off for this process."""
    try:
        wandb.setup(settings=wandb.Settings(x_disable_viewer=True))
    except Exception:  # an older or newer wandb without the setting: init_timeout still bounds init
        pass


def _init_offline(wandb: Any, kwargs: dict[str, Any]) -> Any:
    """The offline run, or None (logging is best effort). Right after a timed-out online attempt, wandb may
    still hold that run's id ("run ID ... is in use"); the offline run then gets an id of its own."""
    for attempt in (1, 2):
        try:
            return wandb.init(mode="offline", **kwargs)
        except Exception as exc:
            if attempt == 2:
                print(f"note: W&B disabled ({type(exc).__name__}: {exc})", flush=True)
                return None
            print(f"note: W&B offline start failed ({type(exc).__name__}: {exc}); retrying", flush=True)
            _teardown(wandb)
            kwargs = {**kwargs, "id": f"{kwargs.get('id') or 'run'}-offline-{uuid.uuid4().hex[:6]}"}
    return None


def _teardown(wandb: Any) -> None:
    """Forget the failed online attempt, so that the offline init may reuse the run id."""
    try:
        wandb.teardown()
    except Exception:
        pass
