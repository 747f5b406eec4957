"""The engine's face to the chat layer: the only calls Slack and the terminal make.

Implemented by ``bot.engine.service.Engine``. Everything here is plain data (pydantic views), so a
chat adapter never touches SQL sessions or provider clients. Every call that changes something
takes the acting user (for permissions and the audit log) and, where a person may repeat it
(retyped commands, double clicks), an idempotency key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, PrivateAttr

from bot.planner.offer import Offer
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from runner.contract.spec import RunResults


class EngineError(Exception):
    """A request the engine refuses; the message is safe to show to a person."""


class PermissionDenied(EngineError):
    """The acting user may not do this."""


class PaceView(BaseModel):
    """A running job against its quote (bot/engine/pace.py), while it runs well over its quoted time or
    past its cap: how much slower, what it costs at this pace, where the cap stops it, and what to do."""

    slower: float  # projected hours / quoted hours
    cost: float  # the spend at the end at this pace
    hours: float
    cap_step: int | None = None  # where the cap stops it at this pace; None: it finishes within its cap
    line: str  # "running 2.4x slower than quoted: at this pace $X and Y h; the cap stops it near step Z ..."


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
    step: int = 0  # where the run is: its newest heartbeat's step where that is ahead of the last report
    reported_step: int = 0  # the step of the last report the bot stored (what progress events are held to)
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
    # What the money bought (the runner's results event): eval loss before and after, the result's step and
    # why, the side-by-side answers. None: not finished, or nothing measured.
    results: RunResults | None = None
    sweep_id: str | None = None  # the sweep this job is one configuration of
    # Where the time went, by phase (runner/contract/phases.py), seconds: as quoted on the job's offer
    # (RankedOffer.phases), as its runner reported them (the newest report; earlier runs' included), and the
    # seconds its instances were billed. None: not known (a job from before, or not started).
    quoted_phases: dict[str, float] | None = None
    run_phases: dict[str, float] | None = None
    billed_seconds: float | None = None
    pace: PaceView | None = None  # a running job well over its quoted time or past its cap (issue 36)


class JobChange(BaseModel):
    """One thing that happened to a job, as the store recorded it (its audit row)."""

    id: int  # the audit row's id: rows are read in this order
    job_id: str
    what: Literal["created", "resumed", "state"]
    state: str | None = None  # "state": the state it moved to


class JobChanges(BaseModel):
    """What happened to jobs after a point of the store's record (``EngineAPI.job_changes``)."""

    cursor: int  # the newest row read: the next read's ``after``
    changes: list[JobChange] = Field(default_factory=list)
    more: bool = False  # the read stopped at its limit: there are newer rows


class CompareRun(BaseModel):
    """One run of a comparison: the job, its differing settings as option values, the billed hours and its
    eval curve (step 0: the base model)."""

    job: JobView
    settings: dict[str, str] = Field(default_factory=dict)  # request field -> value (only those that differ)
    hours: float = 0.0
    eval: list[tuple[int, float]] = Field(default_factory=list)


class CompareView(BaseModel):
    """`compare JOB JOB...` (engine/control/compare.py): runs side by side, as bought."""

    runs: list[CompareRun]
    differing: list[str] = Field(default_factory=list)  # request fields whose values differ
    same_data: bool = True
    notes: list[str] = Field(default_factory=list)


class SweepEstimate(BaseModel):
    """A sweep priced before launch (bot/engine/control/sweeps.py): its configurations, the stages of
    successive halving, each run's estimate, what the whole is expected to cost and the most it can commit."""

    request: EstimateRequest  # what every run shares (max_cost: the whole sweep's)
    grid: dict[str, list[Any]]  # request field -> the values tried
    settings: list[dict[str, str]]  # per configuration: option key -> value as typed
    survivors: list[int]  # runs per stage: [4, 2, 1]
    steps: list[list[int]]  # per configuration: the step each stage ends at (the last: the full run)
    run_costs: list[float]  # per configuration: the estimate of a full run on its offer
    where: list[str]  # per configuration: "local cpu x1 at $0.10/h"
    estimated_cost: float  # expected: every run to the first stage, the better half onwards, ...
    needed_cost: float  # the least max_cost that covers the worst case (the dearest runs promoted)
    max_cost: float
    feasible: bool
    scale: float = 1.0  # max_cost (less its margin) over what the worst case needs: the caps' headroom
    notes: list[str] = Field(default_factory=list)
    verify_cost: float = 0.0  # measuring the winner's output again on another host (control/verify.py)
    # What creating it needs and a person never sees: each run's planner estimate, its money model.
    _estimates: list[Any] = PrivateAttr(default_factory=list)
    _costs: list[Any] = PrivateAttr(default_factory=list)


class SweepRunView(BaseModel):
    index: int
    settings: dict[str, str]  # option key -> value
    job: JobView | None = None
    status: str = "pending"  # pending | running | lost | failed | won | stopped | excluded
    stage_evals: dict[int, float] = Field(default_factory=dict)  # rung step -> eval loss there
    cap: float = 0.0  # what this run may spend now (reserved out of max_cost)
    note: str | None = None  # why it stopped


class SweepView(BaseModel):
    sweep_id: str
    owner: str
    state: str  # pending_approval | running | done | stopped | failed | cancelled
    model: str
    stage: int = 0
    survivors: list[int] = Field(default_factory=list)
    max_cost: float
    estimated_cost: float | None = None
    spend: float = 0.0  # every run's spend (the ledger's formula)
    reserved: float = 0.0  # what the runs may still commit: final spend of the ended + caps of the live
    runs: list[SweepRunView] = Field(default_factory=list)
    winner: str | None = None  # job id
    message: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    created_at: datetime
    updated_at: datetime


