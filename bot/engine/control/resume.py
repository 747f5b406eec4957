"""Continue a stopped or failed job, or relaunch one with changes.

``resume``: the same job runs again (a new run of it, not a new job): its checkpoints, W&B run, thread and
spend stay its own, so the new run continues from its newest acknowledged checkpoint
(bot/engine/record/runs.py) and the job's cap keeps counting everything it has spent. ``max_cost`` raises the
cap (a budget-stopped job needs that); a cap above the approval amount goes through approval as a new job
would (the permissions policy decides, not this module), unless a person already approved at least that much
for this job. Only the job's owner or an admin may resume it, in a channel where they may launch.

``clone_request``: the job's request with some options changed (``key=value`` through the same options table
as estimate and launch), to be estimated, priced and launched as a new job by the caller. Only the job's owner
or an admin clones it (it reads their data); the caller checks the request's sources for the cloner as for a
new launch (bot/chat/handlers.py), so a dataset that came from a Slack upload is handed back as that upload
(``slack:F...``) and fetched again with the cloner's own access, and the Hub repo is checked at create.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from bot.engine.api import EngineError, JobView, PermissionDenied
from bot.engine.context import EngineContext
from bot.engine.control import jobs
from bot.engine.events import EngineEventKind
from bot.engine.launching import admission, approval
from bot.engine.permissions import OPERATOR, Permissions
from bot.engine.record import runs
from bot.engine.record import states as S
from bot.engine.record.jobstate import resumable
from bot.money import money
from bot.planner.request import EstimateRequest
from store.models import Job

log = logging.getLogger(__name__)

PERSON_APPROVALS_EXCLUDE = (None, "auto")  # approved_by values that are not a person's approval


def why_not_resumable(job: Job) -> str | None:
    """Why this job cannot be resumed (pure), None when it can."""
    if resumable(job.state, job.stop_reason):
        return None
    if job.state == S.SUCCEEDED or job.state == S.STOPPED:  # finished, or stopped on a loss plateau
        where = f" (output: {job.output_uri})" if job.output_uri else ""
        return (
            f"job {job.id} {'finished' if job.state == S.SUCCEEDED else 'stopped on a loss plateau'}"
            f"{where}: nothing to resume; `clone {job.id} key=value ...` trains again with changes"
        )
    if job.state == S.CANCELLED:
        return f"job {job.id} was cancelled before it ran: `clone {job.id}` launches it again"
    return f"job {job.id} is {job.state}: only a stopped or failed job can be resumed"


def remaining_cost(job: Job) -> float | None:
    """The estimate's share still to run, at the locked estimate (None when unknown)."""
    if job.estimated_cost is None:
        return None
    if job.max_steps:
        return job.estimated_cost * max(0.0, 1.0 - (job.last_step or 0) / job.max_steps)
    return job.estimated_cost


def new_cap(job: Job, max_cost: float | None, *, margin: float = 0.0) -> float:
    """The job's cap after the resume: the one asked for, else the one it had. EngineError when it would
    stop again at once (the supervisor stops a job whose spend plus ``margin``, one period of its burn,
    reaches the cap), with a figure that would let it finish."""
    spent = job.spend or 0.0
    remaining = remaining_cost(job)
    hint_amount = spent + margin + 2 * remaining if remaining else max(spent * 2, spent + margin + 1.0)
    hint = f"`resume {job.id} max_cost={money(hint_amount)}`"
    if max_cost is not None:
        if max_cost <= spent + margin:
            raise EngineError(
                f"job {job.id} has spent {money(spent)}: a cap of {money(max_cost)} would stop it again at "
                f"once; e.g. {hint}"
            )
        return max_cost
    if job.max_cost is not None and job.max_cost <= spent + margin:
        raise EngineError(
            f"job {job.id} has spent {money(spent)} of its {money(job.max_cost)} cap: resume it with a "
            f"higher cap, e.g. {hint}"
        )
    return job.max_cost if job.max_cost is not None else round(max(hint_amount, 0.01), 2)


