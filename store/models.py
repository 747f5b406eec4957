"""The database tables: jobs, instances, volumes, spend ledger, runner events, budgets, audit, leases.

Money is state: every instance that may bill has a row here before (or, after a crash, soon after)
it exists at a provider, and spend is always computed from the price locked in these rows, never from
today's catalog. Times are UTC epoch seconds (floats): comparisons and arithmetic stay exact and
portable between SQLite and PostgreSQL, and a fake clock in tests is a plain number.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_finished_state", "finished_at", "state"),)  # jobs finished in a day

    id: str = Field(primary_key=True, max_length=64)
    owner: str = Field(index=True)
    team: str | None = Field(default=None, index=True)
    channel: str | None = None
    thread_ts: str | None = None
    state: str = Field(index=True)  # a JobState
    stop_reason: str | None = None  # plateau | budget | user | idle | ...
    stop_requested_at: float | None = None  # a graceful stop was sent; the exit ends the job
    message: str | None = None  # last human-readable reason (failures, refusals)

    request: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # EstimateRequest JSON
    choice: str = "cheapest"
    offer: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # chosen RankedOffer JSON
    offers: list[Any] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))  # fallbacks
    # The training plan, stored once: the estimate's TrainingPlan as the runner's JobSpec fields (staged
    # input locations and any caller extras included), decided at creation; a launch adds only what
    # depends on the offer and the moment (bot/engine/launching/launch.py build_spec).
    plan: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    provider: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    interruptible: bool = False
    price_per_hour: float | None = None  # locked: the accepted price, then the current instance's price
    estimated_cost: float | None = None
    estimated_hours: float | None = None
    max_cost: float | None = None
    # The spend accepted for the job: by a person, its cap; automatically, the lower of its cap and the
    # approval amount. A launch never rents an offer projected above it without asking again.
    approved_cost: float | None = None
    # The hourly price accepted with it: a relaunch on another offer (preemption, out of memory, resume) rents
    # nothing pricier per hour than this (within TUNEBOT_PRICE_TOLERANCE) without asking again.
    approved_price_per_hour: float | None = None
    checkpoint_minutes: float | None = None

    idempotency_key: str | None = Field(default=None, unique=True, max_length=200)
    token_hash: str | None = None  # sha256 of the runner's bearer token; the token itself is never stored
    approved_by: str | None = None
    claim_id: str | None = None  # who holds the launch claim (state launching)
    claimed_at: float | None = None
    retry_count: int = 0
    preemptions: int = 0
    checkpoint_uri: str | None = None  # the job's checkpoint folder (every run of it resumes from there)
    output_uri: str | None = None  # the final output, once the runner saved one (finished, plateau)
    # The newest complete checkpoint (a loadable adapter or model): a stopped or failed job's result.
    last_checkpoint_uri: str | None = None
    last_checkpoint_step: int | None = None

    outcome: str | None = None  # the runner's terminal event: finished | plateau | failed
    last_event_seq: int = -1
    last_event_at: float | None = None
    last_step: int = 0
    max_steps: int | None = None
    last_loss: float | None = None
    eta_seconds: float | None = None
    # The window of the runner's progress object last stored: "digest first_seq last_seq newest_ts"
    # (bot/engine/monitor.py). A restarted bot skips what it had read instead of re-checking it all.
    progress_window: str | None = Field(default=None, max_length=96)
    spend: float = 0.0  # cached roll-up of the instances' locked-price spend (see bot/engine/record/spend.py)
    # When the last provider create call was sent: where a provider does not say when it created an
    # instance, billing starts here (an instance adopted after a crash is not billed from its adoption).
    launch_requested_at: float | None = None
    # Decided before renting (bot/planner/disk.py, bot/engine/launching/preflight.py): the disk every create
    # call asks for (None: jobs from before; 100 GB), and how long a new instance may take to start the
    # runner.
    disk_gb: float | None = None
    start_deadline_s: float | None = None
    # The runner's storage credentials (bot/storage/credentials.py): when the current ones were made and
    # when they expire; the bot renews them at half-life (bot/engine/watching/renewal.py). None: not expiring.
    credentials_issued_at: float | None = None
    credentials_expire_at: float | None = None
    # The job's current run (bot/engine/record/runs.py): the launch whose key the bot accepts events from.
    # None between runs (the last one ended: preempted, finished, stopped) and before the first.
    run_id: str | None = Field(default=None, max_length=64)
    # The Hub push the bot does itself (bot/engine/outcome/hub_push.py): pending | pushing | pushed | failed,
    # with when a process took it (a push whose process died is taken again) and the repo's URL once pushed.
    hub_state: str | None = Field(default=None, max_length=16)
    hub_claimed_at: float | None = None
    hub_url: str | None = Field(default=None, max_length=300)

    # What the money bought (the runner's results event, bounded): eval loss before and after, the result's
    # step and why, the side-by-side answers (runner.contract.spec.RunResults as JSON).
    results: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    sweep_id: str | None = Field(default=None, index=True, max_length=64)  # one configuration of a sweep

    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None


class JobRun(SQLModel, table=True):
    """One run of a job: one launch (first start, relaunch after a preemption, resume, growth, a start retried
    on another host), with its own integrity key (derived from the master key, the job id, the run id and
    ``secret``: bot/engine/launching/integrity.py), its own folder ``<job folder>/runs/<id>/`` and storage
    credentials for that folder alone. The bot accepts what the run signs only while it is the job's current
    run (``jobs.run_id``); ``ended_at`` is when it stopped being that."""

    __tablename__ = "job_runs"

    id: str = Field(primary_key=True, max_length=64)
    job_id: str = Field(index=True, max_length=64)
    number: int = 1  # 1, 2, ... within the job (for people)
    secret: str = Field(max_length=128)  # hex; never leaves the bot (the key is derived from it)
    created_at: float
    ended_at: float | None = None
    end_reason: str | None = None
    instance: str | None = None  # "<provider>:<instance id>" once an instance runs it
    # The acknowledged checkpoints this run may resume from (JobSpec.resume), fixed at its launch: its
    # storage credentials read them (bot/storage/scope.py).
    resume: list[Any] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # The output this run reported in its signed terminal event, and its manifest's digest: what the bot
    # pushes to the Hub (bot/engine/outcome/hub_push.py).
    output_uri: str | None = None
    output_manifest_sha256: str | None = Field(default=None, max_length=64)
    # When the bot deleted this run's folder, all but what it pinned, once a newer run replaced it and its
    # storage credentials had expired (bot/engine/watching/pruning.py). None: not pruned.
    pruned_at: float | None = None


class RunCheckpoint(SQLModel, table=True):
    """A checkpoint the bot acknowledged: announced by a signed event of the run that wrote it, while that run
    was the job's current run, with its manifest's SHA-256. Only these are resumed from."""

    __tablename__ = "run_checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "run_id", "step", name="uq_run_checkpoint_step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, max_length=64)
    run_id: str = Field(max_length=64)
    step: int
    uri: str
    manifest_sha256: str = Field(max_length=64)
    acknowledged_at: float


class Sweep(SQLModel, table=True):
    """A search for the best run within a budget (bot/engine/control/sweeps.py): configurations trained by
    successive halving, the losers stopped at each stage, never more than ``max_cost`` in total (per-run caps
    reserved so that their sum cannot pass it)."""

    __tablename__ = "sweeps"

    id: str = Field(primary_key=True, max_length=64)
    owner: str = Field(index=True)
    team: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    state: str = Field(index=True)  # pending_approval | running | done | stopped | failed | cancelled
    message: str | None = None
    request: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # the EstimateRequest shared
    grid: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # {request field: [values]}
    plan: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # stages, costs, the reserve
    runs: list[Any] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))  # one per config
    max_cost: float
    estimated_cost: float | None = None
    stage: int = 0  # the stage being trained (0: all configurations)
    winner: str | None = Field(default=None, max_length=64)  # the winning job
    approved_by: str | None = None
    idempotency_key: str | None = Field(default=None, unique=True, max_length=200)
    created_at: float
    updated_at: float
    finished_at: float | None = None


class Instance(SQLModel, table=True):
    __tablename__ = "instances"
    __table_args__ = (
        UniqueConstraint("provider", "provider_instance_id", name="uq_instance_provider_id"),
        Index("ix_instances_open_job", "ended_at", "job_id"),  # the open rows of many jobs (a tick)
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str = Field(index=True)
    provider_instance_id: str
    job_id: str | None = Field(default=None, index=True)
    label: str | None = None
    offer_id: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    price_per_hour: float  # locked at launch: spend = billed seconds x this
    launched_at: float  # billing start: the provider's created_at, else the job's launch_requested_at
    created_at: float | None = None  # the provider's own creation time, where its API gives one
    ended_at: float | None = Field(default=None, index=True)  # confirmed gone at the provider
    status: str = "provisioning"
    raw_status: str | None = None
    exit_code: int | None = None
    last_seen_at: float | None = None
    end_reason: str | None = None  # finished | preempted | stopped | stray | duplicate | lost | ...
    adopted: bool = False


class VolumeRecord(SQLModel, table=True):
    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("provider", "volume_id", name="uq_volume_provider_id"),)

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    volume_id: str
    name: str = ""
    size_gb: float = 0.0
    price_per_gb_month: float = 0.0
    # Tracked: tunebot created or attached it (for a job, whose owner is the volume's owner). Only
    # tracked volumes may be deleted or kept from chat; the others are listed as the provider's.
    tracked: bool = False
    owner: str | None = None
    job_id: str | None = Field(default=None, max_length=64)
    first_seen_at: float
    last_used_at: float | None = None
    idle_since: float | None = None
    reminded_at: float | None = None
    keep_until: float | None = None
    deleted_at: float | None = None
    deleted_by: str | None = None


class SpendEntry(SQLModel, table=True):
    """One line of the ledger: an instance (or volume) over one UTC day at its locked price."""

    __tablename__ = "spend_ledger"
    __table_args__ = (
        UniqueConstraint("source", "period_start", name="uq_spend_source_period"),
        # covering indexes of the summary's and the budgets' aggregates (migration 0004_i12)
        Index("ix_spend_period_owner_amount", "period_start", "owner", "amount"),
        Index("ix_spend_period_provider_amount", "period_start", "provider", "amount"),
        Index("ix_spend_owner_period_amount", "owner", "period_start", "amount"),
        Index("ix_spend_team_period_amount", "team", "period_start", "amount"),
    )

    id: int | None = Field(default=None, primary_key=True)
    source: str  # "instance:<row id>" | "volume:<provider>:<id>"
    kind: str  # compute | storage
    job_id: str | None = Field(default=None, index=True)
    owner: str | None = Field(default=None, index=True)
    team: str | None = None
    provider: str | None = None
    period_start: float = Field(index=True)  # UTC midnight of the day
    seconds: float = 0.0
    rate_per_hour: float = 0.0
    amount: float = 0.0
    updated_at: float = 0.0


class RunnerEventRecord(SQLModel, table=True):
    __tablename__ = "runner_events"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_runner_event_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    seq: int
    kind: str
    step: int = 0
    loss: float | None = None
    at: float
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class Budget(SQLModel, table=True):
    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("scope", "name", name="uq_budget_scope_name"),)

    id: int | None = Field(default=None, primary_key=True)
    scope: str  # user | team
    name: str
    daily: float | None = None
    monthly: float | None = None
    updated_by: str | None = None
    updated_at: float = 0.0


class BudgetAlert(SQLModel, table=True):
    """An alert level sent for one budget period; the unique key makes each level fire once."""

    __tablename__ = "budget_alerts"
    __table_args__ = (UniqueConstraint("scope", "name", "period", "level", name="uq_budget_alert"),)

    id: int | None = Field(default=None, primary_key=True)
    scope: str
    name: str
    period: str  # "day:2026-12-02" | "month:2026-12"
    level: int  # 80 | 90 | 100
    spent: float
    limit: float
    at: float


class AuditLog(SQLModel, table=True):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_job_at", "job_id", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    at: float
    actor: str  # a user id, or "engine", "reconciler", "scheduler"
    action: str  # e.g. "transition:approved->launching", "terminate", "adopt"
    job_id: str | None = None
    details: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class SchedulerLease(SQLModel, table=True):
    """The scheduler leader's lease (used where no advisory lock is available)."""

    __tablename__ = "scheduler_lease"

    name: str = Field(primary_key=True)
    holder: str
    expires_at: float
    renewed_at: float


