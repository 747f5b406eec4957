"""``Engine``: the job engine behind EngineAPI, plus the loop entry points (tick, reconcile, ...).

Run it as: build one ``Engine``, call ``resume_all()`` once at start (after a restart it adopts,
terminates and resumes), then ``tick()`` every few seconds (the scheduler does it every
``settings.reconcile_every_s``; the demo every 2-5 s) and ``reconcile()`` every reconcile period.
Every method is safe to call from several threads and several processes on one database.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bot.engine import budgets as budgets_mod
from bot.engine import finish as finish_mod
from bot.engine import monitor, staging
from bot.engine import offers as offers_mod
from bot.engine import states as S
from bot.engine import volumes as volumes_mod
from bot.engine.api import (
    BudgetView,
    EngineError,
    JobView,
    PermissionDenied,
    SpendLine,
    SpendReport,
    VolumeView,
)
from bot.engine.events import EngineEvent, EngineEventKind, EventBus
from bot.engine.jobspec import deep_merge, plan_of, spec_fields
from bot.engine.launch import claim, launch_job, reclaim_stale, storage_root
from bot.engine.reconcile import ReconcileReport
from bot.engine.reconcile import reconcile as reconcile_pass
from bot.engine.recovery import mark_preempted, relaunch
from bot.engine.spend import DAY, job_spend, period_bounds, roll_up
from bot.engine.views import job_view, ts
from bot.money import money
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from bot.providers.base import OfferQuery, Provider, ProviderError
from bot.settings import Settings, get_settings
from runner.spec import RunnerEvent
from store.db import make_engine, migrate, normalize_url
from store.models import Budget, Job, RunnerEventRecord, SpendEntry, VolumeRecord
from store.models import Instance as InstanceRow

log = logging.getLogger(__name__)

OUTCOME_STATE = {
    "finished": (S.SUCCEEDED, "finished"),
    "plateau": (S.STOPPED, "plateau"),
    "failed": (S.FAILED, "runner failed"),
}
DEFAULT_CAP_FACTOR = 2.0  # a job without an explicit cap may spend twice its estimate


class Engine:
    """The engine. ``providers`` defaults to the configured ones (the local provider always)."""

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
    ) -> None:
        self.settings = settings or get_settings()
        self.db_url = normalize_url(db_url or self.settings.resolved_database_url())
        migrate(self.db_url)
        self.db = make_engine(self.db_url)
        if providers is None:
            from bot.providers.registry import build_providers

            # None: TUNEBOT_LOCAL_PROVIDER decides (on for the console and CLI; serve passes False unless set)
            providers = build_providers(
                self.settings, local_workdir=local_workdir, include_local=local_provider
            )
        self.providers: dict[str, Provider] = dict(providers)
        self.bus = bus or EventBus()
        self.clock = clock
        self.local_workdir = local_workdir
        self.process_id = uuid.uuid4().hex[:12]
        self.own_claims: set[str] = set()
        self.launch_claim_timeout_s = 300.0
        self.terminate_deadline_s = 60.0
        self.stop_grace_s = 120.0  # a graceful stop that has not ended by then is terminated
        self.lost_grace_s = 60.0
        self.auto_launch = True  # create_job/approve launch at once; otherwise the next tick does
        self._last_rollup = self.now() - 2 * DAY

    # --- plumbing -------------------------------------------------------------------------------
    def now(self) -> float:
        return float(self.clock())

    @contextmanager
    def session(self) -> Iterator[Session]:
        s = Session(self.db, expire_on_commit=False)
        try:
            yield s
        finally:
            s.close()

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
        if job is None and job_id:
            with self.session() as s:
                job = s.get(Job, job_id)
        ev = EngineEvent(
            kind=kind,
            job_id=job_id,
            user=user or (job.owner if job else None),
            channel=job.channel if job else None,
            thread_ts=job.thread_ts if job else None,
            message=message,
            data=data,
            at=self.now(),
        )
        self.bus.publish(ev)
        return ev

    def close(self) -> None:
        self.db.dispose()

    # --- EngineAPI ------------------------------------------------------------------------------
    def estimate(self, request: EstimateRequest) -> Estimate:
        """Every cloud's offers (live where configured, else the dated snapshot), labelled among those
        this engine can launch; this machine's CPU only when no cloud is configured or gpu=cpu."""
        from bot.planner import estimate as plan
        from bot.providers.catalog import live_catalog

        clouds = {n: p for n, p in self.providers.items() if n != "local"}
        catalog = live_catalog(self.settings, interruptible=request.interruptible, providers=clouds)
        offers = list(catalog.offers)
        source = catalog.source
        local = self.providers.get("local")
        if local is not None and (not clouds or request.gpu == "cpu"):
            query = OfferQuery(gpu_count=request.gpus, interruptible=request.interruptible)
            try:
                offers.extend(local.search_offers(query))
                source = "live" if source == "live" else "mixed"  # this machine's price is always live
            except ProviderError as exc:
                log.warning("offers from local unavailable: %s", exc)
        from bot.engine.calibration import calibration_for

        est = plan(
            request,
            offers=offers,
            prices_source=source,
            prices_as_of=catalog.as_of,
            calibration=calibration_for(self),
        )
        return offers_mod.for_this_engine(
            est, self.providers, catalog.notes, local_max_hours=self.settings.local_max_hours
        )

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
            existing = self._job_by_key(idempotency_key)
            if existing is not None:
                return self._view(existing)
        if not request.dataset:
            raise EngineError("a dataset is needed to launch a fine-tune (dataset=PATH or URI)")
        est = estimate or self.estimate(request)
        fitting = offers_mod.launchable(est.offers, self.providers)
        if not fitting:
            elsewhere = sorted({o.provider for o in est.offers if o.fits})
            if elsewhere:
                raise EngineError(
                    f"it fits only on {', '.join(elsewhere)}, which this bot has no keys for: "
                    "set the provider's API key to launch there"
                )
            hint = f" Suggestions: {'; '.join(est.suggestions)}" if est.suggestions else ""
            raise EngineError(f"no offer fits this fine-tune.{hint}")
        chosen = next((o for o in fitting if choice in o.labels), None)
        if chosen is None:
            chosen = next(
                (
                    o
                    for o in fitting
                    if f"{o.provider}:{o.offer_id}:{'spot' if o.interruptible else 'od'}" == choice
                    or o.offer_id == choice
                ),
                None,
            )
        if chosen is None:
            chosen = offers_mod.pick(fitting, choice)
        if chosen is None:
            raise EngineError(f"unknown offer {choice!r}: use cheapest, safest, fastest or an offer key")
        # Before anything is rented: data checked, storage reachable, local inputs staged (staging.py).
        plan = plan_of(request, est.training)
        prepared = staging.prepare(self.settings, self.providers, request, plan, chosen, fitting)
        fitting = prepared.offers
        fields = spec_fields(
            plan,
            base_model=prepared.base_model,
            dataset_uri=prepared.dataset_uri,
            dataset_format=prepared.dataset_format,
        )
        spec_overrides = deep_merge(fields, spec_overrides or {})
        now = self.now()
        cap = max_cost or request.max_cost or round(max(chosen.total_cost * DEFAULT_CAP_FACTOR, 0.01), 2)
        needs_approval = chosen.total_cost > self.settings.approval_above_usd
        job_id = uuid.uuid4().hex[:12]
        job = Job(
            id=job_id,
            owner=user,
            team=team,
            channel=channel,
            state=S.PENDING_APPROVAL if needs_approval else S.APPROVED,
            request=request.model_dump(mode="json"),
            choice=choice,
            offer=chosen.model_dump(mode="json"),
            offers=[o.model_dump(mode="json") for o in fitting],
            spec_overrides=spec_overrides or {},
            provider=chosen.provider,
            gpu=chosen.gpu,
            gpu_count=chosen.gpu_count,
            interruptible=chosen.interruptible,
            price_per_hour=chosen.price_per_hour,
            estimated_cost=chosen.total_cost,
            estimated_hours=chosen.hours,
            max_cost=cap,
            checkpoint_minutes=chosen.checkpoint_minutes,
            idempotency_key=idempotency_key,
            checkpoint_uri=f"{storage_root(self, job_id)}/checkpoints",
            created_at=now,
            updated_at=now,
            approved_by=None if needs_approval else "auto",
        )
        with self.session() as s:
            s.add(job)
            S.audit(
                s,
                actor=user,
                action="create",
                job_id=job_id,
                at=now,
                offer=chosen.model_dump(mode="json"),
                max_cost=cap,
                needs_approval=needs_approval,
            )
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                existing = self._job_by_key(idempotency_key) if idempotency_key else None
                if existing is None:
                    raise
                return self._view(existing)
        self.publish(
            EngineEventKind.job_created,
            job_id,
            f"Job {job_id} created: {request.model} on "
            f"{chosen.provider} {chosen.gpu} at {money(chosen.price_per_hour)}/h, estimated "
            f"{money(chosen.total_cost)}, cap {money(cap)}.",
            job=job,
            estimated_cost=chosen.total_cost,
            max_cost=cap,
            price_per_hour=chosen.price_per_hour,
        )
        if needs_approval:
            self.publish(
                EngineEventKind.approval_needed,
                job_id,
                f"Job {job_id} is estimated at "
                f"{money(chosen.total_cost)}, above {money(self.settings.approval_above_usd)}: it needs "
                f"approval by someone other than {user}.",
                job=job,
                estimated_cost=chosen.total_cost,
            )
        elif self.auto_launch:
            self.launch(job_id, user=user)
        return self.get_job(job_id)

    def approve(self, job_id: str, *, approver: str) -> JobView:
        job = self._job(job_id)
        if approver == job.owner:
            raise PermissionDenied("a job must be approved by someone other than the person who asked for it")
        with self.session() as s:
            ok = S.transition(
                s,
                job_id,
                S.PENDING_APPROVAL,
                S.APPROVED,
                actor=approver,
                now=self.now(),
                approved_by=approver,
            )
        if not ok:
            view = self.get_job(job_id)
            by = self._job(job_id).approved_by
            view.message = f"already {view.state}" + (f" (approved by {by})" if by else "") + "; nothing done"
            return view
        if self.auto_launch:
            self.launch(job_id, user=approver)
        return self.get_job(job_id)

    def launch(self, job_id: str, *, user: str = "engine") -> JobView:
        """Launch an approved job (a no-op when someone else already claimed it)."""
        claim_id = claim(self, job_id, actor=user)
        if claim_id is not None:
            launch_job(self, job_id, claim_id, actor=user)
        return self.get_job(job_id)

    def stop(self, job_id: str, *, user: str, reason: str = "user") -> JobView:
        job = self._job(job_id)
        admins = {a.strip() for a in self.settings.admins.split(",") if a.strip()}
        if user not in (job.owner, "engine") and user not in admins:
            raise PermissionDenied(f"only {job.owner} or an admin can stop job {job_id}")
        self._request_stop(job_id, reason=reason, actor=user)
        return self.get_job(job_id)

    def get_job(self, job_id: str) -> JobView:
        job = self._job(job_id)
        with self.session() as s:
            rows = s.execute(
                select(RunnerEventRecord.step, RunnerEventRecord.loss)
                .where(RunnerEventRecord.job_id == job_id, RunnerEventRecord.loss.is_not(None))
                .order_by(RunnerEventRecord.seq)
            ).all()
            spend = job.spend if job.state in S.FINAL else job_spend(s, job_id, self.now())
        losses = [(int(a), float(b)) for a, b in rows]
        if len(losses) > 400:
            stride = len(losses) // 400 + 1
            losses = losses[::stride] + [losses[-1]]
        return job_view(job, spend=spend, losses=losses)

    def list_jobs(self, *, user: str | None = None, active_only: bool = False) -> list[JobView]:
        with self.session() as s:
            q = select(Job)
            if user:
                q = q.where(Job.owner == user)
            if active_only:
                q = q.where(Job.state.in_(sorted(S.ACTIVE | {S.PENDING_APPROVAL})))
            jobs = list(s.execute(q.order_by(Job.created_at.desc()).limit(200)).scalars())
            now = self.now()
            return [
                job_view(j, spend=j.spend if j.state in S.FINAL else job_spend(s, j.id, now)) for j in jobs
            ]

    def set_thread(self, job_id: str, *, channel: str, thread_ts: str) -> None:
        with self.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(channel=channel, thread_ts=thread_ts))
            s.commit()

    def spend(self, period: Literal["today", "week", "month"], *, user: str | None = None) -> SpendReport:
        now = self.now()
        start, end = period_bounds(period, now)
        self.roll_up_spend()
        with self.session() as s:
            base = select(SpendEntry).where(SpendEntry.period_start >= start - 1)
            if user:
                base = base.where(SpendEntry.owner == user)
            sub = base.subquery()

            def lines(col: Any) -> list[SpendLine]:
                rows = s.execute(
                    select(col, func.sum(sub.c.amount)).group_by(col).order_by(func.sum(sub.c.amount).desc())
                ).all()
                return [SpendLine(key=str(k or "-"), amount=round(float(a), 6)) for k, a in rows]

            by_user = lines(sub.c.owner)
            budgets = {b.name: b for b in s.execute(select(Budget).where(Budget.scope == "user")).scalars()}
            for line in by_user:
                b = budgets.get(line.key)
                if b is not None:
                    line.budget = b.daily if period == "today" else b.monthly if period == "month" else None
            total = float(s.execute(select(func.coalesce(func.sum(sub.c.amount), 0.0))).scalar_one())
            return SpendReport(
                period=period,
                start=ts(start),
                end=ts(end),
                total=round(total, 6),
                by_user=by_user,
                by_provider=lines(sub.c.provider),
                by_job=lines(sub.c.job_id)[:50],
            )

    def volumes(self) -> list[VolumeView]:
        volumes_mod.sync(self)
        now = self.now()
        with self.session() as s:
            rows = list(s.execute(select(VolumeRecord).where(VolumeRecord.deleted_at.is_(None))).scalars())
        return [
            VolumeView(
                provider=r.provider,
                volume_id=r.volume_id,
                name=r.name,
                size_gb=r.size_gb,
                price_per_gb_month=r.price_per_gb_month,
                cost_per_month=r.size_gb * r.price_per_gb_month,
                cost_so_far=round(volumes_mod.cost_so_far(r, now), 4),
                idle_since=ts(r.idle_since),
                owner=r.owner,
            )
            for r in rows
        ]

    def delete_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        volumes_mod.delete(self, provider, volume_id, user=user)

    def keep_volume(self, provider: str, volume_id: str, *, user: str) -> None:
        volumes_mod.keep(self, provider, volume_id, user=user)

    def budgets(self) -> list[BudgetView]:
        now = self.now()
        day, _ = period_bounds("today", now)
        month, _ = period_bounds("month", now)
        with self.session() as s:
            out = []
            for b in s.execute(select(Budget).order_by(Budget.scope, Budget.name)).scalars():
                out.append(
                    BudgetView(
                        scope=b.scope,
                        name=b.name,
                        daily=b.daily,
                        monthly=b.monthly,
                        spent_today=round(budgets_mod.spent(s, b.scope, b.name, day, now + 1), 6),
                        spent_month=round(budgets_mod.spent(s, b.scope, b.name, month, now + 1), 6),
                    )
                )
            return out

    def set_budget(
        self,
        scope: Literal["user", "team"],
        name: str,
        *,
        daily: float | None,
        monthly: float | None,
        user: str,
    ) -> BudgetView:
        if scope not in ("user", "team"):
            raise EngineError("scope must be user or team")
        admins = {a.strip() for a in self.settings.admins.split(",") if a.strip()}
        if admins and user not in admins:
            raise PermissionDenied("only an admin can set budgets")
        now = self.now()
        with self.session() as s:
            b = s.execute(select(Budget).where(Budget.scope == scope, Budget.name == name)).scalars().first()
            if b is None:
                b = Budget(scope=scope, name=name)
                s.add(b)
            b.daily, b.monthly, b.updated_by, b.updated_at = daily, monthly, user, now
            S.audit(
                s,
                actor=user,
                action="set-budget",
                job_id=None,
                at=now,
                scope=scope,
                name=name,
                daily=daily,
                monthly=monthly,
            )
            s.commit()
        return next(v for v in self.budgets() if v.scope == scope and v.name == name)

    # --- runner events --------------------------------------------------------------------------
    def record_runner_event(
        self, job_id: str, token: str | None, payload: dict[str, Any] | bytes | str
    ) -> bool:
        """A pushed RunnerEvent; False (and nothing stored) unless the job's bearer token matches."""
        with self.session() as s:
            job = s.get(Job, job_id)
        if job is None or not monitor.token_ok(job, token):
            return False
        try:
            if isinstance(payload, dict):
                event = RunnerEvent.model_validate(payload)
            else:
                event = RunnerEvent.model_validate_json(payload)
        except ValueError:
            return False
        if event.job_id != job_id:
            return False
        monitor.ingest(self, job_id, [event])
        return True

    # --- the loop -------------------------------------------------------------------------------
    def tick(self) -> int:
        """One pass: launch/relaunch what is due, follow running jobs, caps, idle stops, spend, budgets."""
        with self.session() as s:
            ids = list(s.execute(select(Job.id).where(Job.state.in_(sorted(S.ACTIVE)))).scalars())
        for job_id in ids:
            try:
                self._supervise(job_id)
            except Exception:  # noqa: BLE001 - one broken job never stops the others
                log.exception("supervising job %s failed", job_id)
        self._reap()
        self.roll_up_spend()
        budgets_mod.check(self)
        return len(ids)

    def reconcile(self) -> ReconcileReport:
        return reconcile_pass(self)

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
        for job_id in launching:
            try:
                claim_id = reclaim_stale(self, job_id, actor="resume", force=True)
                if claim_id:
                    launch_job(self, job_id, claim_id, actor="resume")
            except Exception:  # noqa: BLE001 - one broken job never stops the others
                log.exception("resume: taking over the launch of job %s failed", job_id)
        try:
            return self.tick()
        except Exception:  # noqa: BLE001
            log.exception("resume: the first tick failed; the scheduler ticks again")
            return 0

    def roll_up_spend(self) -> None:
        now = self.now()
        with self.session() as s:
            roll_up(s, now, since=self._last_rollup - 3600)
            s.commit()
        self._last_rollup = now

    def volume_reminders(self) -> list[EngineEvent]:
        volumes_mod.sync(self)
        return volumes_mod.reminders(self)

    def daily_summary(self, *, day: str = "yesterday") -> EngineEvent:
        from bot.engine.summary import daily_summary

        return daily_summary(self, day=day)

    # --- internals ------------------------------------------------------------------------------
    def _job(self, job_id: str) -> Job:
        with self.session() as s:
            job = s.get(Job, job_id)
        if job is None:
            raise EngineError(f"no job {job_id}")
        return job

    def _job_by_key(self, key: str) -> Job | None:
        with self.session() as s:
            return s.execute(select(Job).where(Job.idempotency_key == key)).scalars().first()

    def _view(self, job: Job) -> JobView:
        return self.get_job(job.id)

    def _request_stop(self, job_id: str, *, reason: str, actor: str) -> None:
        now = self.now()
        with self.session() as s:
            for src in (S.PENDING_APPROVAL, S.APPROVED):
                if S.transition(
                    s,
                    job_id,
                    src,
                    S.CANCELLED,
                    actor=actor,
                    now=now,
                    reason=reason,
                    stop_reason=reason,
                    finished_at=now,
                ):
                    self.publish(
                        EngineEventKind.stopped,
                        job_id,
                        f"Job {job_id} cancelled ({reason}).",
                        reason=reason,
                        state=S.CANCELLED,
                    )
                    return
            res = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.state.in_(sorted(S.ACTIVE)), Job.stop_requested_at.is_(None))
                .values(stop_reason=reason, stop_requested_at=now, updated_at=now)
            )
            if res.rowcount != 1:
                return
            S.audit(s, actor=actor, action="stop-requested", job_id=job_id, at=now, reason=reason)
            s.commit()
        rows = finish_mod.open_instances(self, job_id)
        if not rows:
            job = self._job(job_id)
            if job.state in (S.RECOVERING, S.RUNNING):
                finish_mod.finish(self, job_id, S.STOPPED, reason=reason, actor=actor)
            return
        for row in rows:  # graceful: SIGTERM lets the runner checkpoint; the exit then ends the job
            provider = self.providers.get(row.provider)
            graceful = getattr(provider, "preempt", None)
            if callable(graceful):
                try:
                    graceful(row.provider_instance_id, 30.0)
                    continue
                except Exception as exc:  # noqa: BLE001
                    log.warning("graceful stop of %s failed: %s", row.provider_instance_id, exc)
        if not any(callable(getattr(self.providers.get(r.provider), "preempt", None)) for r in rows):
            finish_mod.finish(self, job_id, S.STOPPED, reason=reason, actor=actor)

    def _supervise(self, job_id: str) -> None:
        job = self._job(job_id)
        if job.state == S.APPROVED:
            self.launch(job_id, user="engine")
            return
        if job.state == S.RECOVERING:
            if job.stop_requested_at is not None:
                finish_mod.finish(self, job_id, S.STOPPED, reason=job.stop_reason)
                return
            relaunch(self, job_id)
            return
        if job.state == S.LAUNCHING:
            claim_id = reclaim_stale(self, job_id, actor="engine", force=False)
            if claim_id:
                launch_job(self, job_id, claim_id)
            return
        if job.state != S.RUNNING:
            return
        monitor.pull(self, job)
        job = self._job(job_id)
        rows = finish_mod.open_instances(self, job_id)
        for extra in rows[:-1]:  # a job never keeps two instances: the newest one stays
            finish_mod.terminate_instance(self, extra, reason="duplicate")
        row = rows[-1] if rows else None
        if job.outcome in OUTCOME_STATE:
            self._finish_outcome(job)
            return
        verdict, code = monitor.observe(self, row) if row is not None else ("gone", None)
        if verdict in ("exited", "preempted", "gone"):
            monitor.pull(self, job)  # the last events may have landed just before the exit
            job = self._job(job_id)
            if job.outcome in OUTCOME_STATE:
                self._finish_outcome(job)
                return
        now = self.now()
        if verdict in ("exited", "preempted", "gone") and job.stop_requested_at is not None:
            finish_mod.finish(self, job_id, S.STOPPED, reason=job.stop_reason)  # the stop we asked for
        elif verdict == "exited" and code == 0:
            finish_mod.finish(self, job_id, S.SUCCEEDED, reason="finished")
        elif verdict == "exited":
            said = self._exit_message(row)
            finish_mod.finish(
                self,
                job_id,
                S.FAILED,
                reason=f"runner exited with code {code}",
                message=f"the runner exited with code {code}" + (f": {said}" if said else ""),
            )
        elif verdict in ("preempted", "gone"):
            if job.stop_requested_at is not None:
                finish_mod.finish(self, job_id, S.STOPPED, reason=job.stop_reason)
            elif mark_preempted(self, job_id, row, why=f"instance {verdict}", gone=verdict == "gone"):
                relaunch(self, job_id)
        elif job.stop_requested_at is not None:
            # Past the grace period, or launched after the stop was asked for (nothing to save): end it.
            launched_after = row is not None and row.launched_at >= job.stop_requested_at
            if launched_after or now - job.stop_requested_at > self.stop_grace_s:
                finish_mod.finish(self, job_id, S.STOPPED, reason=job.stop_reason)
        elif verdict == "running" and row is not None:
            last_activity = job.last_event_at or job.started_at or row.launched_at
            if now - last_activity > self.settings.idle_stop_minutes * 60:
                self._request_stop(job_id, reason="idle", actor="engine")
                finish_mod.finish(self, job_id, S.STOPPED, reason="idle")
                return
            if now - max(job.last_event_at or 0.0, row.launched_at) > self.settings.heartbeat_timeout_s:
                why = f"no heartbeat for {self.settings.heartbeat_timeout_s:.0f} s"
                if mark_preempted(self, job_id, row, why=why, gone=False):
                    relaunch(self, job_id)
                return
            self._check_cap(job, rows)
        elif verdict in ("provisioning", "unknown") and row is not None:
            # Never came up (image pull, a host that is "offline"/"unknown" for good): relaunch elsewhere.
            if now - max(job.last_event_at or 0.0, row.launched_at) > 2 * self.settings.heartbeat_timeout_s:
                if mark_preempted(self, job_id, row, why=f"instance stuck in {verdict}", gone=False):
                    relaunch(self, job_id)
                return
            self._check_cap(job, rows)

    def _exit_message(self, row: InstanceRow | None) -> str | None:
        """The runner's own last words, where the provider can read them (the local provider's log)."""
        provider = self.providers.get(row.provider) if row is not None else None
        read = getattr(provider, "exit_message", None)
        if row is None or not callable(read):
            return None
        try:
            return read(row.provider_instance_id)
        except Exception:  # noqa: BLE001 - a missing log never blocks the finish
            return None

    def _finish_outcome(self, job: Job) -> None:
        """The runner said how it ended; a failure carries the runner's own error line."""
        final, reason = OUTCOME_STATE[job.outcome or ""]
        message = job.message if final == S.FAILED else None
        finish_mod.finish(self, job.id, final, reason=reason, message=message)

    def _check_cap(self, job: Job, rows: list[InstanceRow]) -> None:
        """Stop before the projected spend passes the cap (burn rate over the next reconcile period)."""
        if not job.max_cost:
            return
        now = self.now()
        with self.session() as s:
            spent = job_spend(s, job.id, now)
        burn = sum(r.price_per_hour for r in rows)
        projected = spent + burn * self.settings.reconcile_every_s / 3600.0
        if projected >= job.max_cost:
            log.info("job %s: projected $%.4f >= cap $%.4f; stopping", job.id, projected, job.max_cost)
            self._request_stop(job.id, reason="budget", actor="engine")

    def _reap(self) -> None:
        """Instances still open whose job is final (a terminate that failed earlier): try again."""
        with self.session() as s:
            rows = list(
                s.execute(
                    select(InstanceRow)
                    .join(Job, Job.id == InstanceRow.job_id)
                    .where(InstanceRow.ended_at.is_(None), Job.state.in_(sorted(S.FINAL)))
                ).scalars()
            )
        for row in rows:
            finish_mod.terminate_instance(self, row, reason="job finished")


__all__ = ["Engine", "timedelta"]
