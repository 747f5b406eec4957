"""Launch: claim the job, re-check the live price, create the instance (label-first), record it.

Order matters for money. The claim (approved|recovering -> launching) commits before any provider
call, so concurrent clicks or replicas launch once. The provider call is idempotent by the job's
label, so a launch retried after a crash adopts the instance it had already created instead of
buying a second one. The instance row and the launching -> running transition commit together.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from bot.engine.crash import crashpoint
from bot.engine.events import EngineEventKind
from bot.engine.launching import approval, instance_env, integrity, runner_bundle
from bot.engine.launching.jobspec import deep_merge
from bot.engine.launching.staging import shares_disk
from bot.engine.record import runs
from bot.engine.record import states as S
from bot.engine.record.spend import job_spend
from bot.money import money
from bot.planner.offer import Offer
from bot.planner.result import RankedOffer
from bot.providers.base import (
    CapacityError,
    Instance,
    LaunchRequest,
    PriceChangedError,
    ProviderError,
    job_label,
    redact,
    redacting,
)
from bot.providers.registry import secrets as all_secrets
from bot.storage.credentials import CredentialsError, Issued
from runner.contract import heartbeat
from runner.contract.spec import JobSpec
from store.db import insert_for
from store.models import Instance as InstanceRow
from store.models import Job, JobRun

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)
DEFAULT_DISK_GB = 100  # jobs created before the disk was sized from the model (bot/planner/disk.py)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def storage_root(eng: EngineContext, job_id: str) -> str:
    base = eng.settings.checkpoint_base_uri
    if base:
        return f"{base.rstrip('/')}/{job_id}"
    return str(Path(eng.settings.data_dir) / "jobs" / job_id)


def offer_from_ranked(ranked: dict[str, Any]) -> Offer:
    r = RankedOffer.model_validate(ranked)
    return Offer(
        provider=r.provider,
        offer_id=r.offer_id,
        gpu=r.gpu,
        gpu_count=r.gpu_count,
        gpu_memory_gb=r.gpu_memory_gb,
        price_per_hour=r.price_per_hour,
        interruptible=r.interruptible,
        reliability=r.reliability,
        source=r.source,
    )


def offer_key(ranked: dict[str, Any]) -> str:
    return f"{ranked['provider']}:{ranked['offer_id']}:{'spot' if ranked.get('interruptible') else 'od'}"


def build_spec(
    eng: EngineContext, job: Job, offer: dict[str, Any], token: str | None, run: JobRun | None = None
) -> JobSpec:
    """The JobSpec for one launch of the job: one run (bot/engine/record/runs.py), writing in its own folder
    and resuming from the checkpoints the bot acknowledged (``run.resume``).

    The training fields were decided when the job was created (bot/engine/launching/jobspec.py, stored once in
    ``job.plan``); a launch adds what depends on the offer and the moment: GPUs, the report token, W&B,
    the run and the spend so far for the model card.
    """
    from bot.engine.record.spend import job_spend

    root = storage_root(eng, job.id)
    if run is not None:
        root = runs.run_root(root, run.id)
    gpus = 0 if offer.get("gpu") == "cpu" else int(offer.get("gpu_count") or 1)
    settings = eng.settings
    with eng.session() as s:
        spent = job_spend(s, job.id, eng.now())
    kind = "spot" if offer.get("interruptible") else "on-demand"
    runtime: dict[str, Any] = {
        "job_id": job.id,
        "gpus": gpus,
        "checkpoint": {
            "uri": runs.checkpoint_folder(root)
            if run is not None
            else job.checkpoint_uri or f"{root}/checkpoints",
            "every_minutes": job.checkpoint_minutes or 20.0,
            "keep": 2,
        },
        "report": {
            "callback_url": (
                f"{settings.public_url.rstrip('/')}/runner/events" if settings.public_url else None
            ),
            "token": token,
            "every_seconds": settings.report_every_s,
            # liveness on its own cadence, whatever the report cadence (runner/contract/heartbeat.py)
            "heartbeat_seconds": heartbeat.every(settings.heartbeat_timeout_s),
        },
        "wandb": {
            "run_id": job.id,
            "mode": wandb_mode(settings),
            "project": settings.wandb_project,
            "entity": settings.wandb_entity,
        },
        "output_uri": runs.output_folder(root),
        "cost": {
            "price_per_hour": float(offer.get("price_per_hour") or 0.0),
            "spent_before": round(spent, 6),
            "estimated_total": job.estimated_cost,
            "where": f"{offer.get('provider')} {offer.get('gpu')} x{offer.get('gpu_count') or 1} ({kind})",
            # The runner's own stop at the cap (runner/contract/spec.py CostSpec.paid): billing of this run
            # starts after this moment (the create call comes next), and a runner that has not started within
            # the job's start deadline is ended by the bot (engine/watching/startup.py), so no boot is longer.
            "max_cost": job.max_cost or None,
            "billed_from": eng.now(),
            "max_start_s": float(job.start_deadline_s or settings.heartbeat_timeout_s * 2),
        },
    }
    spec = deep_merge(runtime, job.plan or {})  # the plan wins, as the demo's faster checkpoints do
    spec["job_id"] = job.id
    spec["report"]["token"] = token
    if run is not None:  # the run's own folder and what it resumes from, whatever the plan says
        spec["checkpoint"]["uri"] = runtime["checkpoint"]["uri"]
        spec["run_id"] = run.id
        spec["resume"] = list(run.resume or [])
    return JobSpec.model_validate(spec)


def wandb_mode(settings: Any) -> str:
    """online with a WANDB_API_KEY, unless WANDB_MODE says offline or disabled (offline works without one)."""
    asked = (settings.wandb_mode or "").strip().lower()
    if asked == "disabled":
        return "disabled"
    if asked in ("offline", "dryrun"):
        return "offline"
    return "online" if settings.wandb_api_key else "disabled"


def runner_env(eng: EngineContext, spec: JobSpec, issued: Issued | None = None) -> dict[str, str]:
    """The instance's environment: the spec and only the secrets this job needs
    (engine/launching/instance_env.py): storage credentials scoped to the run where ``issued`` is
    (bot/storage/credentials.py), else the bot's; the run's own key (bot/engine/launching/integrity.py)."""
    from bot.engine.launching.staging import storage_env
    from bot.storage.renewal import credentials_uri

    storage = storage_env(eng.settings)
    if issued is not None and issued.scoped:
        storage = {k: v for k, v in storage.items() if k not in STATIC_KEYS}
        storage.update(issued.env)
        storage["TUNEBOT_CREDENTIALS_URI"] = credentials_uri(spec_root(eng, spec))
    key = integrity.run_key(eng, spec.job_id, spec.run_id) if spec.run_id else None
    if key is None:  # never the job-wide key of before runs: a host of another run would hold it too
        raise ValueError(f"job {spec.job_id}: a launch without a run has no key")
    return instance_env.runner_env(
        eng.settings,
        spec,
        storage=storage,
        job_key=key.hex(),  # the run's own key: signs its events and manifests
    )


def spec_root(eng: EngineContext, spec: JobSpec) -> str:
    """The folder a spec's run writes in: its run's folder (the job's folder for a spec without a run)."""
    root = storage_root(eng, spec.job_id)
    return runs.run_root(root, spec.run_id) if spec.run_id else root


STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def storage_credentials(eng: EngineContext, spec: JobSpec) -> Issued | None:
    """The storage credentials of this launch: scoped to the job's folder and inputs, made now (None when
    the job's storage is not object storage). CredentialsError when the store refuses."""
    from bot.storage import credentials
    from bot.storage.scope import scope_for

    root = spec_root(eng, spec)
    if not root.startswith("s3://"):
        return None
    reads = [p.uri for p in spec.resume] + ([spec.verify.uri] if spec.verify else [])  # a sweep's check
    scope = scope_for(root, dataset=spec.dataset.uri, base_model=spec.base_model, resume=reads)
    return credentials.issue(eng.settings, scope, name=spec.run_id or spec.job_id, now=eng.now())


def unscoped_note(eng: EngineContext) -> str:
    """The launch card's warning when runners get the bot's own storage keys (empty when they do not)."""
    from bot.storage.credentials import Mode, choose

    base = eng.settings.checkpoint_base_uri or ""
    if not base.startswith("s3://") or choose(eng.settings)[0] is not Mode.static:
        return ""
    return (
        " Storage is not scoped per job (TUNEBOT_STORAGE_CREDENTIALS, docs/security.md): this job's host "
        "holds keys to every job's data."
    )


def candidate_offers(job: Job, *, avoid: str | set[str] | None = None) -> list[dict[str, Any]]:
    """The chosen offer first, then the estimate's other fitting offers; a just-preempted offer and the hosts
    that never started the runner last."""
    seen: set[str] = set()
    ordered: list[dict[str, Any]] = []
    for o in [job.offer, *(job.offers or [])]:
        k = offer_key(o)
        if k not in seen:
            seen.add(k)
            ordered.append(o)
    if avoid:
        avoided = {avoid} if isinstance(avoid, str) else avoid
        ordered.sort(key=lambda o: f"{o['provider']}:{o['offer_id']}" in avoided)
    return ordered


def claim(eng: EngineContext, job_id: str, *, actor: str) -> str | None:
    """approved|recovering -> launching; returns the claim id, or None when someone else has it, or when
    the launch may not happen now (a spent budget ends the job, the per-user limit makes it wait)."""
    if not _admitted(eng, job_id, actor=actor):
        return None
    now = eng.now()
    claim_id = uuid.uuid4().hex
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state not in (S.APPROVED, S.RECOVERING):
            return None
        retry = job.retry_count + (1 if job.state == S.RECOVERING else 0)
        if job.state == S.RECOVERING and job.retry_count >= eng.settings.retry_budget:
            down = (job.message or "").startswith(CLOUD_UNREACHABLE)
            why = f"gave up after {job.retry_count} relaunches (retry budget)"
            if down:  # the cloud never answered: say so, and what to do, not "retry budget"
                said = (job.message or "").split(". Nothing is rented", 1)[0]
                why = (
                    f"{said}; gave up after {job.retry_count} tries. Nothing is rented. Next: once the cloud "
                    f"answers again, `resume {job_id}`"
                )[:1000]
            if S.transition(
                s,
                job_id,
                S.RECOVERING,
                S.FAILED,
                actor=actor,
                now=now,
                reason=CLOUD_UNREACHABLE if down else "retry budget",
                message=why,
                finished_at=now,
            ):
                eng.publish(EngineEventKind.failed, job_id, f"Job {job_id} failed: {why}.")
            return None
        ok = S.transition(
            s,
            job_id,
            [S.APPROVED, S.RECOVERING],
            S.LAUNCHING,
            actor=actor,
            now=now,
            claim_id=claim_id,
            claimed_at=now,
            retry_count=retry,
        )
    return claim_id if ok else None


def _admitted(eng: EngineContext, job_id: str, *, actor: str) -> bool:
    """Budgets and the running limit, asked before the claim (bot/engine/launching/admission.py)."""
    from bot.engine.launching import admission

    with eng.session() as s:
        job = s.get(Job, job_id)
    if job is None or job.state not in (S.APPROVED, S.RECOVERING):
        return True  # the claim itself says no
    blocker = admission.launch_blocker(eng, job)
    if blocker is None:
        return True
    kind, why = blocker
    now = eng.now()
    with eng.session() as s:
        if kind == "limit":  # wait in approved; say so once
            if job.message != why:
                s.execute(update(Job).where(Job.id == job_id, Job.state == S.APPROVED).values(message=why))
                s.commit()
            return False
        final = S.CANCELLED if job.state == S.APPROVED else S.STOPPED
        if S.transition(
            s,
            job_id,
            job.state,
            final,
            actor=actor,
            now=now,
            reason="budget",
            stop_reason="budget",
            message=why[:1000],
            finished_at=now,
        ):
            text = f"Job {job_id} not launched: {why}."
            eng.publish(EngineEventKind.stopped, job_id, text, reason="budget", state=final)
    return False


def reclaim_stale(eng: EngineContext, job_id: str, *, actor: str, force: bool) -> str | None:
    """Take over a launching claim whose holder died (older than the claim timeout, or ``force``)."""
    now = eng.now()
    claim_id = uuid.uuid4().hex
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.LAUNCHING:
            return None
        if not force and job.claimed_at and now - job.claimed_at < eng.limits.launch_claim_timeout_s:
            return None
        if force and job.claim_id and job.claim_id in eng.own_claims:
            return None
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.state == S.LAUNCHING, Job.claim_id == job.claim_id)
            .values(claim_id=claim_id, claimed_at=now, updated_at=now)
        )
        if res.rowcount != 1:
            s.rollback()
            return None
        S.audit(s, actor=actor, action="reclaim-launch", job_id=job_id, at=now, previous=job.claim_id)
        s.commit()
    return claim_id