class JobSeries(BaseModel):
    """What a job's chart draws: every reported step's train loss and learning rate, the eval losses, and
    the steps where it was preempted and where it resumed (engine/outcome/series.py)."""

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
    """App Home: what one person sees (engine/money/dashboard.py). Admins see everyone's running jobs, every
    person and team and every idle volume; a member sees their own (everyone's with TUNEBOT_TEAM_READ, and
    still manages only their own)."""

    user: str
    is_admin: bool
    team_view: bool = False  # a member who reads the team's figures (TUNEBOT_TEAM_READ); admins always do
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
    """The weekly report to the summary channel (engine/money/weekly.py); the chat renders it."""

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
    """One UTC day's spend for the summary channel (engine/money/summary.py); the chat renders it."""

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


class CalibrationLine(BaseModel):
    """One corrected figure class: (GPU, stack, method, size) and what the counted runs made of it."""

    gpu: str
    stack: str
    method: str
    size: str
    speed_factor: float = 1.0
    speed_runs: int = 0
    speed_waiting: int = 0  # runs whose faster-than-physics claim waits for other hosts to corroborate it
    memory_factor: float = 1.0
    memory_runs: int = 0
    memory_waiting: int = 0  # runs whose lower-than-physics claim waits (memory never drops below physics)
    # runs whose slower or larger claim one host makes is held at ONE_HOST_SAFE until a second host agrees
    speed_held: int = 0
    memory_held: int = 0


class CalibrationRunView(BaseModel):
    """A stored run behind the calibration: who reported it, what it says, and whether it counts."""

    run: str  # the job id (an import's id for imported rows): what `calibrate exclude` takes
    source: str  # run | import
    job_id: str | None = None
    host: str | None = None  # "<provider>:<offer>", "local", or None for an import
    owner: str | None = None
    gpu: str
    key: list[str] | None = None
    memory_x: float | None = None  # measured / physics as claimed (counted within the planner's bounds)
    speed_x: float | None = None
    # held: counted, but its slower or larger claim at one host's bound until a second host agrees
    status: Literal["counted", "held", "waiting", "excluded", "skipped"] = "counted"
    excluded_by: str | None = None


class CalibrationView(BaseModel):
    """`calibrate show` for admins: the corrections and every run behind them
    (engine/outcome/calibration.py)."""

    measurements: int = 0  # runs that are not excluded
    skipped: int = 0
    corrections: list[CalibrationLine] = Field(default_factory=list)
    runs: list[CalibrationRunView] = Field(default_factory=list)


class PriceList(BaseModel):
    """Every cloud's GPU offers as `/tune gpus` and `tunebot gpus` show them: live where a key is set and the
    cloud answered in time, else its dated snapshot, with a note per cloud saying which
    (engine/launching/offers.py)."""

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

    # Reading: ``viewer`` is who asks (the permissions policy decides what they see: their own, or everyone's
    # for admins and with TUNEBOT_TEAM_READ); None is the bot itself (its notifier, its own steps).

    def stop(self, job_id: str, *, user: str, reason: str = "user") -> JobView: ...

    def resume(
        self, job_id: str, *, user: str, max_cost: float | None = None, channel: str | None = None
    ) -> JobView: ...

    def clone_request(
        self, job_id: str, changes: dict[str, Any], *, user: str | None = None
    ) -> EstimateRequest: ...

    def get_job(self, job_id: str, *, viewer: str | None = None) -> JobView: ...

    def series(self, job_id: str, *, viewer: str | None = None) -> JobSeries: ...

    def compare(self, job_ids: list[str], *, user: str) -> CompareView: ...

    def estimate_sweep(self, request: EstimateRequest, grid: dict[str, list[Any]]) -> SweepEstimate: ...

    def create_sweep(
        self,
        estimate: SweepEstimate,
        *,
        user: str,
        channel: str | None = None,
        team: str | None = None,
        idempotency_key: str | None = None,
    ) -> SweepView: ...

    def get_sweep(self, sweep_id: str, *, viewer: str | None = None) -> SweepView: ...

    def approve_sweep(self, sweep_id: str, *, approver: str) -> SweepView: ...

    def stop_sweep(self, sweep_id: str, *, user: str) -> SweepView: ...

    def dashboard(self, user: str) -> Dashboard: ...

    def list_jobs(
        self, *, user: str | None = None, active_only: bool = False, viewer: str | None = None
    ) -> list[JobView]: ...

    def set_thread(self, job_id: str, *, channel: str, thread_ts: str) -> None: ...

    # Any process's creates, resumes and state changes after ``after`` (None: none, only where to start).
    def job_changes(self, after: int | None = None) -> JobChanges: ...

    def spend(
        self,
        period: Literal["today", "week", "month"],
        *,
        user: str | None = None,
        viewer: str | None = None,
    ) -> SpendReport: ...

    def volumes(self, *, viewer: str | None = None) -> list[VolumeView]: ...

    # Calibration (admins only): what moved the estimates, and undoing it.
    def calibration(self, *, user: str) -> CalibrationView: ...

    def exclude_calibration_run(self, run: str, *, user: str, undo: bool = False) -> str: ...

    def delete_volume(self, provider: str, volume_id: str, *, user: str) -> None: ...

    def keep_volume(self, provider: str, volume_id: str, *, user: str) -> None: ...

    def budgets(self, *, viewer: str | None = None) -> list[BudgetView]: ...

    def set_budget(
        self,
        scope: Literal["user", "team"],
        name: str,
        *,
        daily: float | None,
        monthly: float | None,
        user: str,
    ) -> BudgetView: ...
