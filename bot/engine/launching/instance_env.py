"""What a rented instance receives: only the secrets its job needs, and the list of what to redact.

Whatever an instance gets must be taken as disclosed to the host's owner (../shared/docs/security.md), so:

- never the bot's own ``HF_TOKEN``: the Hub offers no short-lived scoped token, so a token handed to a host
  stays disclosed until someone revokes it by hand; the bot pushes outputs itself
  (bot/engine/outcome/hub_push.py);
- ``HF_TOKEN`` set to ``TUNEBOT_HF_READ_TOKEN`` (a fine-grained read-only token) only for a base model the
  Hub does not serve anonymously (gated or private: asked once per model, anonymously; when the Hub cannot
  be asked the read token goes, so that a gated model still trains);
- ``WANDB_API_KEY`` only when the job logs to W&B online;
- storage credentials (``storage``: scoped to the job where the store allows it, see
  bot/storage/credentials.py), the job's integrity key and the spec.

``secret_values`` lists every value an instance got that is not plainly public (the spec is public but
for its report token): the launch scrubs them from provider errors (``bot.providers.base.redacting``)
and from every message it records.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from runner.contract.spec import JobSpec

if TYPE_CHECKING:
    from bot.settings import Settings

log = logging.getLogger(__name__)

SPEC_ENV = "TUNEBOT_JOB_SPEC"
# Values an instance gets that are not secrets (endpoints, regions, times): not redacted from messages.
PUBLIC_ENV = frozenset(
    {
        SPEC_ENV,
        "HF_ENDPOINT",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "TUNEBOT_CREDENTIALS_EXPIRE_AT",
        "TUNEBOT_CREDENTIALS_URI",
    }
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_ACCESS_TTL_S = 3600.0

# "public" | "restricted" (gated or private) | "unknown" (the Hub could not be asked), per model id.
_hub_access: dict[tuple[str, str], tuple[str, float]] = {}
_hub_lock = threading.Lock()


def is_hub_id(base_model: str) -> bool:
    """A Hugging Face repo id (not a path or a URI): the runner downloads it from the Hub."""
    return (
        "://" not in base_model
        and not base_model.startswith(("/", ".", "~"))
        and bool(HUB_ID.match(base_model))
    )


def hub_access(model: str, endpoint: str | None, *, timeout: float = 5.0) -> str:
    """Whether the Hub serves this model to anyone: "public", "restricted" or "unknown" (cached an hour).

    Asked anonymously (``GET /api/models/<id>``): 200 without ``gated``/``private`` is public; 401, 403
    and 404 (a private repo answers so without a token) or a gated/private flag is restricted."""
    base = (endpoint or "https://huggingface.co").rstrip("/")
    key = (base, model)
    now = time.monotonic()
    with _hub_lock:
        hit = _hub_access.get(key)
    if hit is not None and now - hit[1] < HUB_ACCESS_TTL_S:
        return hit[0]
    import httpx

    try:
        resp = httpx.get(f"{base}/api/models/{model}", timeout=timeout, follow_redirects=True)
    except (httpx.HTTPError, OSError):
        return "unknown"  # not cached: the next launch asks again
    if resp.status_code in (401, 403, 404):
        answer = "restricted"
    elif resp.status_code == 200:
        try:
            info = resp.json()
        except ValueError:
            info = None
        if not isinstance(info, dict):
            return "unknown"
        answer = "restricted" if info.get("gated") or info.get("private") else "public"
    else:
        return "unknown"
    with _hub_lock:
        _hub_access[key] = (answer, now)
    return answer


def needs_hf_token(spec: JobSpec, access: Callable[[str], str]) -> bool:
    """The job's base model is a Hub repo not served anonymously: its host needs the read token to download
    it (pure, given ``access``: model id -> "public" | "restricted" | "unknown"). A push needs nothing on the
    host: the bot pushes."""
    if not is_hub_id(spec.base_model):
        return False
    return access(spec.base_model) != "public"


def host_read_token(settings: Settings) -> str | None:
    """The Hub token a host may get: TUNEBOT_HF_READ_TOKEN, never the bot's HF_TOKEN (not even when both
    settings hold the same value)."""
    read = settings.hf_read_token.get_secret_value() if settings.hf_read_token is not None else ""
    own = settings.hf_token.get_secret_value() if settings.hf_token is not None else ""
    if not read or read == own:
        if read:
            log.warning("TUNEBOT_HF_READ_TOKEN is HF_TOKEN: not given to runners (use a read-only token)")
        return None
    return read


def runner_env(
    settings: Settings,
    spec: JobSpec,
    *,
    storage: dict[str, str],
    job_key: str | None = None,
    access: Callable[[str], str] | None = None,
) -> dict[str, str]:
    """The instance's environment: the spec and the secrets this job needs (never in the spec)."""
    env = {SPEC_ENV: spec.model_dump_json(), **storage}
    if job_key:
        env["TUNEBOT_JOB_KEY"] = job_key
    read_token = host_read_token(settings)
    if read_token:
        ask = access or (lambda model: hub_access(model, settings.hf_endpoint))
        if needs_hf_token(spec, ask):  # the read-only token, under the name huggingface_hub reads
            env["HF_TOKEN"] = read_token
    if settings.hf_endpoint:
        env["HF_ENDPOINT"] = settings.hf_endpoint
    if settings.wandb_api_key is not None and spec.wandb.mode == "online":
        env["WANDB_API_KEY"] = settings.wandb_api_key.get_secret_value()
    return env


def secret_values(env: dict[str, str], spec: JobSpec | None = None) -> list[str]:
    """Every value of an instance's environment that must never appear in a message or a log."""
    values = [v for k, v in env.items() if k not in PUBLIC_ENV and v]
    if spec is not None and spec.report.token:
        values.append(spec.report.token)
    return values