def take_over(eng: EngineContext, job_id: str, *, actor: str, force: bool) -> bool:
    """Take over a launch whose process died (a crash, a restart) and carry it to its end: an instance runs,
    or the job leaves ``launching`` with the reason. True when an instance runs."""
    claim_id = reclaim_stale(eng, job_id, actor=actor, force=force)
    if not claim_id:
        return False
    return launch_claimed(eng, job_id, claim_id, actor=actor)


def launch_claimed(eng: EngineContext, job_id: str, claim_id: str, *, actor: str) -> bool:
    """``launch_job``, where a launch that raises still ends: the job goes back to ``recovering`` with the
    error as its reason (the next tick tries again, within the retry budget), never ``launching`` forever
    (issue 38: a taken-over relaunch raised, and nothing took the job over again)."""
    try:
        return launch_job(eng, job_id, claim_id, actor=actor)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the job must not stay claimed
        log.warning("launch of job %s failed", job_id, exc_info=True)  # its traceback: for the log only
        said = redact(f"{type(exc).__name__}: {exc}", all_secrets(eng.settings))[:500]
        _launch_raised(eng, job_id, claim_id, actor, f"launch failed: {said}")
        return False


def _launch_raised(eng: EngineContext, job_id: str, claim_id: str, actor: str, message: str) -> None:
    """launching -> recovering, only while the claim is still this launch's (under the job's row lock)."""
    with eng.session() as s:
        job = S.lock_job(s, job_id)
        if job is None or job.state != S.LAUNCHING or job.claim_id != claim_id:
            s.rollback()
            return
        S.transition(
            s,
            job_id,
            S.LAUNCHING,
            S.RECOVERING,
            actor=actor,
            now=eng.now(),
            reason="launch failed",
            message=message,
            claim_id=None,
        )
    eng.publish(
        EngineEventKind.warning,
        job_id,
        f"Job {job_id}: {message}; the bot tries again.",
        launch_failed=message,
    )


