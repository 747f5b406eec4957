"""A job's life as people drive it: create (price locked), approve, launch, stop; and reading it back.

Every rule about who may do what is the permissions policy's (bot/engine/permissions.py); every
state change is a conditional transition (bot/engine/record/states.py), so two clicks, two threads or two
replicas doing the same thing do it once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from bot.engine.api import EngineError, JobView, PermissionDenied
from bot.engine.context import EngineContext
from bot.engine.events import EngineEventKind
from bot.engine.ids import check_job_id
from bot.engine.launching import admission, approval, preflight, staging
from bot.engine.launching import offers as offers_mod
from bot.engine.launching.jobspec import deep_merge, plan_of, spec_fields
from bot.engine.launching.launch import claim, launch_job, storage_root
from bot.engine.money import budgets as budgets_mod
from bot.engine.outcome import finish as finish_mod
from bot.engine.outcome import stop_request
from bot.engine.permissions import Permissions
from bot.engine.record import states as S
from bot.engine.record.phases import run_phases
from bot.engine.record.spend import billed_seconds, job_instances, job_spend
from bot.engine.views import job_view
from bot.money import money
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate, RankedOffer
from store.models import Job, RunnerEventRecord

log = logging.getLogger(__name__)

DEFAULT_CAP_FACTOR = 2.0  # a job without an explicit cap may spend twice its estimate


def load(ctx: EngineContext, job_id: str) -> Job:
    check_job_id(job_id)  # before the lookup: a NUL is an error on PostgreSQL, not a miss
    with ctx.session() as s:
        job = s.get(Job, job_id)
    if job is None:
        raise EngineError(f"no job {job_id}")
    return job


def by_key(ctx: EngineContext, key: str) -> Job | None:
    with ctx.session() as s:
        return s.execute(select(Job).where(Job.idempotency_key == key)).scalars().first()


# the step a running job's newest heartbeat claims (bot/engine/watching/progress.py ``step_heard``, handed
# down by the service: watching is above this room)
HeardStep = Callable[[EngineContext, Job], int | None]


def view(
    ctx: EngineContext, job_id: str, *, heard: HeardStep | None = None, job: Job | None = None
) -> JobView:
    """``job``: its row when the caller has just read it (to check who may see it), else read here."""
    job = job if job is not None and job.id == job_id else load(ctx, job_id)
    with ctx.session() as s:
        rows = s.execute(
            select(RunnerEventRecord.step, RunnerEventRecord.loss)
            .where(RunnerEventRecord.job_id == job_id, RunnerEventRecord.loss.is_not(None))
            .order_by(RunnerEventRecord.seq)
        ).all()
        spend = job.spend if job.state in S.FINAL else job_spend(s, job_id, ctx.now())
        phases = run_phases(s, job_id)  # where the time went, as the runner reported it
        billed = sum(billed_seconds(i, ctx.now()) for i in job_instances(s, job_id))
    losses = [(int(a), float(b)) for a, b in rows]
    if len(losses) > 400:
        stride = len(losses) // 400 + 1
        losses = losses[::stride] + [losses[-1]]
    return job_view(
        job,
        spend=spend,
        losses=losses,
        run_phases=phases,
        billed_seconds=billed or None,
        heard_step=heard(ctx, job) if heard is not None else None,
    )


def create(
    ctx: EngineContext,
    policy: Permissions,
    request: EstimateRequest,
    est: Estimate,
    *,
    user: str,
    choice: str = "cheapest",
    max_cost: float | None = None,
    channel: str | None = None,
    idempotency_key: str | None = None,
    team: str | None = None,
    spec_overrides: dict[str, Any] | None = None,
    auto_launch: bool = True,
    approved_by: str | None = None,
    sweep_id: str | None = None,
) -> JobView:
    """Create a job with the chosen offer's price locked; launches at once unless approval is needed.

    Refused before anything is staged when a budget covering the owner or the team is spent, or when the
    owner already runs as many jobs as one person may (bot/engine/launching/admission.py). ``approved_by``:
    the job is one run of something already approved within its cap (a sweep, bot/engine/control/sweeps.py):
    not asked again; ``sweep_id``: that sweep."""
    decision = policy.can_launch(user, channel)  # where (TUNEBOT_ALLOWED_CHANNELS) and who (CHANNEL_ALLOW)
    if not decision:
        raise PermissionDenied(decision.reason)
    team = team or ctx.settings.default_team
    admission.check_budgets(ctx, owner=user, team=team)
    fitting = offers_mod.launchable(est.offers, ctx.providers)
    if not fitting:
        raise _nothing_launchable(est)
    chosen = _chosen_offer(fitting, choice)
    plan = plan_of(request, est.training)
    public_push = bool(plan.push_to_hub) and not plan.hub_private
    _check_hub_push(policy, user, plan.push_to_hub, public=public_push)
    explicit = approval.checked_cap(
        max_cost if max_cost is not None else request.max_cost, ctx.settings.max_cost_limit_usd
    )
    cap = explicit or round(max(chosen.total_cost * DEFAULT_CAP_FACTOR, 0.01), 2)
    stake = approval.at_stake(chosen.total_cost, explicit)
    admin_push = public_push and policy.public_push_needs_approval(user)
    needs_approval = (approved_by is None and policy.needs_approval(stake)) or admin_push
    threshold = policy.approval_above
    auto_accepted = None if needs_approval else approval.accepted(cap, by_person=False, threshold=threshold)
    if approved_by is not None and not needs_approval:
        auto_accepted = cap  # accepted with what approved it (a sweep's max_cost covers this cap)
    if not needs_approval:  # fail fast, before staging; decided again under the owner's lock below
        with ctx.session() as s:
            admission.check_running(ctx, s, owner=user)
    # Before anything is rented: data checked, storage reachable, local inputs staged (staging.py).
    job_id = uuid.uuid4().hex[:12]
    checked = preflight.Preflight(offers=fitting)

    def checks(offers: list[Any]) -> list[Any]:
        """The image in its registry, the model's access with the host's read token, a storage probe."""
        nonlocal checked
        checked = preflight.check(
            ctx.settings,
            ctx.providers,
            base_model=plan.base_model,
            chosen=chosen,
            offers=offers,
            job_id=job_id,
            download_gb=est.disk.breakdown_gb.get("weights", 0.0) if est.disk is not None else 0.0,
        )
        return checked.offers

    prepared = staging.prepare(ctx.settings, ctx.providers, request, plan, chosen, fitting, checks)
    fitting = prepared.offers
    fields = spec_fields(  # the micro-batch and checkpointing the chosen offer was priced with
        plan,
        gpu=chosen.gpu,
        gpu_count=chosen.gpu_count,
        base_model=prepared.base_model,
        dataset_uri=prepared.dataset_uri,
        dataset_format=prepared.dataset_format,
        prompts=prepared.prompts,
    )
    stored_plan = deep_merge(fields, spec_overrides or {})  # the one stored plan (store/models.py Job.plan)
    staging.check_spec_size(stored_plan)  # what a host could not start is refused before it is created
    now = ctx.now()
    job = Job(
        id=job_id,
        owner=user,
        team=team,
        channel=channel or None,
        state=S.PENDING_APPROVAL if needs_approval else S.APPROVED,
        request=request.model_dump(mode="json"),
        choice=choice,
        offer=chosen.model_dump(mode="json"),
        offers=[o.model_dump(mode="json") for o in fitting],
        plan=stored_plan,
        provider=chosen.provider,
        gpu=chosen.gpu,
        gpu_count=chosen.gpu_count,
        interruptible=chosen.interruptible,
        price_per_hour=chosen.price_per_hour,
        estimated_cost=chosen.total_cost,
        estimated_hours=chosen.hours,
        max_cost=cap,
        checkpoint_minutes=chosen.checkpoint_minutes,
        disk_gb=est.disk.gb if est.disk is not None else None,
        start_deadline_s=checked.start_deadline_s,
        idempotency_key=idempotency_key,
        checkpoint_uri=f"{storage_root(ctx, job_id)}/checkpoints",
        created_at=now,
        updated_at=now,
        approved_by=None if needs_approval else (approved_by or "auto"),
        approved_cost=auto_accepted,
        approved_price_per_hour=None if needs_approval else chosen.price_per_hour,
        sweep_id=sweep_id,
    )
    with ctx.session() as s:
        if not needs_approval:
            admission.lock_owner(s, user)  # count and insert in one transaction per person
            try:
                admission.check_running(ctx, s, owner=user)
            except EngineError:
                s.rollback()
                raise
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
            existing = by_key(ctx, idempotency_key) if idempotency_key else None
            if existing is None:
                raise
            return view(ctx, existing.id)
    ctx.publish(
        EngineEventKind.job_created,
        job_id,
        f"Job {job_id} created: {request.model} on "
        f"{chosen.provider} {chosen.gpu} at {money(chosen.price_per_hour)}/h, estimated "
        f"{money(chosen.total_cost)}, cap {money(cap)}." + "".join(f" Note: {n}." for n in checked.notes),
        job=job,
        estimated_cost=chosen.total_cost,
        max_cost=cap,
        price_per_hour=chosen.price_per_hour,
    )
    if admin_push and not policy.needs_approval(stake):
        ctx.publish(
            EngineEventKind.approval_needed,
            job_id,
            f"Job {job_id} pushes its result to the public Hub repo {plan.push_to_hub}: an admin other than "
            f"{user} approves public pushes.",
            job=job,
            estimated_cost=chosen.total_cost,
            reason=f"it pushes its result to the public Hub repo {plan.push_to_hub}",
        )
    elif needs_approval:
        what = (
            f"may spend up to {money(explicit)} (max_cost; estimated {money(chosen.total_cost)})"
            if explicit is not None and explicit > chosen.total_cost
            else f"is estimated at {money(chosen.total_cost)}"
        )
        ctx.publish(
            EngineEventKind.approval_needed,
            job_id,
            f"Job {job_id} {what}, above {money(threshold)}: it needs approval by "
            f"{policy.who_approves(user, job_id)}.",
            job=job,
            estimated_cost=chosen.total_cost,
            at_stake=stake,
        )
    elif auto_launch:
        launch(ctx, job_id, user=user)
    return view(ctx, job_id)


def _nothing_launchable(est: Estimate) -> EngineError:
    """Why no offer of the estimate can be launched: it fits only on clouds this bot has no keys for, or
    nowhere (with the estimate's suggestions); why this machine's CPU is not among them, where the estimate
    says (engine/launching/offers.local_note)."""
    said = "prices: local: "
    local = next((a.removeprefix(said) for a in est.assumptions if a.startswith(said)), "")
    local = f" ({local})" if local else ""
    elsewhere = sorted({o.provider for o in est.offers if o.fits})
    if elsewhere:
        return EngineError(
            f"it fits only on {', '.join(elsewhere)}, which this bot has no keys for: "
            f"set the provider's API key to launch there{local}"
        )
    hint = f" Suggestions: {'; '.join(est.suggestions)}" if est.suggestions else ""
    return EngineError(f"no offer fits this fine-tune{local}.{hint}")


def _chosen_offer(fitting: list[RankedOffer], choice: str) -> RankedOffer:
    """The offer a person chose: by its label (cheapest, safest, fastest), its key or id, else as
    offers.pick reads the choice; EngineError for none."""
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
    return chosen


def _check_hub_push(policy: Permissions, user: str, repo: str | None, *, public: bool) -> None:
    """A push goes only into the allowed namespaces; a public one only with an admin's approval."""
    if repo:
        decision = policy.can_push_to_hub(user, repo, public=public)
        if not decision:
            raise PermissionDenied(decision.reason)


def approve(
    ctx: EngineContext, policy: Permissions, job_id: str, *, approver: str, auto_launch: bool = True
) -> JobView:
    job = load(ctx, job_id)
    push = (job.plan or {}).get("push_to_hub") or {}
    decision = policy.can_approve(
        approver,
        job.owner,
        amount=max(job.estimated_cost or 0, job.max_cost or 0),
        public_push=bool(push) and push.get("private") is False,
    )
    if not decision:
        raise PermissionDenied(decision.reason)
    with ctx.session() as s:
        ok = S.transition(
            s,
            job_id,
            S.PENDING_APPROVAL,
            S.APPROVED,
            actor=approver,
            now=ctx.now(),
            approved_by=approver,
            approved_cost=approval.accepted(job.max_cost, by_person=True, threshold=policy.approval_above),
            # the hourly price proposed (a pricier fallback, a bigger GPU): what a relaunch may rent
            approved_price_per_hour=job.price_per_hour,
            message=None,
        )
    if not ok:
        current = view(ctx, job_id)
        by = load(ctx, job_id).approved_by
        current.message = (
            f"already {current.state}" + (f" (approved by {by})" if by else "") + "; nothing done"
        )
        return current
    if auto_launch:
        launch(ctx, job_id, user=approver)
    return view(ctx, job_id)


def launch(ctx: EngineContext, job_id: str, *, user: str = "engine") -> JobView:
    """Launch an approved job (a no-op when someone else already claimed it)."""
    claim_id = claim(ctx, job_id, actor=user)
    if claim_id is not None:
        launch_job(ctx, job_id, claim_id, actor=user)
    return view(ctx, job_id)


def stop(ctx: EngineContext, policy: Permissions, job_id: str, *, user: str, reason: str = "user") -> JobView:
    job = load(ctx, job_id)
    decision = policy.can_stop(user, job.owner)
    if not decision:
        raise PermissionDenied(decision.reason)  # never the owner's name: a refusal tells nobody whose it is
    request_stop(ctx, job_id, reason=reason, actor=user)
    return view(ctx, job_id)


def request_stop(ctx: EngineContext, job_id: str, *, reason: str, actor: str, graceful: bool = True) -> None:
    """Cancel a job that has not launched; ask a running one to stop gracefully, so that it checkpoints and
    reports it on its way out: SIGTERM where its provider runs its process (the exit ends the job), else the
    run's signed stop request beside its checkpoints (bot/engine/outcome/stop_request.py: the supervisor
    ends the job at the runner's report, or past its grace). End it at once where nothing runs, nothing can
    be asked (no live runner: no heartbeat of its run), or ``graceful`` is False (an idle runner makes no
    step that could see the request)."""
    now = ctx.now()
    with ctx.session() as s:
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
                ctx.publish(
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
    rows = finish_mod.open_instances(ctx, job_id)
    if not rows:
        job = load(ctx, job_id)
        if job.state in (S.RECOVERING, S.RUNNING):
            finish_mod.finish(ctx, job_id, S.STOPPED, reason=reason, actor=actor)
        return
    signalled = False
    for row in rows:  # graceful: SIGTERM lets the runner checkpoint; the exit then ends the job
        sigterm = getattr(ctx.supervisable.get(row.provider), "preempt", None)
        if callable(sigterm):
            signalled = True
            try:
                sigterm(row.provider_instance_id, 30.0)
            except Exception as exc:  # noqa: BLE001
                log.warning("graceful stop of %s failed: %s", row.provider_instance_id, exc)
    if signalled or (graceful and stop_request.ask(ctx, job_id, reason=reason)):
        return  # the runner saves, reports and exits; the supervisor ends the job (its grace bounds the wait)
    finish_mod.finish(ctx, job_id, S.STOPPED, reason=reason, actor=actor)


def stop_covered_by_spent_budgets(ctx: EngineContext) -> list[str]:
    """Ask every active job that a spent budget covers to stop after a checkpoint; returns their ids.

    Here rather than in budgets.py: stopping is a job step, and budgets must not import jobs (jobs asks
    admission, which asks budgets)."""
    spent = budgets_mod.spent_budgets(ctx, roll_up=False)
    if not spent:
        return []
    who = ctx.policy.who_raises_budgets()
    users = {b.name for b in spent if b.scope == "user"}
    teams = {b.name for b in spent if b.scope == "team"}
    with ctx.session() as s:
        rows = s.execute(
            select(Job.id, Job.owner, Job.team).where(
                Job.state.in_(sorted(S.ACTIVE)),
                Job.stop_requested_at.is_(None),
                or_(Job.owner.in_(sorted(users)), Job.team.in_(sorted(teams))),
            )
        ).all()
    stopped: list[str] = []
    for job_id, owner, team in rows:
        covering = next(b for b in spent if (b.scope, b.name) in (("user", owner), ("team", team)))
        request_stop(ctx, job_id, reason="budget", actor="budget")
        ctx.publish(
            EngineEventKind.budget_alert,
            job_id,
            f"Job {job_id} is stopping after a checkpoint: {covering.describe()}. "
            f"{covering.how_to_raise(who, ctx.policy.budget_command())}.",
            scope=covering.scope,
            name=covering.name,
            period=covering.period,
            level=100,
            spent=round(covering.amount, 4),
            limit=covering.limit,
        )
        stopped.append(job_id)
    return stopped
