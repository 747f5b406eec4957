"""A runner's storage credentials: scoped to its job, short-lived, made by the bot for each launch.

Every rented host must be taken as disclosed to its owner, so a runner never gets the bot's own storage
keys where the store can do better. One function per kind of store, behind ``issue``:

- ``assume_role``  STS AssumeRole with the job's session policy (AWS with TUNEBOT_STORAGE_ROLE_ARN; MinIO,
                   whose STS takes the same call and policy language);
- ``federation``   STS GetFederationToken with the same policy (AWS, called with an IAM user's keys);
- ``r2``           Cloudflare R2's temporary credentials (``POST /accounts/{id}/r2/temp-access-credentials``)
                   for the run's prefix, its inputs and the checkpoints it resumes from;
- ``static``       the bot's own keys (a store that cannot scope: plain keys, an unknown endpoint). Still
                   usable, with one warning at start (``startup_warning``) and on every launch: any host then
                   reaches every job's data - what it writes is still checked
                   (bot/engine/launching/integrity.py).

The policy itself is bot/storage/scope.py (pure). Credentials last TUNEBOT_STORAGE_CREDENTIALS_SECONDS; the
bot renews them at half-life while the job runs (bot/engine/watching/renewal.py), and a runner that has not
been renewed checkpoints and exits before they expire (runner/credentials.py), to be relaunched with fresh
ones.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bot.storage.scope import Scope, policy_json, r2_request

if TYPE_CHECKING:
    from bot.settings import Settings

log = logging.getLogger(__name__)

EXPIRE_ENV = "TUNEBOT_CREDENTIALS_EXPIRE_AT"  # unix seconds; the runner plans its renewal around it
DEFAULT_ROLE = "arn:aws:iam::000000000000:role/tunebot-runner"  # MinIO ignores the ARN; botocore needs one


class Mode(StrEnum):
    assume_role = "assume-role"
    federation = "federation"
    r2 = "r2"
    static = "static"


class CredentialsError(Exception):
    """The store refused to make credentials for this job (the message says why, without secrets)."""


@dataclass(frozen=True)
class Issued:
    env: dict[str, str]  # what the runner gets: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (+ session token)
    mode: Mode
    expires_at: float | None = None  # None: never (static keys)

    @property
    def scoped(self) -> bool:
        return self.mode is not Mode.static


def r2_account(endpoint: str | None) -> str | None:
    """The Cloudflare account id of an R2 endpoint (https://<account>.r2.cloudflarestorage.com)."""
    host = (urlsplit(endpoint or "").hostname or "").lower()
    match = re.fullmatch(r"([0-9a-f]{32})\.(?:[a-z]+\.)?r2\.cloudflarestorage\.com", host)
    return match.group(1) if match else None


def _is_aws(endpoint: str | None) -> bool:
    host = (urlsplit(endpoint or "").hostname or "").lower()
    return not endpoint or host.endswith(".amazonaws.com")


def choose(settings: Settings) -> tuple[Mode, str | None]:
    """Which kind of credentials this bot makes, and the warning to give when they are not scoped (pure)."""
    endpoint = settings.aws_endpoint_url
    wanted = settings.storage_credentials
    r2 = r2_account(endpoint) is not None or "r2.cloudflarestorage.com" in (endpoint or "")
    if wanted == "auto":
        if r2:
            if settings.cloudflare_api_token is not None and (settings.r2_account_id or r2_account(endpoint)):
                return Mode.r2, None
            return Mode.static, _unscoped(
                "the store is Cloudflare R2: set CLOUDFLARE_API_TOKEN (allowed to make R2 temporary "
                "credentials) so that each job gets its own"
            )
        if settings.storage_role_arn:
            return Mode.assume_role, None
        if _is_aws(endpoint):
            return Mode.federation, None
        return Mode.static, _unscoped(
            f"the endpoint {endpoint} is not AWS or R2: for MinIO set "
            "TUNEBOT_STORAGE_CREDENTIALS=assume-role (its STS takes the same session policies); "
            "TUNEBOT_STORAGE_CREDENTIALS=static silences this"
        )
    mode = Mode(wanted)
    if mode is Mode.static:
        return mode, _unscoped("TUNEBOT_STORAGE_CREDENTIALS=static")
    return mode, None


def _unscoped(why: str) -> str:
    return (
        f"storage credentials are not scoped per job ({why}): every runner gets the bot's own storage "
        "keys, so any rented host can read and write every job's data (what it writes for other jobs is "
        "still refused: events and checkpoints are signed per job)"
    )


def startup_warning(settings: Settings) -> str | None:
    """What `tunebot serve` and the console say at start when runners cannot get scoped credentials."""
    base = settings.checkpoint_base_uri or ""
    if not base.startswith("s3://"):
        return None
    return choose(settings)[1]


def issue(settings: Settings, scope: Scope | None, *, name: str, now: float) -> Issued:
    """Credentials for one launch (``name``: the job id, for the store's own logs)."""
    mode, _ = choose(settings)
    if scope is None or mode is Mode.static:
        return static(settings)
    seconds = settings.storage_credentials_s
    try:
        if mode is Mode.r2:
            return r2(settings, scope, seconds=seconds, now=now)
        if mode is Mode.federation:
            return federation(settings, scope, name=name, seconds=seconds)
        return assume_role(settings, scope, name=name, seconds=seconds)
    except CredentialsError:
        raise
    except Exception as exc:  # noqa: BLE001 - any store trouble: say which call failed and why
        from bot.providers.base import redact

        problem = f"{mode.value}: {type(exc).__name__}: {exc}"
        raise CredentialsError(redact(problem, settings.secrets())) from None


def _region_and_endpoint(settings: Settings) -> dict[str, str]:
    env = {}
    if settings.aws_region:
        env["AWS_DEFAULT_REGION"] = settings.aws_region
    if settings.aws_endpoint_url:
        env["AWS_ENDPOINT_URL"] = settings.aws_endpoint_url
    return env


def static(settings: Settings) -> Issued:
    """The bot's own keys, unchanged (a store that cannot scope)."""
    env = _region_and_endpoint(settings)
    for name, var in (
        ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("aws_session_token", "AWS_SESSION_TOKEN"),
    ):
        value = getattr(settings, name)
        if value is not None:
            env[var] = value.get_secret_value()
    return Issued(env=env, mode=Mode.static)


def _sts(settings: Settings) -> Any:
    import botocore.session
    from botocore.config import Config

    def secret(value: Any) -> str | None:
        return value.get_secret_value() if value is not None else None

    return botocore.session.get_session().create_client(
        "sts",
        region_name=settings.aws_region or "us-east-1",
        endpoint_url=settings.sts_endpoint_url or settings.aws_endpoint_url or None,
        aws_access_key_id=secret(settings.aws_access_key_id),
        aws_secret_access_key=secret(settings.aws_secret_access_key),
        aws_session_token=secret(settings.aws_session_token),
        # The store checks the call (AWS: DurationSeconds >= 900); botocore's own copy of AWS's limits would
        # also refuse MinIO's and test stores' shorter lifetimes.
        config=Config(parameter_validation=False, retries={"max_attempts": 3}),
    )


def _from_sts(settings: Settings, creds: dict[str, Any], mode: Mode) -> Issued:
    expires = creds["Expiration"]
    expires_at = expires.timestamp() if isinstance(expires, datetime) else float(expires)
    env = {
        **_region_and_endpoint(settings),
        "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
        "AWS_SESSION_TOKEN": creds["SessionToken"],
        EXPIRE_ENV: f"{expires_at:.0f}",
    }
    return Issued(env=env, mode=mode, expires_at=expires_at)


def assume_role(settings: Settings, scope: Scope, *, name: str, seconds: int) -> Issued:
    """STS AssumeRole with the job's session policy (AWS: TUNEBOT_STORAGE_ROLE_ARN; MinIO: any ARN)."""
    answer = _sts(settings).assume_role(
        RoleArn=settings.storage_role_arn or DEFAULT_ROLE,
        RoleSessionName=f"tunebot-{name}"[:64],
        Policy=policy_json(scope),
        DurationSeconds=seconds,
    )
    return _from_sts(settings, answer["Credentials"], Mode.assume_role)


def federation(settings: Settings, scope: Scope, *, name: str, seconds: int) -> Issued:
    """STS GetFederationToken with the job's session policy (AWS, with an IAM user's keys)."""
    answer = _sts(settings).get_federation_token(
        Name=f"tunebot-{name}"[:32], Policy=policy_json(scope), DurationSeconds=seconds
    )
    return _from_sts(settings, answer["Credentials"], Mode.federation)


def r2(settings: Settings, scope: Scope, *, seconds: int, now: float) -> Issued:
    """Cloudflare R2 temporary credentials for the run's prefix and inputs."""
    import httpx

    account = settings.r2_account_id or r2_account(settings.aws_endpoint_url)
    token = settings.cloudflare_api_token
    parent = settings.aws_access_key_id
    if not account or token is None or parent is None:
        raise CredentialsError(
            "r2: set CLOUDFLARE_API_TOKEN, AWS_ACCESS_KEY_ID and the R2 endpoint (or TUNEBOT_R2_ACCOUNT_ID)"
        )
    body = r2_request(scope, parent_key_id=parent.get_secret_value(), ttl_seconds=seconds)
    url = f"{settings.cloudflare_api_url.rstrip('/')}/accounts/{account}/r2/temp-access-credentials"
    resp = httpx.post(
        url, json=body, timeout=20.0, headers={"Authorization": f"Bearer {token.get_secret_value()}"}
    )
    try:
        data = resp.json()
    except ValueError:
        data = {}
    result = data.get("result") if isinstance(data, dict) else None
    if resp.status_code != 200 or not data.get("success") or not isinstance(result, dict):
        errors = data.get("errors") if isinstance(data, dict) else None
        raise CredentialsError(f"r2: temporary credentials refused (HTTP {resp.status_code}): {errors}"[:300])
    expires_at = now + seconds
    env = {
        **_region_and_endpoint(settings),
        "AWS_ACCESS_KEY_ID": str(result["accessKeyId"]),
        "AWS_SECRET_ACCESS_KEY": str(result["secretAccessKey"]),
        "AWS_SESSION_TOKEN": str(result["sessionToken"]),
        EXPIRE_ENV: f"{expires_at:.0f}",
    }
    return Issued(env=env, mode=Mode.r2, expires_at=expires_at)