def record_instance(
    eng: EngineContext,
    s: Any,
    job: Job,
    inst: Instance,
    price: float,
    offer: dict[str, Any] | None,
    *,
    adopted: bool = False,
) -> InstanceRow:
    """Get-or-create the row of a provider instance (idempotent: a relaunch may adopt the same one).

    The insert is ``ON CONFLICT DO NOTHING`` on (provider, instance id): processes adopting the same
    instance at once all get the one row, and only the one that wrote it audits it.

    Billing starts on the provider's clock: its creation time where its API gives one, else when the
    create call was sent (``jobs.launch_requested_at``), so an instance adopted after a crash between
    create and commit is billed for the seconds before its adoption too.
    """
    now = eng.now()
    same = (InstanceRow.provider == inst.provider, InstanceRow.provider_instance_id == inst.instance_id)
    row = s.execute(select(InstanceRow).where(*same)).scalars().first()
    if row is None:
        row = InstanceRow(
            provider=inst.provider,
            provider_instance_id=inst.instance_id,
            job_id=job.id,
            label=inst.label or job_label(job.id),
            offer_id=(offer or {}).get("offer_id"),
            gpu=inst.gpu or (offer or {}).get("gpu"),
            gpu_count=inst.gpu_count or (offer or {}).get("gpu_count"),
            price_per_hour=price,
            launched_at=billing_start(inst, job, now),
            created_at=inst.created_at.timestamp() if inst.created_at else None,
            status=str(inst.status),
            raw_status=inst.raw_status,
            last_seen_at=now,
            adopted=adopted,
        )
        values = {c.name: getattr(row, c.name) for c in InstanceRow.__table__.columns if c.name != "id"}
        created = s.execute(
            insert_for(s, InstanceRow)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["provider", "provider_instance_id"])
        ).rowcount
        row = s.execute(select(InstanceRow).where(*same)).scalars().one()
        if not created:
            return row  # another process recorded it a moment ago
        S.audit(
            s,
            actor="engine",
            action="adopt" if adopted else "instance-created",
            job_id=job.id,
            at=now,
            provider=inst.provider,
            instance_id=inst.instance_id,
            price_per_hour=price,
        )
    return row


