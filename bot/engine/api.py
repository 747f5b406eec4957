"""The engine's face to the chat layer: the only calls Slack and the terminal make.

Implemented by ``bot.engine.service.Engine``. Everything here is plain data (pydantic views), so a
chat adapter never touches SQL sessions or provider clients. Every call that changes something
takes the acting user (for permissions and the audit log) and, where a person may repeat it
(retyped commands, double clicks), an idempotency key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from bot.planner.offer import Offer
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate


class EngineError(Exception):
    """A request the engine refuses; the message is safe to show to a person."""


class PermissionDenied(EngineError):
    """The acting user may not do this."""


class JobView(BaseModel):
    job_id: str
    owner: str
    # pending_approval, approved, launching, running, recovering, succeeded, failed, cancelled, stopped
    state: str
    stop_reason: str | None = None  # plateau | budget | user | idle | ...
    model: str
    method: str
    provider: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    interruptible: bool = False
    price_per_hour: float | None = None  # locked at launch
    estimated_cost: float | None = None
    max_cost: float | None = None
    spend: float = 0.0
    step: int = 0
    max_steps: int | None = None
    loss: float | None = None
    eta_seconds: float | None = None
    preemptions: int = 0
    output_uri: str | None = None  # the final output (finished, plateau); None otherwise
    # The newest complete checkpoint: a loadable PEFT adapter (full: a model); a stopped or failed job's
    # result, and where `resume` continues from.
    checkpoint_uri: str | None = None
    checkpoint_step: int | None = None
    channel: str | None = None
    thread_ts: str | None = None
    created_at: datetime
    updated_at: datetime
    message: str | None = None
    losses: list[tuple[int, float]] = Field(default_factory=list)  # (step, loss) for charts


class JobSeries(BaseModel):
    """What a job's chart draws: every reported step's train loss and learning rate, the eval losses, and
    the steps where it was preempted and where it resumed (engine/series.py)."""

    job_id: str
    model: str
    method: str
    provider: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    interruptible: bool = False
    step: int = 0
    max_steps: int | None = None
    train: list[tuple[int, float]] = Field(default_factory=list)  # (step, loss), every step reported
    eval: list[tuple[int, float]] = Field(default_factory=list)  # (step, eval loss)
    lr: list[tuple[int, float]] = Field(default_factory=list)  # (step, learning rate)
    preemptions: list[int] = Field(default_factory=list)  # steps
    resumes: list[int] = Field(default_factory=list)  # steps a relaunched run resumed from


class SpendLine(BaseModel):
    key: str  # user, provider or job id
    amount: float
    budget: float | None = None


class SpendReport(BaseModel):
    period: Literal["today", "week", "month"]
    start: datetime
    end: datetime
    total: float
    by_user: list[SpendLine]
    by_provider: list[SpendLine]
    by_job: list[SpendLine]


class VolumeView(BaseModel):
    provider: str
    volume_id: str
    name: str
    size_gb: float
    price_per_gb_month: float
    cost_per_month: float
    cost_so_far: float
    idle_since: datetime | None = None
    owner: str | None = None  # the owner of the job tunebot created or attached it for
    tracked: bool = False  # tunebot's own (deletable by its owner or an admin); else the provider's


class BudgetView(BaseModel):
    scope: Literal["user", "team"]
    name: str
    daily: float | None = None
    monthly: float | None = None
    spent_today: float = 0.0
    spent_month: float = 0.0


class SpendPace(BaseModel):
    """A person's or a team's month: spent so far, projected at the recent pace, the budget, and the
    dollars per hour their running instances and volumes cost right now."""

    scope: Literal["user", "team"]
    name: str
    month_to_date: float = 0.0
    projected_month: float = 0.0
    budget: float | None = None  # monthly
    per_hour_now: float = 0.0


class Dashboard(BaseModel):
    """App Home: what one person sees (engine/dashboard.py). Admins see everyone's running jobs, every
    person and team and every idle volume; a member sees their own."""

    user: str
    is_admin: bool
    at: datetime
    month_start: datetime
    days_in_month: int
    mine: list[JobView] = Field(default_factory=list)  # the person's recent jobs, newest first
    running: list[JobView] = Field(default_factory=list)  # active jobs (everyone's for admins)
    per_hour_now: float = 0.0  # $/h of what is running now (GPUs and volumes), in this view's scope
    month_to_date: float = 0.0
    projected_month: float = 0.0
    people: list[SpendPace] = Field(default_factory=list)
    teams: list[SpendPace] = Field(default_factory=list)
    idle_volumes: list[VolumeView] = Field(default_factory=list)
    manageable: list[str] = Field(default_factory=list)  # "provider:volume_id" this person may delete/keep


class AuditEntry(BaseModel):
    """Who did what (the audit log, as people say it)."""

    at: datetime
    actor: str  # a user id, or "engine" for what the bot did on its own (budget, idle, price stops)
    action: Literal[
        "launched",
        "approved",
        "rejected",
        "cancelled",
        "stopped",
        "deleted volume",
        "kept volume",
        "set budget",
    ]
    job_id: str | None = None
    target: str | None = None  # the job's model and method, the volume, the budget
    detail: str | None = None  # the reason, or where a job launched (words; the chat renders figures)
    # Figures by name, in the order said: {"estimated": 3.2}, {"daily": 5.0, "monthly": 400.0}.
    amounts: dict[str, float] = Field(default_factory=dict)
    days: float | None = None  # how long a volume is kept


class FinishedJob(BaseModel):
    """A job that ended in the period: what was estimated against what it cost and took."""

    job_id: str
    owner: str
    model: str
    method: str
    state: str
    stop_reason: str | None = None
    provider: str | None = None
    gpu: str | None = None
    estimated_cost: float | None = None
    actual_cost: float = 0.0
    estimated_hours: float | None = None
    actual_hours: float = 0.0  # billed instance hours (start-up and relaunches included)


class WeeklyReport(BaseModel):
    """The weekly report to the summary channel (engine/weekly.py); the chat renders it."""

    start: datetime
    end: datetime
    total: float = 0.0
    days: list[str] = Field(default_factory=list)  # "2026-11-30", one per day of the period
    daily_by_person: dict[str, list[float]] = Field(default_factory=dict)  # user -> spend per day
    actions: list[AuditEntry] = Field(default_factory=list)
    finished: list[FinishedJob] = Field(default_factory=list)
    idle_volumes: list[VolumeView] = Field(default_factory=list)
    budgets: list[BudgetView] = Field(default_factory=list)


class DailySummary(BaseModel):
    """One UTC day's spend for the summary channel (engine/summary.py); the chat renders it."""

    day: str  # "2026-12-01", the day summarized
    spent: float = 0.0  # on that day
    spent_today: float = 0.0  # today so far
    spent_month: float = 0.0  # month to date
    # Of each of the three: volumes' storage (the rest is compute): a volume bills every day since it was
    # first seen, so a day without jobs can still cost (say where the money went).
    storage: float = 0.0
    storage_today: float = 0.0
    storage_month: float = 0.0
    by_user: list[SpendLine] = Field(default_factory=list)  # the top ten on that day, biggest first
    by_provider: list[SpendLine] = Field(default_factory=list)
    finished: dict[str, int] = Field(default_factory=dict)  # jobs finished that day, by final state
    active: int = 0
    pending_approval: int = 0
    idle_volumes: int = 0
    idle_volume_cost_per_month: float = 0.0


