"""An in-memory FakeEngine implementing EngineAPI, for the chat layer's tests."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Literal

from bot.engine.api import (
    BudgetView,
    Dashboard,
    EngineError,
    JobSeries,
    JobView,
    PermissionDenied,
    PriceList,
    SpendLine,
    SpendPace,
    SpendReport,
    VolumeView,
)
from bot.engine.events import EngineEvent, EngineEventKind, EventBus
from bot.planner.errors import UnknownModelError
from bot.planner.request import EstimateRequest
from bot.planner.result import (
    Estimate,
    MemoryEstimate,
    ModelInfo,
    RankedOffer,
    SpeedEstimate,
    TimeEstimate,
)
from bot.settings import Settings

LEAKY_SECRET = "xoxb-SECRET-IN-EXCEPTION"


def make_estimate(model: str = "Llama-3.1-8B", method: str = "qlora", n_offers: int = 6) -> Estimate:
    offers = []
    for i in range(n_offers):
        spot = i % 2 == 0
        labels = []
        if i == 0:
            labels.append("cheapest")
        if i == 1:
            labels += ["safest", "fastest"]
        offers.append(
            RankedOffer(
                provider=["vast", "runpod", "lambda", "tensordock"][i % 4],
                offer_id=f"offer-{i}",
                gpu="rtx-4090" if i % 3 else "a100-80gb",
                gpu_count=1 + i % 2,
                gpu_memory_gb=24.0,
                interruptible=spot,
                price_per_hour=0.3 + i * 0.11,
                hours=3.0 + i * 0.1,
                total_cost=1.0 + i * 0.5,
                fits=i < n_offers - 1,
                reason="fits" if i < n_offers - 1 else "needs 40 GB, has 24 GB " + "x" * 300,
                labels=labels,
            )
        )
    return Estimate(
        model=ModelInfo(
            name=model,
            architecture="llama",
            parameters=8_030_000_000,
            active_parameters=8_030_000_000,
            trainable_parameters=42_000_000,
            layers=32,
            hidden_size=4096,
            vocab_size=128256,
            source="built-in table",
        ),
        method=method,
        memory=MemoryEstimate(
            per_gpu_gb=17.2,
            gpus=1,
            sharding="none",
            breakdown_gb={
                "weights": 5.7,
                "adapters": 0.1,
                "optimizer": 0.5,
                "activations": 6.0,
                "cuda_context": 0.5,
            },
        ),
        speed=SpeedEstimate(
            gpu="rtx-4090",
            gpus=1,
            tokens_per_second=3100.0,
            step_seconds=0.66,
            mfu=0.38,
            flops_per_token=4.8e10,
        ),
        time=TimeEstimate(tokens=20_000_000, epochs=1, steps=9766, hours=1.8, token_source="--tokens"),
        offers=offers,
        assumptions=[f"assumption {i}: " + "long words " * 40 for i in range(14)],
        prices_as_of=datetime(2026, 11, 30, tzinfo=UTC),
    )


class FakeEngine:
    """EngineAPI in memory: idempotent create_job, approval above $50, events on a bus."""

    def __init__(
        self, *, estimate_delay: float = 0.0, n_offers: int = 6, approval_above: float = 50.0
    ) -> None:
        self.bus = EventBus()
        self.estimate_delay = estimate_delay
        self.estimate_gate: threading.Event | None = None  # set: estimates wait until it is set
        self.n_offers = n_offers
        self.approval_above = approval_above
        self.jobs: dict[str, JobView] = {}
        self.keys: dict[str, str] = {}
        self.create_calls: list[dict] = []
        self.threads: dict[str, tuple[str, str]] = {}
        self.admins = {"U_ADMIN", "UADMIN003"}
        self.marks: dict[str, dict] = {}  # job id -> JobSeries fields (eval, lr, preemptions, resumes)
        self.volume_list: list[VolumeView] = [
            VolumeView(
                provider="runpod",
                volume_id="vol-1",
                name="llama-ckpts",
                size_gb=200,
                price_per_gb_month=0.07,
                cost_per_month=14.0,
                cost_so_far=3.2,
                idle_since=datetime(2026, 11, 20, tzinfo=UTC),
                owner="U_ALICE",
                tracked=True,
            )
        ]
        self.deleted: list[str] = []
        self.budget_list: list[BudgetView] = []
        self._lock = threading.Lock()

    # EngineAPI
    def estimate(self, request: EstimateRequest) -> Estimate:
        if self.estimate_delay:
            time.sleep(self.estimate_delay)
        if self.estimate_gate is not None:
            self.estimate_gate.wait(60)
        if request.model == "no-such-model":
            raise UnknownModelError("unknown model `no-such-model`; did you mean Llama-3.1-8B?")
        if request.model == "leaky":  # an engine bug: a key inside a refusal
            raise EngineError(f"provider refused key {LEAKY_SECRET}")
        if request.model == "explode":
            raise RuntimeError(f"internal failure with {LEAKY_SECRET}")
        return make_estimate(request.model, request.method, self.n_offers)

    def price_list(self, gpu: str | None = None) -> PriceList:
        """No cloud configured: every cloud's dated snapshot, each with its note (like the Engine keyless)."""
        from bot.engine.launching.offers import price_list

        return price_list(Settings(), {}, gpu=gpu)

    def create_job(
        self,
        request,
        *,
        user,
        choice="cheapest",
        max_cost=None,
        channel=None,
        idempotency_key=None,
        team=None,
    ):
        with self._lock:
            self.create_calls.append({"user": user, "choice": choice, "key": idempotency_key, "team": team})
            if idempotency_key and idempotency_key in self.keys:
                return self.jobs[self.keys[idempotency_key]]
            estimate = make_estimate(request.model, request.method, self.n_offers)
            offer = estimate.offers[0] if choice == "cheapest" else estimate.offers[1]
            cost = offer.total_cost * (100 if request.model == "expensive" else 1)
            now = datetime.now(UTC)
            job = JobView(
                job_id=f"j{len(self.jobs) + 1}",
                owner=user,
                state="pending_approval" if cost > self.approval_above else "launching",
                model=request.model,
                method=request.method,
                provider=offer.provider,
                gpu=offer.gpu,
                gpu_count=offer.gpu_count,
                interruptible=offer.interruptible,
                price_per_hour=offer.price_per_hour,
                estimated_cost=cost,
                max_cost=max_cost,
                channel=channel,
                created_at=now,
                updated_at=now,
            )
            self.jobs[job.job_id] = job
            if idempotency_key:
                self.keys[idempotency_key] = job.job_id
        self.bus.publish(
            EngineEvent(kind=EngineEventKind.job_created, job_id=job.job_id, user=user, channel=channel)
        )
        if job.state == "pending_approval":
            self.bus.publish(
                EngineEvent(
                    kind=EngineEventKind.approval_needed,
                    job_id=job.job_id,
                    user=user,
                    channel=channel,
                    message="needs approval",
                )
            )
        return job

    def approve(self, job_id: str, *, approver: str) -> JobView:
        job = self.get_job(job_id)
        self.jobs[job_id] = job = job.model_copy(update={"state": "approved"})
        return job

    def stop(self, job_id: str, *, user: str, reason: str = "user") -> JobView:
        job = self.get_job(job_id)
        state = "cancelled" if job.state == "pending_approval" else "stopped"
        self.jobs[job_id] = job = job.model_copy(update={"state": state, "stop_reason": reason})
        return job

    def resume(self, job_id: str, *, user: str, max_cost: float | None = None, channel: str | None = None):
        job = self.get_job(job_id)
        if job.state not in ("stopped", "failed") or job.stop_reason == "plateau":
            raise EngineError(f"job {job_id} is {job.state}: only a stopped or failed job can be resumed")
        if user != job.owner:
            raise PermissionDenied(f"only {job.owner} or an admin can resume job {job_id}")
        cap = job.max_cost if max_cost is None else max_cost
        self.jobs[job_id] = job = job.model_copy(
            update={"state": "running", "stop_reason": None, "max_cost": cap}
        )
        return job

    def clone_request(self, job_id: str, changes: dict, *, user: str | None = None) -> EstimateRequest:
        job = self.get_job(job_id)
        return EstimateRequest(model=job.model, method=job.method, **changes)

    def get_job(self, job_id: str, *, viewer: str | None = None) -> JobView:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise EngineError(f"no job {job_id}") from None

    def series(self, job_id: str, *, viewer: str | None = None) -> JobSeries:
        """The job's losses as its chart data, with the marks a test put in ``self.marks[job_id]``."""
        job = self.get_job(job_id)
        marks = self.marks.get(job_id, {})
        return JobSeries(
            job_id=job_id,
            model=job.model,
            method=job.method,
            provider=job.provider,
            gpu=job.gpu,
            gpu_count=job.gpu_count,
            interruptible=job.interruptible,
            step=job.step,
            max_steps=job.max_steps,
            train=list(job.losses),
            **marks,
        )

    def dashboard(self, user: str) -> Dashboard:
        """Admins (``self.admins``) see every active job, person and volume; others their own."""
        admin = user in self.admins
        active = [j for j in self.jobs.values() if j.state in ("launching", "running", "recovering")]
        people = [
            SpendPace(
                scope="user", name=o, month_to_date=10.0, projected_month=31.0, budget=40.0, per_hour_now=0.4
            )
            for o in sorted({j.owner for j in self.jobs.values()} | {user})
        ]
        now = datetime.now(UTC)
        return Dashboard(
            user=user,
            is_admin=admin,
            at=now,
            month_start=now.replace(day=1),
            days_in_month=31,
            mine=[j for j in self.jobs.values() if j.owner == user][::-1],
            running=active if admin else [j for j in active if j.owner == user],
            per_hour_now=0.4 * len(people) if admin else 0.4,
            month_to_date=12.5 if admin else 10.0,
            projected_month=40.0 if admin else 31.0,
            people=people if admin else [p for p in people if p.name == user],
            teams=[SpendPace(scope="team", name="ml", month_to_date=12.5, projected_month=40.0, budget=100.0)]
            if admin
            else [],
            idle_volumes=[v for v in self.volume_list if admin or v.owner == user],
            manageable=[f"{v.provider}:{v.volume_id}" for v in self.volume_list if admin or v.owner == user],
        )

    def list_jobs(
        self, *, user: str | None = None, active_only: bool = False, viewer: str | None = None
    ) -> list[JobView]:
        return [j for j in self.jobs.values() if user is None or j.owner == user]

    def set_thread(self, job_id: str, *, channel: str, thread_ts: str) -> None:
        self.threads[job_id] = (channel, thread_ts)
        self.jobs[job_id] = self.jobs[job_id].model_copy(update={"channel": channel, "thread_ts": thread_ts})

    def update_job(self, job_id: str, **changes) -> JobView:
        self.jobs[job_id] = self.jobs[job_id].model_copy(update=changes)
        return self.jobs[job_id]

    def spend(
        self,
        period: Literal["today", "week", "month"],
        *,
        user: str | None = None,
        viewer: str | None = None,
    ) -> SpendReport:
        now = datetime.now(UTC)
        return SpendReport(
            period=period,
            start=now - timedelta(days=1),
            end=now,
            total=12.5,
            by_user=[SpendLine(key="U_ALICE", amount=10.0, budget=20.0), SpendLine(key="U_BOB", amount=2.5)],
            by_provider=[SpendLine(key="vast", amount=12.5)],
            by_job=[SpendLine(key="j1", amount=12.5)],
        )

    def volumes(self, *, viewer: str | None = None) -> list[VolumeView]:
        return list(self.volume_list)

    def calibration(self, *, user: str):  # type: ignore[no-untyped-def]
        from bot.engine.api import CalibrationView

        return CalibrationView()

    def exclude_calibration_run(self, run: str, *, user: str, undo: bool = False) -> str:
        return f"run {run} {'included' if undo else 'excluded'}"

    def delete_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        self.deleted.append(volume_id)

    def keep_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        pass

    def budgets(self, *, viewer: str | None = None) -> list[BudgetView]:
        everyone = viewer is None or viewer in self.admins
        return [b for b in self.budget_list if everyone or (b.scope, b.name) == ("user", viewer)]

    def set_budget(self, scope, name, *, daily, monthly, user) -> BudgetView:
        view = BudgetView(scope=scope, name=name, daily=daily, monthly=monthly)
        self.budget_list.append(view)
        return view