def billing_start(inst: Instance, job: Job, now: float) -> float:
    """When an instance started to bill: the provider's creation time, else the launch request, else now
    (never in the future: a provider clock ahead of ours bills from our now)."""
    if inst.created_at is not None:
        return min(inst.created_at.timestamp(), now)
    if job.launch_requested_at is not None:
        return min(job.launch_requested_at, now)
    return now


@dataclass
class _Walk:
    """One launch's walk down the ranked offers: what it may rent without asking again, why each offer was
    passed over, and what it prepares once whatever the offer."""

    job: Job
    run: JobRun  # this launch's own key and folder
    spent: float
    approved_key: str
    # Another offer than the approved one is rented only within what was accepted
    # (bot/engine/launching/approval.py); when the projection leans on progress a host reported (done > 0),
    # also within the accepted hourly price.
    limit: float
    done: float
    hourly: float
    held: list[approval.Proposal] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    down: dict[str, str] = field(default_factory=dict)  # a cloud whose API does not answer: not asked again
    refused: set[str] = field(default_factory=set)  # a cloud that rejects the key: the same for every offer
    price_refused: bool = False
    issued: Issued | None = None
    # the runner for a stock image (bot/engine/launching/runner_bundle.py)
    staged: dict[str, str] | None = None

    @classmethod
    def start(cls, eng: EngineContext, job: Job, run: JobRun, spent: float) -> _Walk:
        done = approval.done_fraction(job)
        hourly = approval.hourly_ceiling(job, eng.settings.price_tolerance) if done > 0 else math.inf
        return cls(job, run, spent, offer_key(job.offer), approval.launch_limit(job), done, hourly)

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def claimed(self) -> bool:
        """Whether the projection leans on progress a host reported."""
        return self.done > 0


