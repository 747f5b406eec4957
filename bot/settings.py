"""Configuration from the environment (and an optional .env file), in one place.

Every knob has a default that runs the embedded setup: SQLite in the user's data folder, the local
provider, the terminal chat. Secrets are SecretStr so that they never print by accident.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platformdirs import user_data_dir
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from runner.contract.reading import ReadLimits

# A team's own prebuilt runner image (the Dockerfile; scripts/runner-image.sh builds and pushes it, by default
# under this name): set TUNEBOT_RUNNER_IMAGE to it. Unset, hosts start STOCK_IMAGE and install the runner the
# bot stages in the job's storage (bot/engine/launching/runner_bundle.py): nothing has to be published first.
RUNNER_IMAGE_REPO = "ghcr.io/tunebot/tunebot-runner"
# A public PyTorch CUDA image (the Dockerfile's base; the kind Vast's and RunPod's PyTorch templates start).
STOCK_IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"


MAX_TICK_S = 10.0  # the supervisor looks at every job at least this often (bot/scheduler.py)
MISSED_READS = 3  # heartbeats or ticks in a row a live runner may go unheard before it could look dead


class SettingsError(ValueError):
    """Settings that cannot work (alone or together): one clear message; the CLI exits with code 2."""


def liveness_problem(heartbeat_timeout_s: float, idle_stop_s: float, tick_s: float) -> str | None:
    """Why these settings would let the supervisor count a live, training runner dead or idle, and what to set
    instead; None when they cannot. A runner beats every ``heartbeat.every(timeout)`` seconds whatever
    TUNEBOT_REPORT_EVERY says (runner/contract/heartbeat.py), and the supervisor reads the beats once a tick;
    the timeout must outlast three of each, and the idle limit too (issue 38). Pure."""
    from runner.contract.heartbeat import every

    beat = every(heartbeat_timeout_s)
    need = MISSED_READS * max(tick_s, beat)
    if heartbeat_timeout_s < need:
        per = f"every {tick_s:g} s: TUNEBOT_RECONCILE_EVERY, at most {MAX_TICK_S:g} s"
        return (
            f"TUNEBOT_HEARTBEAT_TIMEOUT={heartbeat_timeout_s:g} would count live runners dead: the "
            f"supervisor reads each runner's heartbeat once a tick ({per}) and a runner beats every "
            f"{beat:g} s, so one or two slow reads would end a healthy run. Set TUNEBOT_HEARTBEAT_TIMEOUT to "
            f"{need:g} or more"
            + (
                f" (or TUNEBOT_RECONCILE_EVERY to {heartbeat_timeout_s / MISSED_READS:.3g} or less)."
                if tick_s > beat and heartbeat_timeout_s >= MISSED_READS * beat
                else "."
            )
        )
    if idle_stop_s < need:
        return (
            f"TUNEBOT_IDLE_STOP_MINUTES={idle_stop_s / 60:g} would stop training runners as idle: their "
            f"progress is read from heartbeats every {beat:g} s, once a tick of {tick_s:g} s. Set "
            f"TUNEBOT_IDLE_STOP_MINUTES to {need / 60:g} or more."
        )
    return None


def default_data_dir() -> Path:
    return Path(user_data_dir("tunebot", appauthor=False))


def prebuilt_runner_image() -> str:
    """The name scripts/runner-image.sh pushes this release's prebuilt image under (its runner speaks this
    bot's JobSpec version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{RUNNER_IMAGE_REPO}:{version('tunebot')}"
    except PackageNotFoundError:
        return f"{RUNNER_IMAGE_REPO}:latest"


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ENV_FILE = ".env"  # read after the environment (bot/providers/registry.py reads the cloud variables too)


