"""``Engine``: the facade behind EngineAPI, plus the loop entry points (tick, reconcile, ...).

Run it as: build one ``Engine``, call ``resume_all()`` once at start (after a restart it adopts,
terminates and resumes), then ``tick()`` every few seconds (the scheduler does it every
``settings.reconcile_every_s``; the demo every 2-5 s) and ``reconcile()`` every reconcile period.
Every method is safe to call from several threads and several processes on one database.

The facade holds one ``EngineContext`` (bot/engine/context.py) and the permissions policy and passes
them to the modules that do the work: ``jobs`` (create, approve, launch, stop), ``supervise`` (the
tick's decisions), ``reconcile``, ``spend``/``budgets``/``summary``, ``volumes``. None of those
imports this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select, update
from sqlmodel import Session

from bot.engine.api import (
    BudgetView,
    CalibrationView,
    CompareView,
    DailySummary,
    Dashboard,
    EngineError,
    JobChange,
    JobChanges,
    JobSeries,
    JobView,
    PriceList,
    SpendReport,
    SweepEstimate,
    SweepView,
    VolumeView,
    WeeklyReport,
)
from bot.engine.context import EngineContext, Limits, ProcessMemory
from bot.engine.control import jobs
from bot.engine.events import EngineEvent, EngineEventKind, EventBus
from bot.engine.ids import check_job_id, is_job_id
from bot.engine.launching import offers as offers_mod
from bot.engine.launching.launch import take_over, token_hash
from bot.engine.money import budgets as budgets_mod
from bot.engine.money import dashboard as dashboard_mod
from bot.engine.money import reports
from bot.engine.money import volumes as volumes_mod
from bot.engine.outcome import series
from bot.engine.permissions import Permissions
from bot.engine.record import states as S
from bot.engine.record.spend import roll_up_recent
from bot.engine.watching import progress, runner_events, supervise
from bot.engine.watching.pruning import prune_superseded
from bot.engine.watching.reconcile import ReconcileReport
from bot.engine.watching.reconcile import reconcile as reconcile_pass
from bot.engine.watching.renewal import renew_due
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from bot.providers.base import Provider
from bot.settings import Settings, get_settings
from store.db import make_engine, migrate, normalize_url
from store.models import Job

log = logging.getLogger(__name__)

DEFAULT_CAP_FACTOR = jobs.DEFAULT_CAP_FACTOR


class Engine:
    """The engine. ``providers`` (offered for new jobs) defaults to the configured ones (the local one where
    enabled); what it supervises adds the local provider where it is not offered (``supervisable``)."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        db_url: str | None = None,
        providers: dict[str, Provider] | None = None,
        bus: EventBus | None = None,
        clock: Callable[[], float] = time.time,
        local_workdir: Path | str | None = None,
        local_provider: bool | None = None,
        permissions: Permissions | None = None,
    ) -> None:
        settings = settings or get_settings()
        self.db_url = normalize_url(db_url or settings.resolved_database_url())
        migrate(self.db_url)
        watch_only: dict[str, Provider] = {}
        if providers is None:
            from bot.providers.registry import build_providers, watch_only_providers

            # None: TUNEBOT_LOCAL_PROVIDER decides (on for the console and CLI; serve passes False unless set)
            providers = build_providers(settings, local_workdir=local_workdir, include_local=local_provider)
            # What new jobs may use is not what this process supervises: a job of this store ran where it ran.
            watch_only = watch_only_providers(settings, providers, local_workdir=local_workdir)
        self.ctx = EngineContext(
            settings=settings,
            db=make_engine(self.db_url),
            providers=dict(providers),
            bus=bus or EventBus(),
            clock=clock,
            limits=Limits(),
            memory=ProcessMemory(),
            permissions=permissions or Permissions.from_settings(settings),
            watch_only=watch_only,
        )
        self.local_workdir = local_workdir
        self.auto_launch = True  # create_job/approve launch at once; otherwise the next tick does

    # --- the context, under the names callers have always used ----------------------------------
    settings = property(lambda self: self.ctx.settings)
    db = property(lambda self: self.ctx.db)
    providers = property(lambda self: self.ctx.providers)  # offered for new jobs
    supervisable = property(lambda self: self.ctx.supervisable)  # observed, stopped, charged, torn down
    bus = property(lambda self: self.ctx.bus)
    clock = property(lambda self: self.ctx.clock)
    limits = property(lambda self: self.ctx.limits)
    memory = property(lambda self: self.ctx.memory)
    process_id = property(lambda self: self.ctx.memory.process_id)
    own_claims = property(lambda self: self.ctx.memory.own_claims)

    @property
    def permissions(self) -> Permissions:
        return self.ctx.policy

    policy = permissions  # the context's name, for steps handed the facade itself

    @permissions.setter
    def permissions(self, policy: Permissions) -> None:
        self.ctx = replace(self.ctx, permissions=policy)

    def _limit(name: str) -> property:  # type: ignore[misc]
        def get(self: Engine) -> float:
            return getattr(self.ctx.limits, name)

        def set_(self: Engine, value: float) -> None:
            self.ctx = replace(self.ctx, limits=replace(self.ctx.limits, **{name: value}))

        return property(get, set_)

    launch_claim_timeout_s = _limit("launch_claim_timeout_s")
    terminate_deadline_s = _limit("terminate_deadline_s")
    stop_grace_s = _limit("stop_grace_s")
    lost_grace_s = _limit("lost_grace_s")
    del _limit

    def now(self) -> float:
        return self.ctx.now()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.ctx.session() as s:
            yield s

    def publish(
        self,
        kind: EngineEventKind,
        job_id: str | None,
        message: str,
        *,
        job: Job | None = None,
        user: str | None = None,
        **data: Any,
    ) -> EngineEvent:
        return self.ctx.publish(kind, job_id, message, job=job, user=user, **data)

    def close(self) -> None:
        self.ctx.db.dispose()

    # --- EngineAPI ------------------------------------------------------------------------------
    def estimate(self, request: EstimateRequest) -> Estimate:
        """Every cloud's offers (live where configured, else the dated snapshot), labelled among those
        this engine can launch (bot/engine/launching/offers.priced_estimate: the same for every door)."""
        from bot.engine.outcome.calibration import calibration_for

        return offers_mod.priced_estimate(
            self.settings, self.providers, request, calibration=calibration_for(self.ctx)
        )

    def price_list(self, gpu: str | None = None) -> PriceList:
        """`/tune gpus`: every cloud's offers, live where this engine holds its key
        (engine/launching/offers.py)."""
        return offers_mod.price_list(self.settings, self.providers, gpu=gpu)

    def create_job(
        self,
        request: EstimateRequest,
        *,
        user: str,
        choice: str = "cheapest",
        max_cost: float | None = None,
        channel: str | None = None,
        idempotency_key: str | None = None,
        team: str | None = None,
        estimate: Estimate | None = None,
        spec_overrides: dict[str, Any] | None = None,
    ) -> JobView:
        """Create a job with the chosen offer's price locked; launches at once unless approval is needed."""
        if idempotency_key:
            existing = jobs.by_key(self.ctx, idempotency_key)
            if existing is not None:
                return jobs.view(self.ctx, existing.id)
        if not request.dataset:
            raise EngineError("a dataset is needed to launch a fine-tune (dataset=PATH or URI)")
        return jobs.create(
            self.ctx,
            self.permissions,
            request,
            estimate or self.estimate(request),
            user=user,
            choice=choice,
            max_cost=max_cost,
            channel=channel,
            idempotency_key=idempotency_key,
            team=team,
            spec_overrides=spec_overrides,
            auto_launch=self.auto_launch,
        )

    def approve(self, job_id: str, *, approver: str) -> JobView:
        return jobs.approve(
            self.ctx, self.permissions, job_id, approver=approver, auto_launch=self.auto_launch
        )

    def launch(self, job_id: str, *, user: str = "engine") -> JobView:
        """Launch an approved job (a no-op when someone else already claimed it)."""
        return jobs.launch(self.ctx, job_id, user=user)

    def stop(self, job_id: str, *, user: str, reason: str = "user") -> JobView:
        return jobs.stop(self.ctx, self.permissions, job_id, user=user, reason=reason)

    def resume(
        self, job_id: str, *, user: str, max_cost: float | None = None, channel: str | None = None
    ) -> JobView:
        """Continue a stopped or failed job from its newest checkpoint (bot/engine/control/resume.py)."""
        from bot.engine.control import resume as resume_mod

        return resume_mod.resume(
            self.ctx,
            self.permissions,
            job_id,
            user=user,
            max_cost=max_cost,
            channel=channel,
            auto_launch=self.auto_launch,
        )

    def clone_request(
        self, job_id: str, changes: dict[str, Any], *, user: str | None = None
    ) -> EstimateRequest:
        """A job's request with some options changed, to estimate and launch as a new job; ``user`` (who
        clones) must be its owner or an admin (None: the bot itself)."""
        from bot.engine.control import resume as resume_mod

        return resume_mod.clone_request(self.ctx, job_id, changes, user=user, policy=self.permissions)

    def get_job(self, job_id: str, *, viewer: str | None = None) -> JobView:
        """A job; ``viewer``: who asks, refused another member's job unless the policy lets them read it."""
        row = jobs.load(self.ctx, job_id)
        # who may see it before anything more of it is read (its events, its progress object)
        reports.check_read(self.permissions, viewer, row.owner)
        return jobs.view(self.ctx, job_id, heard=progress.step_heard, job=row)

    def dashboard(self, user: str) -> Dashboard:
        """App Home's figures for ``user`` (admins: the whole team), from the store only."""
        return dashboard_mod.dashboard(self.ctx, self.permissions, user)

    def series(self, job_id: str, *, viewer: str | None = None) -> JobSeries:
        """The job's chart data: every step's loss and learning rate, evals, preemptions, resumes."""
        if viewer is not None:
            reports.check_read(self.permissions, viewer, jobs.load(self.ctx, job_id).owner)
        return series.job_series(self.ctx, job_id)

    def compare(self, job_ids: list[str], *, user: str) -> CompareView:
        """Runs side by side: differing settings, eval before/after, cost, time, eval curves (compare.py)."""
        from bot.engine.control.compare import compare

        return compare(self.ctx, self.permissions, job_ids, user=user)

    # --- sweeps: the best run for a budget (bot/engine/control/sweeps.py) ---------------------------------
    def estimate_sweep(self, request: EstimateRequest, grid: dict[str, list[Any]]) -> SweepEstimate:
        from bot.engine.control import sweeps

        return sweeps.estimate_sweep(self.ctx, self.estimate, request, grid)

    def create_sweep(
        self,
        estimate: SweepEstimate,
        *,
        user: str,
        channel: str | None = None,
        team: str | None = None,
        idempotency_key: str | None = None,
        spec_overrides: dict[str, Any] | None = None,
    ) -> SweepView:
        from bot.engine.control import sweeps

        if not estimate._estimates:  # priced elsewhere (a copy): priced again here
            estimate = self.estimate_sweep(estimate.request, estimate.grid)
        return sweeps.create(
            self.ctx,
            self.permissions,
            estimate,
            user=user,
            channel=channel,
            team=team,
            idempotency_key=idempotency_key,
            spec_overrides=spec_overrides,
        )

    def get_sweep(self, sweep_id: str, *, viewer: str | None = None) -> SweepView:
        """A sweep; ``viewer``: who asks, refused another member's sweep unless the policy lets them read."""
        from bot.engine.control import sweeps

        view = sweeps.view(self.ctx, sweep_id)
        reports.check_read(self.permissions, viewer, view.owner)
        return view

    def approve_sweep(self, sweep_id: str, *, approver: str) -> SweepView:
        from bot.engine.control import sweeps

        return sweeps.approve(self.ctx, self.permissions, self.estimate, sweep_id, approver=approver)

    def stop_sweep(self, sweep_id: str, *, user: str) -> SweepView:
        from bot.engine.control import sweeps

        return sweeps.stop(self.ctx, self.permissions, sweep_id, user=user)

    def set_sweep_thread(self, sweep_id: str, *, channel: str, thread_ts: str) -> None:
        from bot.engine.control import sweeps

        sweeps.set_thread(self.ctx, sweep_id, channel=channel, thread_ts=thread_ts)

    def list_jobs(
        self, *, user: str | None = None, active_only: bool = False, viewer: str | None = None
    ) -> list[JobView]:
        """Jobs, newest first (``user``: only theirs); ``viewer`` sees only what the policy lets them."""
        reports.check_read_user(self.permissions, viewer, user)
        return reports.list_jobs(self.ctx, user=user, active_only=active_only, heard=progress.step_heard)

    def job_changes(self, after: int | None = None, *, limit: int = 1000) -> JobChanges:
        """What any process did to jobs after audit row ``after`` (created, resumed, moved to a state), oldest
        first, by the audit log's primary key; ``after`` None: nothing yet, only the cursor to start from."""
        with self.session() as s:
            cursor, rows, more = S.changes_since(s, after, limit=limit)
        changes = [JobChange(id=i, job_id=j, what=w, state=st) for i, j, w, st in rows]
        return JobChanges(cursor=cursor, changes=changes, more=more)

    def set_thread(self, job_id: str, *, channel: str, thread_ts: str) -> None:
        check_job_id(job_id)
        with self.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(channel=channel, thread_ts=thread_ts))
            s.commit()

    def spend(
        self,
        period: Literal["today", "week", "month"],
        *,
        user: str | None = None,
        viewer: str | None = None,
    ) -> SpendReport:
        """Spend by person, cloud and job (``user``: only theirs); ``viewer`` as for ``list_jobs``."""
        reports.check_read_user(self.permissions, viewer, user)
        return reports.spend(self.ctx, period, user=user)

    def volumes(self, *, viewer: str | None = None) -> list[VolumeView]:
        """Volumes; a member ``viewer`` sees their own tracked ones, from a short-lived cache, a few times a
        minute (bot/engine/money/reports.volumes)."""
        return reports.volumes(self.ctx, viewer=viewer, policy=self.permissions)

    def calibration(self, *, user: str) -> CalibrationView:
        """The calibration's corrections and every run behind them (admins only)."""
        from bot.engine.outcome import calibration as calibration_mod

        return calibration_mod.report(self.ctx, user=user, policy=self.permissions)

    def exclude_calibration_run(self, run: str, *, user: str, undo: bool = False) -> str:
        """Take a run out of the calibration (``undo``: count it again); admins only."""
        from bot.engine.outcome import calibration as calibration_mod

        return calibration_mod.exclude(self.ctx, run, user=user, policy=self.permissions, undo=undo)

    def delete_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        volumes_mod.delete(self.ctx, self.permissions, provider, volume_id, user=user)

    def track_volume(self, provider: str, volume_id: str, *, job_id: str, name: str = "") -> None:
        """Record a volume tunebot created or attached for a job: the job's owner owns it."""
        volumes_mod.track(self.ctx, provider, volume_id, job_id=job_id, name=name)

    def keep_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        volumes_mod.keep(self.ctx, self.permissions, provider, volume_id, user=user)

    def budgets(self, *, viewer: str | None = None) -> list[BudgetView]:
        """Budgets and their spend; a member ``viewer`` sees only their own
        (bot/engine/money/reports.budgets)."""
        return reports.budgets(self.ctx, viewer=viewer, policy=self.permissions)

    def set_budget(
        self,
        scope: Literal["user", "team"],
        name: str,
        *,
        daily: float | None,
        monthly: float | None,
        user: str,
    ) -> BudgetView:
        return reports.set_budget(
            self.ctx, self.permissions, scope, name, daily=daily, monthly=monthly, user=user
        )

    # --- runner events --------------------------------------------------------------------------
    def runner_token_job(self, token: str) -> str | None:
        """The job a runner's bearer token was made for (None: none); /runner/events asks this before it
        reads a body, so an unknown token costs one lookup and no bytes."""
        digest = token_hash(token)
        with self.session() as s:
            return s.execute(select(Job.id).where(Job.token_hash == digest).limit(1)).scalars().first()

    def record_runner_event(
        self, job_id: str, token: str | None, payload: dict[str, Any] | bytes | str
    ) -> bool:
        """A pushed RunnerEvent; False (and nothing stored) unless the job's bearer token matches, the job is
        not final and the job's key signed the event (bot/engine/launching/integrity.py)."""
        if not is_job_id(job_id):  # before the lookup: a NUL is an error on PostgreSQL, not a miss
            return False
        with self.session() as s:
            job = s.get(Job, job_id)
        if job is None or not runner_events.token_ok(job, token):
            return False
        stored = runner_events.receive_pushed(self.ctx, job, payload)
        if stored:
            self._finish_if_reported(job_id)
        return stored

    def _finish_if_reported(self, job_id: str) -> None:
        """A pushed terminal event ends its job now (terminate and confirm), not at the next tick; in a
        thread, so the runner's request is answered at once (a cloud may take a minute to confirm)."""
        import threading

        with self.session() as s:
            job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING or job.outcome not in supervise.OUTCOME_STATE:
            return
        finishing = self.ctx.memory.finishing
        if job_id in finishing:
            return
        finishing.add(job_id)

        def finish() -> None:
            try:
                supervise.finish_reported(self.ctx, [job_id])
            except Exception:  # noqa: BLE001 - the tick finishes it then
                log.exception("finishing job %s after its runner's last event failed", job_id)
            finally:
                finishing.discard(job_id)

        threading.Thread(target=finish, name=f"finish-{job_id}", daemon=True).start()

    def supervised(self) -> bool:
        """Whether a supervisor (the scheduler's leader, `tunebot serve`) is alive on this database."""
        from bot.engine.watching.watch import supervisor

        return supervisor(self.ctx) is not None

    def follow(self, job_ids: list[str]) -> list[str]:
        """Pull these running jobs' progress and finish those their runner reports ended (the CLI does
        this, so a finished instance is torn down by whichever process looks first); the ids finished."""
        return supervise.follow(self.ctx, job_ids)

    # --- the loop -------------------------------------------------------------------------------
    def tick(self) -> int:
        """One pass: launch/relaunch what is due, follow running jobs, caps, idle stops, spend, budgets."""
        n = supervise.tick(self.ctx)
        supervise.reap(self.ctx)
        try:  # runners' storage credentials past half-life get fresh ones (bot/engine/watching/renewal.py)
            renew_due(self.ctx)
        except Exception:  # noqa: BLE001 - the next tick tries again; runners have half a lifetime left
            log.exception("renewing runners' storage credentials failed")
        last = self.ctx.memory.last_rollup
        if last is None or self.now() - last >= self.ctx.limits.rollup_every_s:
            self.roll_up_spend()
        else:
            scope = budgets_mod.budgeted(self.ctx)
            if scope[0] or scope[1]:
                roll_up_recent(self.ctx, scope=scope)
        budgets_mod.check(self.ctx)
        jobs.stop_covered_by_spent_budgets(self.ctx)
        from bot.engine.control import sweeps

        sweeps.tick(self.ctx, self.permissions)  # stages decided, losers stopped, winners' caps raised
        return n

    def reconcile(self) -> ReconcileReport:
        report = reconcile_pass(self.ctx)
        try:  # superseded runs' folders, once their credentials expired (bot/engine/watching/pruning.py)
            prune_superseded(self.ctx)
        except Exception:  # noqa: BLE001 - storage is tidied on the next pass; the books are what matter
            log.exception("pruning superseded runs' folders failed")
        return report

    def resume_all(self) -> int:
        """After a (re)start: reconcile, take over launches whose process died, then one tick.

        A step that fails is logged and left to the periodic passes (the next reconcile and tick do the
        same work): a bot that cannot resume one job at start still serves all the others.
        """
        try:
            self.reconcile()
        except Exception:  # noqa: BLE001
            log.exception("resume: the reconcile pass failed; the periodic reconcile tries again")
        with self.session() as s:
            launching = list(s.execute(select(Job.id).where(Job.state == S.LAUNCHING)).scalars())
        for job_id in launching:  # a launch that raises sends its job back to recovering, with the reason
            try:
                take_over(self.ctx, job_id, actor="resume", force=True)
            except Exception:  # noqa: BLE001 - one broken job never stops the others
                log.exception("resume: taking over the launch of job %s failed", job_id)
        try:
            return self.tick()
        except Exception:  # noqa: BLE001
            log.exception("resume: the first tick failed; the scheduler ticks again")
            return 0

    def roll_up_spend(self) -> None:
        roll_up_recent(self.ctx)

    def volume_reminders(self) -> list[EngineEvent]:
        volumes_mod.sync(self.ctx)
        return volumes_mod.reminders(self.ctx)

    def weekly_report(self) -> WeeklyReport:
        """The last seven days for the summary channel (published as a weekly_report event)."""
        from bot.engine.money.weekly import weekly_report

        return weekly_report(self.ctx)

    def daily_summary(self, *, day: str = "yesterday") -> DailySummary:
        """One day's spend for the summary channel (published as a daily_summary event)."""
        from bot.engine.money.summary import daily_summary

        return daily_summary(self.ctx, day=day)

    # --- internals ------------------------------------------------------------------------------
    def _job(self, job_id: str) -> Job:
        return jobs.load(self.ctx, job_id)

    def _request_stop(self, job_id: str, *, reason: str, actor: str) -> None:
        jobs.request_stop(self.ctx, job_id, reason=reason, actor=actor)


__all__ = ["Engine"]