def launch_job(eng: EngineContext, job_id: str, claim_id: str, *, actor: str = "engine") -> bool:
    """Launch the claimed job on the best offer that has capacity; True when an instance runs."""
    eng.own_claims.add(claim_id)
    crashpoint("launch.after_claim")
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.LAUNCHING or job.claim_id != claim_id:
            return False
        adopted = _open_instance(s, job_id)
        if (
            adopted is not None
        ):  # adopted while the claim was open (reconciler, crashed launcher): just run it
            return _commit_running(eng, job_id, claim_id, adopted, None, None)
        offers = candidate_offers(job, avoid=_hosts_to_avoid(s, job_id))
        spent = job_spend(s, job_id, eng.now())
    run = runs.start(eng, job_id, claim_id, storage_root(eng, job_id))
    if run is None:
        return False
    crashpoint("relaunch.after_run_started" if job.retry_count else "launch.after_run_started")
    walk = _Walk.start(eng, job, run, spent)
    for ranked in offers:
        launched = _try_offer(eng, walk, ranked, claim_id, actor)
        if launched is not None:
            return launched
    return _nothing_launched(eng, walk, actor)


def _open_instance(s: Any, job_id: str) -> InstanceRow | None:
    """The job's newest open instance, if any."""
    open_rows = (
        s.execute(select(InstanceRow).where(InstanceRow.job_id == job_id, InstanceRow.ended_at.is_(None)))
        .scalars()
        .all()
    )
    return open_rows[-1] if open_rows else None


def _hosts_to_avoid(s: Any, job_id: str) -> set[str]:
    """ "provider:offer" of the hosts this job is not launched on again: those that never started the runner
    (bot/engine/watching/startup.py: retried on another host) and the last one that preempted it."""
    last_preempted = (
        s.execute(
            select(InstanceRow)
            .where(InstanceRow.job_id == job_id, InstanceRow.end_reason == "preempted")
            .order_by(InstanceRow.id.desc())
        )
        .scalars()
        .first()
    )
    never_started = s.execute(
        select(InstanceRow.provider, InstanceRow.offer_id).where(
            InstanceRow.job_id == job_id, InstanceRow.end_reason == "start timeout"
        )
    ).all()
    avoid = {f"{p}:{o}" for p, o in never_started}
    if last_preempted:
        avoid.add(f"{last_preempted.provider}:{last_preempted.offer_id}")
    return avoid


def _try_offer(
    eng: EngineContext, walk: _Walk, ranked: dict[str, Any], claim_id: str, actor: str
) -> bool | None:
    """Launch on one ranked offer: None when it was passed over (the reason noted in ``walk``), else whether
    the launch ended with an instance running (False: the job failed or waits, with its reason)."""
    if ranked["provider"] in walk.down or ranked["provider"] in walk.refused:
        return None
    provider = eng.providers.get(ranked["provider"])
    if provider is None:
        walk.reasons.append(f"{ranked['provider']}: not configured")
        return None
    live = _live_offer(eng, walk, provider, ranked)
    if live is None or not _within_approval(walk, ranked, live):
        return None
    token = secrets.token_urlsafe(32)
    try:
        spec = build_spec(eng, walk.job, ranked, token, walk.run)
    except ValueError as exc:  # a bad spec never gets better by retrying: fail with the reason
        return _invalid_spec(eng, walk.job_id, actor, str(exc).replace(token, "***")[:500])
    started = _runner_start(eng, walk, spec, provider, actor)
    if started is None:
        return False
    inst = _create_instance(eng, walk, provider, ranked, live, spec, *started)
    if inst is None:
        return None
    crashpoint("launch.after_provider_create")
    price = inst.price_per_hour if inst.price_per_hour else live.price_per_hour
    row = _record_launch(eng, walk, inst, price, ranked, token)
    return _commit_running(eng, walk.job_id, claim_id, row, ranked, price)


