"""What a job may spend before a person has to say yes: at creation, at approval, and before a launch
rents another offer than the one approved.

- At creation the amount at stake is the higher of the estimate and an explicit ``max_cost``: a $1 job
  asking for ``max_cost=$500`` may spend $500, so it is approved like one (the policy's threshold,
  TUNEBOT_APPROVAL_ABOVE). A ``max_cost`` must be a finite positive amount no higher than
  TUNEBOT_MAX_COST_LIMIT.
- What was accepted is recorded (``jobs.approved_cost``): a person's approval accepts the job's cap; an
  automatic one (under the threshold) accepts the lower of the cap and the threshold.
- A launch that cannot rent the approved offer (no capacity at the first launch, a relaunch after a
  preemption) only falls back to another offer whose projected total (spent so far + what is left of the
  run at that offer's price) stays within what was accepted. A pricier one is not rented: the job waits in
  ``pending_approval`` with that offer as the proposal, and the thread says why (``ask_again``).
- A relaunch whose projection leans on progress a host reported (a preemption, out of memory, a resume
  after "step 99 of 100": the rest of the run looks cheap at any price, and a host controls that claim) also
  stays within the accepted hourly price (``jobs.approved_price_per_hour``, with the tolerance a launch
  allows a live price, TUNEBOT_PRICE_TOLERANCE: ``hourly_ceiling``), else it is asked for like a new launch.
  A launch with no reported progress keeps the projection alone (no host's claim is in it), and what it
  rents becomes the accepted hourly price. Growth (bot/engine/watching/grow.py) always checks the hourly
  price: the out-of-memory report is itself a claim.

The pure parts are plain functions of numbers; ``ask_again`` is the one transition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.engine.events import EngineEventKind
from bot.engine.record import states as S
from bot.money import money

if TYPE_CHECKING:
    from bot.engine.context import EngineContext
    from store.models import Job


def checked_cap(value: float | None, limit: float) -> float | None:
    """An explicit max_cost, refused unless finite, positive and within the operator's limit."""
    from bot.engine.api import EngineError

    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise EngineError(f"max_cost must be a positive dollar amount, not {value!r}")
    if value > limit:
        raise EngineError(
            f"max_cost {money(value)} is above this bot's limit of {money(limit)} per job "
            "(TUNEBOT_MAX_COST_LIMIT); ask for less"
        )
    return float(value)


def at_stake(estimate: float, explicit_cap: float | None) -> float:
    """What a job may cost as far as approval is concerned: its estimate, or its explicit cap if higher."""
    return max(float(estimate), float(explicit_cap or 0.0))


def accepted(cap: float | None, *, by_person: bool, threshold: float) -> float | None:
    """What an approval accepts: a person's, the job's cap; an automatic one, no more than the threshold."""
    if cap is None:
        return None if by_person else threshold
    return float(cap) if by_person else min(float(cap), threshold)


def done_fraction(job: Job) -> float:
    """How much of the run is done (steps), 0 when unknown: the rest is what a relaunch still pays for."""
    if job.max_steps and job.last_step:
        return min(max(job.last_step / job.max_steps, 0.0), 1.0)
    return 0.0


def projected_cost(*, spent: float, done: float, total_cost: float, price_ratio: float = 1.0) -> float:
    """The job's total if the rest of the run goes to an offer whose whole run costs ``total_cost``
    (at the estimate's price; ``price_ratio`` = live price / that price)."""
    return spent + max(0.0, 1.0 - done) * total_cost * price_ratio


def ceiling(job: Job) -> float:
    """What was accepted for the job: the approved cost, else its cap."""
    if job.approved_cost is not None:
        return float(job.approved_cost)
    return float(job.max_cost) if job.max_cost else math.inf


def launch_limit(job: Job) -> float:
    """What a launch on another offer may commit the job to without asking: what was accepted, and never
    beyond its cap (max_cost)."""
    cap = float(job.max_cost) if job.max_cost else math.inf
    return min(ceiling(job), cap)


def approved_price(job: Job) -> float | None:
    """The hourly price accepted for the job: recorded at approval, else its accepted offer's."""
    if job.approved_price_per_hour is not None:
        return float(job.approved_price_per_hour)
    price = (job.offer or {}).get("price_per_hour", job.price_per_hour)
    return float(price) if price is not None else None


def hourly_ceiling(job: Job, tolerance: float) -> float:
    """The most per hour a relaunch rents without asking: the accepted hourly price plus the tolerance a
    launch allows a live price (TUNEBOT_PRICE_TOLERANCE); unbounded when no price was ever accepted."""
    price = approved_price(job)
    return price * (1.0 + tolerance) if price else math.inf


@dataclass(frozen=True)
class Proposal:
    """An offer a launch would have fallen back to, held for approval because it costs more."""

    ranked: dict[str, Any]
    projected: float
    live_price: float
    hourly_limit: float | None = None  # set when it was held for its hourly price (a relaunch)


def ask_again(ctx: EngineContext, job: Job, proposal: Proposal, *, why: str, actor: str) -> bool:
    """launching -> pending_approval with the pricier offer as the proposal; the thread is told why."""
    now = ctx.now()
    ranked = proposal.ranked
    where = f"{ranked['provider']} {ranked['gpu']} x{ranked.get('gpu_count') or 1}"
    offer = {**ranked, "price_per_hour": proposal.live_price}
    limit = launch_limit(job)
    if proposal.hourly_limit is not None and proposal.projected <= limit + 1e-9:
        above = (
            f"costs more per hour than the {money(approved_price(job))}/h accepted for this job (up to "
            f"{money(proposal.hourly_limit)}/h without asking)"
        )
    else:
        above = f"projects {money(proposal.projected)} for the job, above the {money(limit)} accepted" + (
            f" (cap {money(job.max_cost)})" if job.max_cost else ""
        )
    reason = (
        f"{why}; the next offer, {where} at {money(proposal.live_price)}/h, {above}"
        + ": it is not rented unless someone approves it"
    )
    with ctx.session() as s:
        ok = S.transition(
            s,
            job.id,
            S.LAUNCHING,
            S.PENDING_APPROVAL,
            actor=actor,
            now=now,
            reason="pricier fallback",
            claim_id=None,
            offer=offer,
            provider=ranked["provider"],
            gpu=ranked["gpu"],
            gpu_count=ranked.get("gpu_count"),
            interruptible=bool(ranked.get("interruptible")),
            price_per_hour=proposal.live_price,
            estimated_cost=round(proposal.projected, 6),
            approved_by=None,
            message=reason[:1000],
        )
    if ok:
        ctx.publish(
            EngineEventKind.approval_needed,
            job.id,
            f"Job {job.id} needs approval again: {reason}.",
            estimated_cost=round(proposal.projected, 6),
            reason=reason,
            offer=f"{where} at {money(proposal.live_price)}/h",
        )
    return ok