class PriceList(BaseModel):
    """Every cloud's GPU offers as `/tune gpus` and `tunebot gpus` show them: live where a key is set and the
    cloud answered in time, else its dated snapshot, with a note per cloud saying which (engine/offers.py)."""

    offers: list[Offer]
    notes: list[str] = Field(default_factory=list)
    source: str = "snapshot"  # "live" | "snapshot" | "mixed"
    as_of: datetime | None = None


class EngineAPI(Protocol):
    def estimate(self, request: EstimateRequest) -> Estimate: ...

    def price_list(self, gpu: str | None = None) -> PriceList: ...

    def create_job(
        self,
        request: EstimateRequest,
        *,
        user: str,
        choice: str = "cheapest",  # "cheapest" | "safest" | "fastest" | an offer key from the estimate
        max_cost: float | None = None,
        channel: str | None = None,
        idempotency_key: str | None = None,
        team: str | None = None,  # whose team budget covers it (default: TUNEBOT_TEAM)
    ) -> JobView: ...

    def approve(self, job_id: str, *, approver: str) -> JobView: ...

    def stop(self, job_id: str, *, user: str, reason: str = "user") -> JobView: ...

    def resume(
        self, job_id: str, *, user: str, max_cost: float | None = None, channel: str | None = None
    ) -> JobView: ...

    def clone_request(self, job_id: str, changes: dict[str, Any]) -> EstimateRequest: ...

    def get_job(self, job_id: str) -> JobView: ...

    def series(self, job_id: str) -> JobSeries: ...

    def dashboard(self, user: str) -> Dashboard: ...

    def list_jobs(self, *, user: str | None = None, active_only: bool = False) -> list[JobView]: ...

    def set_thread(self, job_id: str, *, channel: str, thread_ts: str) -> None: ...

    def spend(self, period: Literal["today", "week", "month"], *, user: str | None = None) -> SpendReport: ...

    def volumes(self) -> list[VolumeView]: ...

    def delete_volume(self, provider: str, volume_id: str, *, user: str) -> None: ...

    def keep_volume(self, provider: str, volume_id: str, *, user: str) -> None: ...

    def budgets(self) -> list[BudgetView]: ...

    def set_budget(
        self,
        scope: Literal["user", "team"],
        name: str,
        *,
        daily: float | None,
        monthly: float | None,
        user: str,
    ) -> BudgetView: ...