def _live_offer(eng: EngineContext, walk: _Walk, provider: Any, ranked: dict[str, Any]) -> Offer | None:
    """The offer at its live price, within the tolerance of the accepted one; None (the reason noted) when
    the price rose or the cloud failed."""
    from bot.providers.lifecycle import check_price

    accepted = float(ranked["price_per_hour"])
    try:
        return check_price(provider, offer_from_ranked(ranked), accepted, eng.settings.price_tolerance)
    except PriceChangedError as exc:
        walk.price_refused = True
        walk.reasons.append(f"{ranked['provider']} {ranked['gpu']}: {exc}")
    except ProviderError as exc:
        walk.reasons.append(f"{ranked['provider']}: {type(exc).__name__}: {exc}")
        _note_cloud_failure(exc, ranked["provider"], walk.down, walk.refused, str(exc))
    return None


def _within_approval(walk: _Walk, ranked: dict[str, Any], live: Offer) -> bool:
    """Whether this offer may be rented without asking: the approved one always; another one when its
    projected cost stays within what was accepted and its live price within the hourly ceiling (else it is
    held, to be asked about, with the reason noted)."""
    if offer_key(ranked) == walk.approved_key:
        return True
    accepted = float(ranked["price_per_hour"])
    ratio = live.price_per_hour / accepted if accepted > 0 else 1.0
    total = float(ranked.get("total_cost") or 0.0)
    projected = approval.projected_cost(spent=walk.spent, done=walk.done, total_cost=total, price_ratio=ratio)
    if projected > walk.limit + 1e-9:
        walk.held.append(approval.Proposal(ranked, projected, live.price_per_hour))
        walk.reasons.append(
            f"{ranked['provider']} {ranked['gpu']}: projects {money(projected)}, above {money(walk.limit)}"
        )
        return False
    if live.price_per_hour > walk.hourly + 1e-9:
        walk.held.append(approval.Proposal(ranked, projected, live.price_per_hour, hourly_limit=walk.hourly))
        walk.reasons.append(
            f"{ranked['provider']} {ranked['gpu']}: {money(live.price_per_hour)}/h, above the "
            f"{money(walk.hourly)}/h a relaunch may rent without asking"
        )
        return False
    return True


def _invalid_spec(eng: EngineContext, job_id: str, actor: str, problem: str) -> bool:
    """The job fails with why its spec is invalid (the token already masked in ``problem``)."""
    now = eng.now()
    with eng.session() as s:
        if S.transition(
            s,
            job_id,
            S.LAUNCHING,
            S.FAILED,
            actor=actor,
            now=now,
            reason="invalid spec",
            message=f"invalid job spec: {problem}",
            finished_at=now,
            claim_id=None,
        ):
            eng.publish(EngineEventKind.failed, job_id, f"Job {job_id} failed: invalid job spec: {problem}")
    return False


def _runner_start(
    eng: EngineContext, walk: _Walk, spec: JobSpec, provider: Any, actor: str
) -> tuple[dict[str, str], list[str] | None] | None:
    """The runner's environment and command on this offer's host: storage credentials issued once per
    launch (the same scope whatever the offer), and on a stock image the runner staged once, in the run's
    own folder (the only one its storage credentials reach). None when either could not be made: the job
    waits (recovering) with the reason."""
    if walk.issued is None:
        try:
            walk.issued = storage_credentials(eng, spec)
        except CredentialsError as exc:
            _no_credentials(eng, walk.job_id, actor, str(exc))
            return None
    env = runner_env(eng, spec, walk.issued)
    if not runner_bundle.uses_stock_image(eng.settings) or shares_disk(provider):
        return env, None
    if walk.staged is None:  # the same wheel and URLs whatever the offer
        try:
            walk.staged = runner_bundle.stage(eng.settings, spec_root(eng, spec), env)
        except runner_bundle.StagingError as exc:
            _not_staged(eng, walk.job_id, actor, str(exc))
            return None
    return {**env, **walk.staged}, list(runner_bundle.BOOTSTRAP_COMMAND)


def _create_instance(
    eng: EngineContext,
    walk: _Walk,
    provider: Any,
    ranked: dict[str, Any],
    live: Offer,
    spec: JobSpec,
    env: dict[str, str],
    command: list[str] | None,
) -> Instance | None:
    """Create the instance on this offer (or adopt the one the job's label already names); None when the
    cloud had no capacity or failed (the reason noted, every secret redacted from it)."""
    from bot.providers.lifecycle import ensure_launched

    hidden = [*instance_env.secret_values(env, spec), *all_secrets(eng.settings)]
    try:
        req = LaunchRequest(
            job_id=walk.job_id,
            offer=live,
            image=runner_bundle.image_for(eng.settings),
            command=command,
            env=env,
            bid_per_hour=live.price_per_hour if live.interruptible else None,
            disk_gb=int(walk.job.disk_gb or DEFAULT_DISK_GB),
        )
        with eng.session() as s:  # before the create call: the fallback start of billing
            s.execute(update(Job).where(Job.id == walk.job_id).values(launch_requested_at=eng.now()))
            s.commit()
        with redacting(hidden):  # a provider error that echoes the request names none of them
            return ensure_launched(provider, req)
    except CapacityError as exc:
        walk.reasons.append(redact(f"{ranked['provider']} {ranked['gpu']}: no capacity ({exc})", hidden))
    except ProviderError as exc:
        walk.reasons.append(redact(f"{ranked['provider']}: {type(exc).__name__}: {exc}", hidden))
        _note_cloud_failure(exc, ranked["provider"], walk.down, walk.refused, redact(str(exc), hidden))
    return None