class TaskRun(SQLModel, table=True):
    """One run of a periodic task for one period: the unique key makes a period run once."""

    __tablename__ = "task_runs"
    __table_args__ = (UniqueConstraint("task", "period_key", name="uq_task_period"),)

    id: int | None = Field(default=None, primary_key=True)
    task: str
    period_key: str
    holder: str
    started_at: float
    finished_at: float | None = None
    ok: bool | None = None
    message: str | None = None


class CalibrationRun(SQLModel, table=True):
    """One finished run's measurements with the configuration that produced them (bot/planner/calibration.py).

    Recorded by the engine when a runner reports its terminal event, or imported by `tunebot calibrate
    import`.
    """

    __tablename__ = "calibration_runs"

    id: int | None = Field(default=None, primary_key=True)
    # the job's id, or "import:<content hash>" for imported rows (the same row imported twice is one row)
    job_id: str | None = Field(default=None, unique=True, max_length=64)
    source: str = "run"  # run | import
    recorded_at: float = Field(index=True)
    gpu: str = Field(index=True)
    gpus: int = 1
    request: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # EstimateRequest fields
    max_memory_reserved_gb: float | None = None
    device_memory_used_gb: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    # Who reported it (bot/planner/calibration.py): the rented host ("<provider>:<offer>", "local" for the
    # bot's own machine; None for an import) and the job's owner; an admin's exclusion (`calibrate exclude`).
    host: str | None = Field(default=None, max_length=200)
    owner: str | None = Field(default=None, max_length=200)
    excluded_at: float | None = None
    excluded_by: str | None = Field(default=None, max_length=200)
    # The CPU a local run had (bot/planner/plan.cpu_conditions: cores, runs sharing them, threads, Python
    # speed): its physics is the quote's, on that CPU. None for a GPU's row, an import, an older row.
    device: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class BotSecret(SQLModel, table=True):
    """A secret the bot's replicas share, made once (bot/engine/launching/integrity.py: the master key the
    per-job integrity keys derive from, when TUNEBOT_SECRET_KEY is not set)."""

    __tablename__ = "bot_secrets"

    name: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=256)
    created_at: float
