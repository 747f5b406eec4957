"""Configuration from the environment (and an optional .env file), in one place.

Every knob has a default that runs the embedded setup: SQLite in the user's data folder, the local
provider, the terminal chat. Secrets are SecretStr so that they never print by accident.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from platformdirs import user_data_dir
from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The runner image GPU hosts pull: the Dockerfile, built and pushed under this name for each release
# (README: "Cloud quick start"; scripts/runner-image.sh). Set TUNEBOT_RUNNER_IMAGE to your own push.
RUNNER_IMAGE_REPO = "ghcr.io/tunebot/tunebot-runner"


def default_data_dir() -> Path:
    return Path(user_data_dir("tunebot", appauthor=False))


def default_runner_image() -> str:
    """The image of this release: the runner in it speaks this bot's JobSpec version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{RUNNER_IMAGE_REPO}:{version('tunebot')}"
    except PackageNotFoundError:
        return f"{RUNNER_IMAGE_REPO}:latest"


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class CloudAccess(BaseModel):
    """One cloud's key, base URL and extra options, read from the variables its spec names."""

    api_key: SecretStr | None = None
    api_url: str
    options: dict[str, str] = Field(default_factory=dict)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir, alias="TUNEBOT_DATA_DIR")
    database_url: str | None = Field(None, alias="DATABASE_URL")

    # Cloud keys and base URLs, one entry per cloud module (bot/providers/<cloud>.py declares the names:
    # VAST_API_KEY / VAST_API_URL, RUNPOD_..., LAMBDA_... and LAMBDA_SSH_KEY_NAME, TENSORDOCK_...; the
    # URLs point tests at fake servers on 127.0.0.1). Filled by _read_clouds.
    clouds: dict[str, CloudAccess] = Field(default_factory=dict, alias="TUNEBOT_INTERNAL_CLOUDS")
    provider_timeout_s: float = Field(20.0, alias="TUNEBOT_PROVIDER_TIMEOUT")
    catalog_ttl_s: float = Field(300.0, alias="TUNEBOT_CATALOG_TTL")
    # How long a live listing waits for all clouds together; a cloud still silent then is priced from
    # its dated snapshot, with a note (`tunebot gpus --live`, estimates).
    catalog_deadline_s: float = Field(8.0, gt=0, alias="TUNEBOT_CATALOG_DEADLINE")
    price_tolerance: float = Field(0.10, alias="TUNEBOT_PRICE_TOLERANCE")  # launch stops above +10%
    min_reliability: float = Field(0.95, alias="TUNEBOT_MIN_RELIABILITY")
    runner_image: str = Field(default_factory=default_runner_image, alias="TUNEBOT_RUNNER_IMAGE")
    # The runner image has flash-attn (built with --build-arg FLASH_ATTN=1); attn=flash is refused otherwise.
    runner_flash_attention: bool = Field(False, alias="TUNEBOT_RUNNER_FLASH_ATTN")
    # The local provider (the runner on this machine's CPU): None = on for the console, demo and CLI, off
    # in `tunebot serve`; true/false forces it. It is never offered for a job longer than local_max_hours.
    local_provider: bool | None = Field(None, alias="TUNEBOT_LOCAL_PROVIDER")
    local_max_hours: float = Field(1.0, alias="TUNEBOT_LOCAL_MAX_HOURS")

    # Secrets passed to runners as environment variables, never in specs or messages.
    hf_token: SecretStr | None = Field(None, alias="HF_TOKEN")
    hf_endpoint: str | None = Field(None, alias="HF_ENDPOINT")  # a Hub mirror / enterprise endpoint
    wandb_api_key: SecretStr | None = Field(None, alias="WANDB_API_KEY")
    wandb_project: str = Field("tunebot", alias="WANDB_PROJECT")
    wandb_entity: str | None = Field(None, alias="WANDB_ENTITY")
    # Object storage for checkpoints and staged inputs (TUNEBOT_CHECKPOINT_URI): the runner gets these as
    # environment variables of its instance. AWS_ENDPOINT_URL points at any S3-compatible store.
    aws_access_key_id: SecretStr | None = Field(None, alias="AWS_ACCESS_KEY_ID")
    aws_secret_access_key: SecretStr | None = Field(None, alias="AWS_SECRET_ACCESS_KEY")
    aws_session_token: SecretStr | None = Field(None, alias="AWS_SESSION_TOKEN")
    aws_region: str | None = Field(None, validation_alias=AliasChoices("AWS_DEFAULT_REGION", "AWS_REGION"))
    aws_endpoint_url: str | None = Field(None, alias="AWS_ENDPOINT_URL")
    # Names of other environment variables to hand to runners (credentials of other stores, proxies).
    runner_env_names: str = Field("", alias="TUNEBOT_RUNNER_ENV")

    # Engine.
    approval_above_usd: float = Field(50.0, alias="TUNEBOT_APPROVAL_ABOVE")
    # The largest max_cost (spend cap) a job may ask for at all; above it the request is refused.
    max_cost_limit_usd: float = Field(10_000.0, gt=0, alias="TUNEBOT_MAX_COST_LIMIT")
    # Jobs one person may have running (or about to) at once; 0 = no limit. More are refused at create;
    # an approved one waits for a slot.
    max_running_per_user: int = Field(4, ge=0, le=10_000, alias="TUNEBOT_MAX_RUNNING_PER_USER")
    # The team of jobs launched from the console and the CLI (Slack jobs take the workspace's team id):
    # what team budgets are set for (`budget set team NAME ...`).
    default_team: str = Field("local", min_length=1, max_length=64, alias="TUNEBOT_TEAM")
    heartbeat_timeout_s: float = Field(600.0, alias="TUNEBOT_HEARTBEAT_TIMEOUT")
    idle_stop_minutes: float = Field(30.0, alias="TUNEBOT_IDLE_STOP_MINUTES")
    retry_budget: int = Field(5, alias="TUNEBOT_RETRY_BUDGET")
    reconcile_every_s: float = Field(60.0, alias="TUNEBOT_RECONCILE_EVERY")
    volume_idle_days: float = Field(3.0, alias="TUNEBOT_VOLUME_IDLE_DAYS")
    checkpoint_base_uri: str | None = Field(None, alias="TUNEBOT_CHECKPOINT_URI")
    public_url: str | None = Field(None, alias="TUNEBOT_PUBLIC_URL")  # for runner push events
    report_every_s: float = Field(30.0, gt=0, alias="TUNEBOT_REPORT_EVERY")  # runner progress cadence

    # Slack.
    slack_bot_token: SecretStr | None = Field(None, alias="SLACK_BOT_TOKEN")
    slack_app_token: SecretStr | None = Field(None, alias="SLACK_APP_TOKEN")
    slack_signing_secret: SecretStr | None = Field(None, alias="SLACK_SIGNING_SECRET")
    slack_api_url: str | None = Field(None, alias="SLACK_API_URL")
    summary_channel: str | None = Field(None, alias="TUNEBOT_SUMMARY_CHANNEL")
    summary_time: str = Field("09:00", alias="TUNEBOT_SUMMARY_TIME")
    summary_timezone: str = Field("UTC", alias="TUNEBOT_SUMMARY_TZ")
    # The weekly report (who launched, approved and stopped what; estimates against actual costs; idle
    # volumes; budgets): posted on this day at TUNEBOT_SUMMARY_TIME; "off" for none.
    weekly_report_day: str | None = Field("mon", alias="TUNEBOT_WEEKLY_REPORT_DAY")
    admins: str = Field("", alias="TUNEBOT_ADMINS")  # comma-separated user ids
    # Where Slack launches may happen: "C1,C2" (and "dm" for direct messages); when set, every other channel
    # and DM is refused. Unset: anywhere (bot/engine/permissions.py).
    allowed_channels: str = Field("", alias="TUNEBOT_ALLOWED_CHANNELS")
    # Who may launch in a channel: "C1=U1|U2;C2=U3" (channels not listed: everyone). Admins always may.
    channel_allow: str = Field("", alias="TUNEBOT_CHANNEL_ALLOW")
    # What a Slack user may point the bot at (bot/planner/sources.py): local paths only inside this folder
    # (unset: none), URIs only under these comma-separated prefixes (e.g. "s3://team-bucket/datasets/"),
    # files uploaded to Slack up to this size. The console and the CLI (the operator) are not limited.
    chat_data_dir: Path | None = Field(None, alias="TUNEBOT_CHAT_DATA_DIR")
    chat_storage_prefixes: str = Field("", alias="TUNEBOT_CHAT_STORAGE_PREFIXES")
    slack_max_file_mb: float = Field(512.0, gt=0, alias="TUNEBOT_SLACK_MAX_FILE_MB")

    @field_validator("weekly_report_day", mode="before")
    @classmethod
    def _weekday(cls, value: Any) -> str | None:
        text = str(value or "").strip().lower()[:3]
        if text in ("", "off", "no", "non"):
            return None
        if text not in WEEKDAYS:
            raise ValueError(f"TUNEBOT_WEEKLY_REPORT_DAY: a day (mon..sun) or off, not {value!r}")
        return text

    @model_validator(mode="before")
    @classmethod
    def _read_clouds(cls, data: Any) -> Any:
        """Each discovered cloud's variables, from keyword arguments, the environment, then .env."""
        if not isinstance(data, dict):
            return data
        from bot.providers.registry import cloud_specs

        env_file = cls.model_config.get("env_file")
        dotenv: dict[str, str | None] = {}
        if isinstance(env_file, str) and Path(env_file).is_file():
            from dotenv import dotenv_values

            dotenv = dict(dotenv_values(env_file))

        def value(name: str) -> str | None:
            for source in (data, os.environ, dotenv):
                found = source.get(name)
                if found not in (None, ""):
                    return str(found)
            return None

        clouds = {}
        for name, spec in cloud_specs().items():
            options = {kw: v for kw, env in spec.options.items() if (v := value(env)) is not None}
            clouds[name] = {
                "api_key": value(spec.key_env),
                "api_url": value(spec.url_env) or spec.default_url,
                "options": options,
            }
        return {**data, "TUNEBOT_INTERNAL_CLOUDS": clouds}  # never from the environment itself

    def secrets(self) -> list[str]:
        """Every secret value, for scrubbing logs and messages."""
        values = [
            *(access.api_key for access in self.clouds.values()),
            self.hf_token,
            self.wandb_api_key,
            self.aws_access_key_id,
            self.aws_secret_access_key,
            self.aws_session_token,
            self.slack_bot_token,
            self.slack_app_token,
            self.slack_signing_secret,
        ]
        return [v.get_secret_value() for v in values if v is not None]

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{self.data_dir / 'tunebot.db'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