def _record_launch(
    eng: EngineContext, walk: _Walk, inst: Instance, price: float, ranked: dict[str, Any], token: str
) -> InstanceRow:
    """The instance's row, the run's instance, and on the job its token's hash, its credentials' expiry and
    the hourly price now accepted, in one commit."""
    with eng.session() as s:
        j = s.get(Job, walk.job_id)
        assert j is not None
        row = record_instance(eng, s, j, inst, price, ranked)
        runs.set_instance(s, walk.run.id, inst.provider, inst.instance_id)
        expiring = walk.issued is not None and walk.issued.expires_at is not None
        accepted_price = approval.approved_price(j)
        if not walk.claimed and (accepted_price is None or price > accepted_price):
            accepted_price = price  # a fallback the projection alone accepted (no host's claim in it)
        s.execute(
            update(Job)
            .where(Job.id == walk.job_id)
            .values(
                token_hash=token_hash(token),
                credentials_issued_at=eng.now() if expiring else None,
                credentials_expire_at=walk.issued.expires_at if expiring else None,  # type: ignore[union-attr]
                approved_price_per_hour=accepted_price,
            )
        )
        s.commit()
    return row


def _nothing_launched(eng: EngineContext, walk: _Walk, actor: str) -> bool:
    """Nothing launched. Only pricier offers left: ask again. A price rise stops the job with its reason;
    capacity waits for the next tick. Each reason once (several offers of one cloud fail alike)."""
    job_id = walk.job_id
    message = "; ".join(dict.fromkeys(walk.reasons)) or "no offer to launch on"
    if walk.held:
        cheapest = min(walk.held, key=lambda p: p.projected)
        why = "the approved offer cannot be rented now" if walk.job.started_at is None else "relaunching"
        if approval.ask_again(eng, walk.job, cheapest, why=why, actor=actor):
            log.warning("launch of %s held for approval: %s", job_id, message)
            return False
    now = eng.now()
    with eng.session() as s:
        if walk.price_refused and all("no capacity" not in r for r in walk.reasons):
            _stop_on_price(eng, s, job_id, actor, now, message)
            return False
        unreachable = bool(walk.down) and all(
            _is_down_reason(r, walk.down) for r in dict.fromkeys(walk.reasons)
        )
        if unreachable:
            message = unreachable_message(eng, walk.job, walk.down)
        S.transition(
            s,
            job_id,
            S.LAUNCHING,
            S.RECOVERING,
            actor=actor,
            now=now,
            reason=CLOUD_UNREACHABLE if unreachable else "launch failed",
            message=message if unreachable else f"launch failed: {message}",
        )
    log.warning("launch of %s failed: %s", job_id, message)
    return False


def _stop_on_price(eng: EngineContext, s: Any, job_id: str, actor: str, now: float, message: str) -> None:
    """A live price rose and no offer lacked capacity: the job stops, saying why."""
    if S.transition(
        s,
        job_id,
        S.LAUNCHING,
        S.STOPPED,
        actor=actor,
        now=now,
        reason="price",
        stop_reason="price",
        message=f"launch stopped: {message}",
        finished_at=now,
    ):
        eng.publish(
            EngineEventKind.stopped,
            job_id,
            f"Job {job_id} not launched: the live price rose above the accepted estimate. {message}",
            reason="price",
        )


CLOUD_UNREACHABLE = "cloud unreachable"


def _note_cloud_failure(
    exc: ProviderError, provider: str, down: dict[str, str], refused: set[str], said: str
) -> None:
    """A cloud whose API did not answer (or kept failing) within its deadline, or that rejects the key: none
    of its other offers would do better in this launch."""
    from bot.providers.base import AuthError, ProviderDownError

    if isinstance(exc, ProviderDownError):
        down[provider] = said
    elif isinstance(exc, AuthError):
        refused.add(provider)


def _is_down_reason(reason: str, down: dict[str, str]) -> bool:
    return any(reason.startswith(f"{name}:") or reason.startswith(f"{name} ") for name in down)