def resume(
    ctx: EngineContext,
    policy: Permissions,
    job_id: str,
    *,
    user: str,
    max_cost: float | None = None,
    channel: str | None = None,
    auto_launch: bool = True,
) -> JobView:
    """Continue a stopped or failed job from its newest complete checkpoint (see the module's docstring)."""
    job = jobs.load(ctx, job_id)
    owner_or_admin = policy.can_stop(user, job.owner)
    if not owner_or_admin or user == "engine":
        raise PermissionDenied("only the job's owner or an admin may resume it")
    may_launch = policy.can_launch(user, channel or job.channel)
    if not may_launch:
        raise PermissionDenied(may_launch.reason)
    problem = why_not_resumable(job)
    if problem:
        raise EngineError(problem)
    # As for a new job (bot/engine/launching/admission.py): a spent budget refuses it, the running limit too.
    admission.check_budgets(ctx, owner=job.owner, team=job.team)
    with ctx.session() as s:
        admission.check_running(ctx, s, owner=job.owner)
    explicit = approval.checked_cap(max_cost, ctx.settings.max_cost_limit_usd)
    margin = (job.price_per_hour or 0.0) * ctx.settings.reconcile_every_s / 3600.0
    cap = new_cap(job, explicit, margin=margin)
    # At stake, as for a new job (bot/engine/launching/approval.py): the projected total (spent + the rest of
    # the run at the locked estimate) or an explicit cap if higher. What was accepted for the job still holds.
    remaining = remaining_cost(job) or 0.0
    stake = approval.at_stake((job.spend or 0.0) + remaining, explicit)
    needs_approval = policy.needs_approval(stake) and stake > approval.ceiling(job)
    by_person = job.approved_by not in PERSON_APPROVALS_EXCLUDE
    checkpoint = runs.newest_acknowledged(ctx, job.id)  # acknowledged from the run that wrote it
    now = ctx.now()
    dst = S.PENDING_APPROVAL if needs_approval else S.APPROVED
    with ctx.session() as s:
        ok = S.transition(
            s,
            job_id,
            [S.STOPPED, S.FAILED],
            dst,
            actor=user,
            now=now,
            reason="resume",
            commit=False,
            # a new run of the same job: what decided the last run's end is cleared, its money is not
            max_cost=cap,
            approved_by=None if needs_approval else (job.approved_by if by_person else "auto"),
            approved_cost=(
                job.approved_cost
                if needs_approval or by_person
                else approval.accepted(cap, by_person=False, threshold=policy.approval_above)
            ),
            outcome=None,
            stop_reason=None,
            stop_requested_at=None,
            message=None,
            finished_at=None,
            claim_id=None,
            claimed_at=None,
            retry_count=0,
            eta_seconds=None,
            last_event_at=None,
            started_at=None,
            launch_requested_at=None,
            last_checkpoint_uri=checkpoint.uri if checkpoint else None,
            last_checkpoint_step=checkpoint.step if checkpoint else None,
        )
        if ok:
            S.audit(
                s,
                actor=user,
                action="resume",
                job_id=job_id,
                at=now,
                previous_state=job.state,
                previous_cap=job.max_cost,
                max_cost=cap,
                spent=job.spend,
                needs_approval=needs_approval,
                checkpoint=checkpoint.uri if checkpoint else None,
            )
            s.commit()
    if not ok:  # resumed or changed by someone else meanwhile
        current = jobs.view(ctx, job_id)
        current.message = f"job {job_id} is {current.state} now; nothing done"
        return current
    where = "from the beginning (no checkpoint was saved)"
    if checkpoint is not None:
        of = f" of {job.max_steps}" if job.max_steps else ""
        where = f"from {checkpoint.uri} (step {checkpoint.step}{of})"
    more = f"; about {money(remaining)} more to the end" if remaining else ""
    ctx.publish(
        EngineEventKind.resumed,
        job_id,
        f"Job {job_id} resumed by {user} {where}, cap {money(cap)} (spent so far {money(job.spend)}{more}).",
        checkpoint_uri=checkpoint.uri if checkpoint else None,
        max_cost=cap,
    )
    if needs_approval:
        ctx.publish(
            EngineEventKind.approval_needed,
            job_id,
            f"Job {job_id} resumes and may spend up to {money(stake)} in all, above "
            f"{money(policy.approval_above)} and more than was accepted for it: it needs approval by "
            f"{policy.who_approves(job.owner, job_id)}.",
            estimated_cost=stake,
            at_stake=stake,
        )
    elif auto_launch:
        jobs.launch(ctx, job_id, user=user)
    return jobs.view(ctx, job_id)


SLACK_FILES = "slack-files"  # <data dir>/slack-files/<file id>/<name>: bot/chat/slack/files.py


def slack_upload_source(ctx: EngineContext, value: Any) -> str | None:
    """``slack:<file id>`` when ``value`` is the bot's copy of a Slack upload, else None."""
    from pathlib import Path

    from bot.planner.sources import SLACK_FILE_ID

    if not isinstance(value, str) or not value or "://" in value:
        return None
    try:
        folder = (Path(ctx.settings.data_dir) / SLACK_FILES).resolve()
        path = Path(value).resolve()
    except (OSError, ValueError):
        return None
    if path.parent.parent != folder or not SLACK_FILE_ID.match(path.parent.name):
        return None
    return f"slack:{path.parent.name}"


def clone_request(
    ctx: EngineContext,
    job_id: str,
    changes: dict[str, Any],
    *,
    user: str | None = None,
    policy: Permissions | None = None,
) -> EstimateRequest:
    """The job's request with ``changes`` (EstimateRequest fields, parsed by bot/planner/options.py).

    ``user`` (None: the bot itself) must be the job's owner or an admin. A model or dataset that was a Slack
    upload comes back as ``slack:<file id>``, for the caller to fetch with the cloner's own access."""
    job = jobs.load(ctx, job_id)
    if user is not None:
        decision = (policy or ctx.policy).can_clone(user, job.owner)
        if not decision:
            raise PermissionDenied(decision.reason)
    data = {**(job.request or {})}
    for role in ("model", "dataset"):  # a member's clone fetches an upload again, as its own launch would
        upload = slack_upload_source(ctx, data.get(role)) if user not in (None, OPERATOR) else None
        if upload is not None:
            data[role] = upload
    data.update(changes)
    try:
        return EstimateRequest.model_validate(data)
    except ValidationError as exc:
        from bot.planner import options

        key, msg = options.validation_problems(exc)[0]
        raise EngineError(f"{key}: {msg}") from None