class Settings(BaseSettings):
    """Every knob, with its environment variable and a description: docs/configuration.md's settings table is
    generated from these (scripts/settings_doc.py; tests/test_settings_doc.py keeps them equal)."""

    model_config = SettingsConfigDict(env_file=ENV_FILE, env_file_encoding="utf-8", extra="ignore")

    data_dir: Path = Field(
        default_factory=default_data_dir,
        alias="TUNEBOT_DATA_DIR",
        description="the bot's folder: the SQLite store, calibration, Slack uploads (default: the user's "
        "data folder)",
    )
    database_url: str | None = Field(
        None,
        alias="DATABASE_URL",
        description="the store: a PostgreSQL URL; unset, a SQLite file in TUNEBOT_DATA_DIR",
    )

    provider_timeout_s: float = Field(
        10.0,
        gt=0,
        alias="TUNEBOT_PROVIDER_TIMEOUT",
        description="seconds a cloud API call may take, its retries included (the connection at most 5 s): "
        "an unreachable cloud answers within this",
    )
    catalog_ttl_s: float = Field(
        300.0, alias="TUNEBOT_CATALOG_TTL", description="seconds live prices are reused"
    )
    catalog_deadline_s: float = Field(
        8.0,
        gt=0,
        alias="TUNEBOT_CATALOG_DEADLINE",
        description="seconds a live listing waits for all clouds together; a cloud still silent then is "
        "priced from its dated snapshot, with a note",
    )
    price_tolerance: float = Field(
        0.10,
        alias="TUNEBOT_PRICE_TOLERANCE",
        description="a launch stops if the live price rose more than this fraction over the estimate's",
    )
    min_reliability: float = Field(
        0.95,
        alias="TUNEBOT_MIN_RELIABILITY",
        description="offers whose host reliability (as the cloud reports it, 0-1) is below this are not "
        "ranked",
    )
    runner_image: str | None = Field(
        None,
        alias="TUNEBOT_RUNNER_IMAGE",
        description="a prebuilt runner image GPU hosts pull (scripts/runner-image.sh pushes one, by default "
        "as ghcr.io/tunebot/tunebot-runner:<this version>); unset: hosts start TUNEBOT_STOCK_IMAGE and "
        "install the runner the bot stages in the job's storage. Checked in its registry before anything is "
        "rented",
    )
    stock_image: str = Field(
        STOCK_IMAGE,
        alias="TUNEBOT_STOCK_IMAGE",
        description="the public PyTorch CUDA image hosts start when TUNEBOT_RUNNER_IMAGE is unset; the "
        "runner is installed next to its torch at every start (about 1.5 min, priced as start-up time)",
    )
    registry_username: str | None = Field(
        None,
        alias="TUNEBOT_REGISTRY_USERNAME",
        description="a login the bot checks the runner image with (a registry that wants one even to pull); "
        "unset: anonymous, as hosts pull it",
    )
    registry_password: SecretStr | None = Field(
        None, alias="TUNEBOT_REGISTRY_PASSWORD", description="the password or token of that login"
    )
    runner_flash_attention: bool = Field(
        False,
        alias="TUNEBOT_RUNNER_FLASH_ATTN",
        description="the runner image has flash-attention 2 (--build-arg FLASH_ATTN=1); attn=flash is "
        "refused otherwise",
    )
    local_provider: bool | None = Field(
        None,
        alias="TUNEBOT_LOCAL_PROVIDER",
        description="the local CPU provider (the runner on this machine): unset, on for the console, demo, "
        "CLI and a `tunebot serve` without Slack, off in a Slack `tunebot serve`; 1/0 forces it",
    )
    start_supervisor: bool = Field(
        True,
        alias="TUNEBOT_START_SUPERVISOR",
        description="a CLI command that leaves a job active (launch, approve, resume, clone) while no "
        "supervisor is alive starts one in the background (`tunebot serve --auto`, log in TUNEBOT_DATA_DIR, "
        "gone 5 min after the last active job); 0: it only says so",
    )
    local_max_hours: float = Field(
        1.0,
        alias="TUNEBOT_LOCAL_MAX_HOURS",
        description="the local provider is offered only for jobs this short",
    )
    local_prewarm: bool = Field(
        True,
        alias="TUNEBOT_LOCAL_PREWARM",
        description="a process that launches local runners more than once (serve, console, demo) forks "
        "them from a process that has imported torch (seconds of CPU saved per start; it ends 10 min after "
        "the last start or with the bot); 0: each runner starts as a fresh `python -P -m runner.cli`",
    )

    # Secrets passed to runners as environment variables, never in specs or messages.
    hf_token: SecretStr | None = Field(
        None,
        alias="HF_TOKEN",
        description="Hugging Face token of the bot: Hub pushes (done by the bot) and the planner's reads; "
        "never given to a runner",
    )
    hf_read_token: SecretStr | None = Field(
        None,
        alias="TUNEBOT_HF_READ_TOKEN",
        description="a fine-grained read-only Hugging Face token (read access to the gated repos you train "
        "on): the only Hub token a runner gets, as HF_TOKEN, for a gated or private base model",
    )
    hf_endpoint: str | None = Field(
        None,
        alias="HF_ENDPOINT",
        description="a Hub mirror or enterprise endpoint: where the bot reads model configs and tokenizers, "
        "checks model access, and runners download from and push to (TUNEBOT_HF_URL: its former name, for "
        "the bot's reads). HF_HUB_OFFLINE=1 without it: the bot asks no Hub; TUNEBOT_HF_OFFLINE=1: the bot's "
        "estimates ask no Hub even with it (runners unaffected)",
    )
    wandb_api_key: SecretStr | None = Field(
        None,
        alias="WANDB_API_KEY",
        description="W&B key: runs log online, the run link goes to the job's thread",
    )
    wandb_project: str = Field("tunebot", alias="WANDB_PROJECT", description="the W&B project of the runs")
    wandb_entity: str | None = Field(
        None, alias="WANDB_ENTITY", description="the W&B entity (team) of the runs"
    )
    wandb_mode: str | None = Field(
        None,
        alias="WANDB_MODE",
        description="offline: runners log W&B files kept with the checkpoints (`wandb sync` them later; no "
        "key needed); disabled: no W&B. A W&B that does not answer costs a run seconds, not minutes: it "
        "logs offline and the job's thread says so",
    )
    # Object storage for checkpoints and staged inputs (TUNEBOT_CHECKPOINT_URI): the runner gets these as
    # environment variables of its instance. AWS_ENDPOINT_URL points at any S3-compatible store.
    aws_access_key_id: SecretStr | None = Field(
        None,
        alias="AWS_ACCESS_KEY_ID",
        description="object storage key (staging inputs, reading progress; runners)",
    )
    aws_secret_access_key: SecretStr | None = Field(
        None, alias="AWS_SECRET_ACCESS_KEY", description="object storage secret"
    )
    aws_session_token: SecretStr | None = Field(
        None, alias="AWS_SESSION_TOKEN", description="object storage session token (temporary credentials)"
    )
    aws_region: str | None = Field(
        None,
        validation_alias=AliasChoices("AWS_DEFAULT_REGION", "AWS_REGION"),
        description="object storage region",
    )
    aws_endpoint_url: str | None = Field(
        None, alias="AWS_ENDPOINT_URL", description="an S3-compatible store's endpoint (R2, MinIO, ...)"
    )
    runner_env_names: str = Field(
        "",
        alias="TUNEBOT_RUNNER_ENV",
        description="names of further environment variables to pass to runners (other stores' credentials, "
        "proxies)",
    )
    secret_key: SecretStr | None = Field(
        None,
        alias="TUNEBOT_SECRET_KEY",
        description="master key of the per-job integrity keys runners sign their events and checkpoints with "
        "(docs/security.md); unset: one is made once and kept in the database",
    )
    storage_credentials: str = Field(
        "auto",
        alias="TUNEBOT_STORAGE_CREDENTIALS",
        pattern=r"^(auto|assume-role|federation|r2|static)$",
        description="what a runner gets for object storage: credentials scoped to its job, made per launch "
        "(assume-role: STS AssumeRole, AWS or MinIO; federation: STS GetFederationToken, AWS; r2: "
        "Cloudflare's temporary credentials) or static (the bot's own keys: any host reaches every job's "
        "data; warned at start and on every launch). auto: r2 on an R2 endpoint with CLOUDFLARE_API_TOKEN, "
        "assume-role with TUNEBOT_STORAGE_ROLE_ARN, federation on AWS, else static",
    )
    storage_role_arn: str | None = Field(
        None,
        alias="TUNEBOT_STORAGE_ROLE_ARN",
        description="the role runners' credentials are made from (STS AssumeRole; on MinIO any ARN); its own "
        "policy caps what the job scope may grant",
    )
    storage_credentials_s: int = Field(
        12 * 3600,
        ge=10,
        le=7 * 24 * 3600,
        alias="TUNEBOT_STORAGE_CREDENTIALS_SECONDS",
        description="lifetime of a runner's storage credentials (STS: 900 s to the role's maximum, 36 h for "
        "federation; R2 up to 7 days); the bot renews them at half-life while the job runs",
    )
    sts_endpoint_url: str | None = Field(
        None,
        alias="TUNEBOT_STS_ENDPOINT_URL",
        description="the STS endpoint (default: AWS_ENDPOINT_URL when set, e.g. MinIO's, else AWS's)",
    )
    cloudflare_api_token: SecretStr | None = Field(
        None,
        alias="CLOUDFLARE_API_TOKEN",
        description="a Cloudflare API token allowed to make R2 temporary credentials (scoped R2 storage)",
    )
    cloudflare_api_url: str = Field(
        "https://api.cloudflare.com/client/v4",
        alias="CLOUDFLARE_API_URL",
        description="Cloudflare's API base URL (tests: a fake)",
    )
    r2_account_id: str | None = Field(
        None,
        alias="TUNEBOT_R2_ACCOUNT_ID",
        description="the Cloudflare account of the R2 bucket (default: read from AWS_ENDPOINT_URL)",
    )

    # Engine.
    approval_above_usd: float = Field(
        50.0,
        alias="TUNEBOT_APPROVAL_ABOVE",
        description="jobs that may cost more than this many dollars (the higher of the estimate and "
        "max_cost) need someone else's approval; a fallback offer projected above what was accepted asks "
        "again",
    )
    max_cost_limit_usd: float = Field(
        10_000.0,
        gt=0,
        alias="TUNEBOT_MAX_COST_LIMIT",
        description="the largest max_cost (spend cap) a job may ask for; above it the request is refused",
    )
    max_running_per_user: int = Field(
        4,
        ge=0,
        le=10_000,
        alias="TUNEBOT_MAX_RUNNING_PER_USER",
        description="jobs one person may run (or be starting) at once; 0 = no limit. More are refused at "
        "create; an approved one waits for a slot",
    )
    hub_namespaces: str = Field(
        "",
        alias="TUNEBOT_HUB_NAMESPACES",
        description="the Hub users / organizations tunebot may create repos in (acme,acme-research); unset, "
        "push_to_hub is refused. A push never goes into a repo the job did not create; public=yes needs an "
        "admin's approval",
    )
    default_team: str = Field(
        "local",
        min_length=1,
        max_length=64,
        alias="TUNEBOT_TEAM",
        description="the team of console and CLI jobs (Slack jobs take the workspace's id): what `budget "
        "set team NAME` covers",
    )
    heartbeat_timeout_s: float = Field(
        600.0,
        alias="TUNEBOT_HEARTBEAT_TIMEOUT",
        description="seconds without a heartbeat or event from a running job's runner before it counts as "
        "preempted and is relaunched; runners beat every quarter of it (at most 30 s) whatever "
        "TUNEBOT_REPORT_EVERY says; under three supervisor ticks it is refused at start",
    )
    idle_stop_minutes: float = Field(
        30.0,
        alias="TUNEBOT_IDLE_STOP_MINUTES",
        description="a running instance whose runner makes no progress (no step in its heartbeat, no event) "
        "for this long is stopped (reason idle)",
    )
    stop_grace_s: float = Field(
        300.0,
        gt=0,
        alias="TUNEBOT_STOP_GRACE",
        description="the most seconds a stopped cloud job waits for its runner to save and report a "
        "checkpoint before its instance is terminated (each job waits a heartbeat, a step and a save by its "
        "quote, up to this; billed)",
    )
    retry_budget: int = Field(
        5,
        alias="TUNEBOT_RETRY_BUDGET",
        description="relaunches after preemptions before a job fails (retry budget)",
    )
    cloud_down_give_up_s: float = Field(
        1800.0,
        gt=0,
        alias="TUNEBOT_CLOUD_DOWN_GIVE_UP",
        description="seconds a recovering job waits for its cloud to confirm its lost instance is gone (an "
        "API that does not answer) before it fails with reason `cloud unreachable`",
    )
    reconcile_every_s: float = Field(
        60.0,
        alias="TUNEBOT_RECONCILE_EVERY",
        description="seconds between comparing every cloud's instances with the database (adopt, terminate "
        "strays)",
    )
    volume_idle_days: float = Field(
        3.0,
        alias="TUNEBOT_VOLUME_IDLE_DAYS",
        description="a volume unused this many days is idle: reminders with Delete / Keep, App Home, weekly "
        "report",
    )
    checkpoint_base_uri: str | None = Field(
        None,
        alias="TUNEBOT_CHECKPOINT_URI",
        description="where checkpoints, outputs and staged inputs go (any fsspec URI, e.g. "
        "s3://bucket/tunebot); cloud jobs need object storage here",
    )
    public_url: str | None = Field(
        None,
        alias="TUNEBOT_PUBLIC_URL",
        description="the bot's public URL: runners push events to /runner/events; unset, the bot pulls them, "
        "and `tunebot serve` listens on 127.0.0.1 only (Socket Mode too; --host overrides)",
    )
    report_every_s: float = Field(
        30.0,
        gt=0,
        alias="TUNEBOT_REPORT_EVERY",
        description="seconds between a runner's progress reports "
        "(any value: liveness comes from its heartbeat)",
    )

    # Slack.
    slack_bot_token: SecretStr | None = Field(
        None, alias="SLACK_BOT_TOKEN", description="the bot token (xoxb-...)"
    )
    slack_app_token: SecretStr | None = Field(
        None,
        alias="SLACK_APP_TOKEN",
        description="the app-level token for Socket Mode (xapp-..., connections:write)",
    )
    slack_signing_secret: SecretStr | None = Field(
        None,
        alias="SLACK_SIGNING_SECRET",
        description="the signing secret for HTTP mode (`tunebot serve --http`)",
    )
    slack_api_url: str | None = Field(
        None,
        alias="SLACK_API_URL",
        description="Web API base URL (default https://slack.com/api/; tests: a fake)",
    )
    summary_channel: str | None = Field(
        None,
        alias="TUNEBOT_SUMMARY_CHANNEL",
        description="channel id for the daily summary, the weekly report and idle-volume reminders",
    )
    summary_time: str = Field(
        "09:00",
        alias="TUNEBOT_SUMMARY_TIME",
        description="when the daily summary (and weekly report) is posted",
    )
    summary_timezone: str = Field("UTC", alias="TUNEBOT_SUMMARY_TZ", description="the time zone of that time")
    weekly_report_day: str | None = Field(
        "mon",
        alias="TUNEBOT_WEEKLY_REPORT_DAY",
        description="the day of the weekly report (who launched, approved and stopped what; estimates "
        "against actual costs; idle volumes; budgets), or off",
    )
    admins: str = Field(
        "",
        alias="TUNEBOT_ADMINS",
        description="comma-separated Slack user ids who approve and stop others' jobs, see everyone's jobs "
        "and spend, set budgets and delete anyone's tracked volumes; unset, no member approves or sets "
        "budgets: the operator does on the bot's machine (`tunebot approve JOB`, `tunebot budget set ...`; "
        "`serve` warns). The CLI and the console act as the operator, an admin",
    )
    team_read: bool = Field(
        False,
        alias="TUNEBOT_TEAM_READ",
        description="1: every member sees every job, chart, spend and budget (/tune jobs all, status, spend, "
        "budget); unset, a member sees their own and admins everyone's. Acting on a job stays its owner's "
        "and the admins'",
    )
    volumes_cache_s: float = Field(
        60.0,
        ge=0,
        alias="TUNEBOT_VOLUMES_CACHE_SECONDS",
        description="/tune volumes answers from the clouds' volume listing at most this old (shared by "
        "everyone), so repeated asks do not list every cloud again",
    )
    volumes_per_minute: int = Field(
        4,
        ge=1,
        alias="TUNEBOT_VOLUMES_PER_MINUTE",
        description="how often one member may ask /tune volumes per minute (admins and the operator too); "
        "more get a message saying when to ask again",
    )
    allowed_channels: str = Field(
        "",
        alias="TUNEBOT_ALLOWED_CHANNELS",
        description="where Slack launches may happen: C1,C2 (add dm for direct messages); when set, every "
        "other channel and DM is refused, admins included. Unset: anywhere (`serve` warns)",
    )
    channel_allow: str = Field(
        "",
        alias="TUNEBOT_CHANNEL_ALLOW",
        description="who may launch in a listed channel: C1=U1|U2;C2=U3 (other channels: everyone; admins "
        "always)",
    )
    chat_data_dir: Path | None = Field(
        None,
        alias="TUNEBOT_CHAT_DATA_DIR",
        description="the one folder on the bot's host whose files Slack users may name; unset, no local "
        "paths from Slack (the console and CLI may name any)",
    )
    chat_storage_prefixes: str = Field(
        "",
        alias="TUNEBOT_CHAT_STORAGE_PREFIXES",
        description="comma-separated URI prefixes Slack users may name (e.g. s3://team-bucket/datasets/); "
        "other URIs are refused, hf:// always allowed",
    )
    slack_max_file_mb: float = Field(
        512.0,
        gt=0,
        alias="TUNEBOT_SLACK_MAX_FILE_MB",
        description="the largest Slack upload used as a dataset (dataset=slack:F...)",
    )

    # Bounded work for untrusted input (docs/slack-setup.md, "Limits on what the bot reads"): datasets are
    # read in chunks (runner/contract/reading.py), slow commands on their own pool (bot/chat/slowwork.py).
    dataset_sample_records: int = Field(
        10_000,
        gt=0,
        alias="TUNEBOT_DATASET_SAMPLE_RECORDS",
        description="an estimate counts tokens on at most this many records of a dataset and scales up by "
        "the share of the file read (the card says so)",
    )
    dataset_sample_mb: float = Field(
        64.0,
        gt=0,
        alias="TUNEBOT_DATASET_SAMPLE_MB",
        description="the most of a dataset (MB, decompressed) one estimate or pre-launch check reads; past "
        "it the count is scaled from the sample",
    )
    dataset_max_line_mb: float = Field(
        8.0,
        gt=0,
        alias="TUNEBOT_DATASET_MAX_LINE_MB",
        description="a dataset record (one jsonl line) longer than this many MB is refused, never held",
    )
    dataset_max_ratio: float = Field(
        100.0,
        gt=1,
        alias="TUNEBOT_DATASET_MAX_RATIO",
        description="a compressed dataset (.gz, .bz2, .xz, .zip) expanding more than this many times is "
        "refused (a compression bomb)",
    )
    dataset_read_seconds: float = Field(
        30.0,
        gt=0,
        alias="TUNEBOT_DATASET_READ_SECONDS",
        description="seconds one read of a dataset may take before it is refused",
    )
    slow_workers: int = Field(
        4,
        gt=0,
        alias="TUNEBOT_SLOW_WORKERS",
        description="threads for slow Slack commands (estimates, launches: dataset reads, Hub and Slack "
        "downloads), apart from the rest, so nobody's /tune jobs waits behind them",
    )
    slow_per_user: int = Field(
        2,
        gt=0,
        alias="TUNEBOT_SLOW_PER_USER",
        description="slow commands one person runs at once; more wait their turn (8 at most)",
    )
    slow_deadline_s: float = Field(
        120.0,
        gt=0,
        alias="TUNEBOT_SLOW_DEADLINE",
        description='seconds after which a slow command is answered "took too long" whatever it is doing',
    )
    http_max_body_kb: int = Field(
        1024,
        gt=0,
        alias="TUNEBOT_HTTP_MAX_BODY_KB",
        description="the largest body /slack/events and /runner/events read (KB); bigger is 413 before it is "
        "read, and nothing is parsed before its Slack signature or runner token checks out",
    )

    @property
    def tick_every_s(self) -> float:
        """How often the supervisor looks at every running job (bot/scheduler.py): the reconcile period,
        at most 10 s."""
        return min(self.reconcile_every_s, MAX_TICK_S)

    @model_validator(mode="after")
    def _liveness(self) -> Settings:
        """Refuse, at start, what would count a live runner dead or idle (``liveness_problem``)."""
        problem = liveness_problem(self.heartbeat_timeout_s, self.idle_stop_minutes * 60, self.tick_every_s)
        if problem:
            raise SettingsError(problem)
        return self

    @field_validator("weekly_report_day", mode="before")
    @classmethod
    def _weekday(cls, value: Any) -> str | None:
        text = str(value or "").strip().lower()[:3]
        if text in ("", "off", "no", "non"):
            return None
        if text not in WEEKDAYS:
            raise ValueError(f"TUNEBOT_WEEKLY_REPORT_DAY: a day (mon..sun) or off, not {value!r}")
        return text

    def secrets(self) -> list[str]:
        """Every secret value of these settings, for scrubbing logs and messages (the cloud keys are the
        registry's: bot/providers/registry.secrets adds them)."""
        values = [
            self.hf_token,
            self.hf_read_token,
            self.registry_password,
            self.wandb_api_key,
            self.aws_access_key_id,
            self.aws_secret_access_key,
            self.aws_session_token,
            self.slack_bot_token,
            self.slack_app_token,
            self.slack_signing_secret,
            self.secret_key,
            self.cloudflare_api_token,
        ]
        return [v.get_secret_value() for v in values if v is not None]

    def dataset_limits(self) -> ReadLimits:
        """What one read of a dataset someone pointed the bot at may cost (runner/contract/reading.py)."""
        from runner.contract.reading import ReadLimits

        return ReadLimits(
            sample_records=self.dataset_sample_records,
            sample_bytes=int(self.dataset_sample_mb * (1 << 20)),
            max_line_bytes=int(self.dataset_max_line_mb * (1 << 20)),
            max_ratio=self.dataset_max_ratio,
            seconds=self.dataset_read_seconds,
            settings={
                "line": "TUNEBOT_DATASET_MAX_LINE_MB",
                "ratio": "TUNEBOT_DATASET_MAX_RATIO",
                "seconds": "TUNEBOT_DATASET_READ_SECONDS",
            },
        )

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{self.data_dir / 'tunebot.db'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process; SettingsError (one line per problem, no pydantic noise) when they cannot
    work: every command exits with code 2 and the message (bot/cli.py)."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(readable(exc)) from None


def readable(exc: ValidationError) -> str:
    """A settings validation error as a person reads it: each problem's own message (the variable it names
    first), never the values read (a secret among them)."""
    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        where = ".".join(str(p) for p in err.get("loc", ()))
        lines.append(f"{where}: {msg}" if where and where not in msg else msg)
    return "; ".join(lines) or str(exc)