def unreachable_message(eng: EngineContext, job: Job, down: dict[str, str]) -> str:
    """What a job waiting on clouds that do not answer shows: which, why (once each), how long, what to do."""
    names = ", ".join(sorted(down))
    said = "; ".join(dict.fromkeys(down.values()))
    left = max(0, eng.settings.retry_budget - job.retry_count)
    return (
        f"{CLOUD_UNREACHABLE}: {said}. Nothing is rented; the bot tries {names} again on each tick "
        f"({left} more time(s)), then the job fails. Next: check that {names} answers (its status page, "
        f"its API URL and key), or `stop {job.id}`."
    )[:1000]


def _commit_running(
    eng: EngineContext,
    job_id: str,
    claim_id: str,
    row: InstanceRow,
    ranked: dict[str, Any] | None,
    price: float | None,
) -> bool:
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        fields: dict[str, Any] = {"claim_id": None, "message": None}
        if ranked is not None:
            fields.update(
                provider=ranked["provider"],
                gpu=ranked["gpu"],
                gpu_count=ranked["gpu_count"],
                interruptible=bool(ranked.get("interruptible")),
                price_per_hour=price,
            )
        if job.started_at is None:
            fields["started_at"] = now
        # A relaunch (claimed from recovering: a preemption, a failed start, a failed launch) is a recovery;
        # the first start of a job someone resumed (`resume`: its checkpoint, retry count 0) is a resume.
        recovered = job.retry_count > 0
        resumed_step = job.last_checkpoint_step if job.last_checkpoint_uri is not None else None
        if recovered:  # what this run was told to resume from (runs.py), not what an earlier one reported
            run = s.get(JobRun, job.run_id) if job.run_id else None
            points = [p for p in (run.resume if run is not None else []) or [] if isinstance(p, dict)]
            resumed_step = points[0].get("step") if points else None
        ok = False
        if job.state == S.LAUNCHING and job.claim_id == claim_id:
            res = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == S.LAUNCHING, Job.claim_id == claim_id)
                .values(state=S.RUNNING, updated_at=now, **fields)
            )
            ok = res.rowcount == 1
        if ok:
            S.audit(
                s,
                actor="engine",
                action="transition:launching->running",
                job_id=job_id,
                at=now,
                instance=row.provider_instance_id,
                provider=row.provider,
            )
        s.commit()
    if not ok:
        return False  # the job was stopped meanwhile: the monitor/reaper terminates the instance
    crashpoint("launch.after_commit")
    kind = EngineEventKind.recovered if recovered else EngineEventKind.job_started
    if recovered:
        what = (
            f"resumed from its checkpoint at step {resumed_step} on"
            if resumed_step is not None
            else "restarted from the beginning (no checkpoint to resume from) on"
        )
    elif resumed_step is not None:
        what = f"resumed from its checkpoint at step {resumed_step} on"
    else:
        what = "started on"
    eng.publish(
        kind,
        job_id,
        f"Job {job_id} {what} {row.provider} {row.gpu or ''} at {money(row.price_per_hour)}/h."
        + unscoped_note(eng),
        provider=row.provider,
        gpu=row.gpu,
        price_per_hour=row.price_per_hour,
        instance_id=row.provider_instance_id,
        **({"resumed_from_step": resumed_step} if not recovered and resumed_step is not None else {}),
    )
    return True


def _no_credentials(eng: EngineContext, job_id: str, actor: str, problem: str) -> bool:
    """The store would not make this launch's storage credentials: nothing is rented; the job waits for the
    next try (recovering) with the reason."""
    message = f"launch failed: the runner's storage credentials could not be made: {problem}"
    return _back_to_recovering(eng, job_id, actor, "storage credentials", message)


def _not_staged(eng: EngineContext, job_id: str, actor: str, problem: str) -> bool:
    """The runner could not be staged for a stock image: nothing is rented; the job waits for the next try
    (recovering) with the reason, within the retry budget."""
    return _back_to_recovering(eng, job_id, actor, "runner staging", f"launch failed: {problem}")


def _back_to_recovering(eng: EngineContext, job_id: str, actor: str, reason: str, message: str) -> bool:
    """A launch that rented nothing: launching -> recovering with the reason (the next try comes later)."""
    message = message[:1000]
    with eng.session() as s:
        S.transition(
            s,
            job_id,
            S.LAUNCHING,
            S.RECOVERING,
            actor=actor,
            now=eng.now(),
            reason=reason,
            message=message,
        )
    log.warning("launch of %s: %s", job_id, message)
    return False


def spec_json_safe(spec: JobSpec) -> str:
    """The spec as JSON with the token removed (for logs and audit)."""
    data = json.loads(spec.model_dump_json())
    data["report"]["token"] = "***"
    return json.dumps(data)
