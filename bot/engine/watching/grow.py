"""A job out of GPU memory moves to a GPU with more of it: relaunched within what was accepted, else it asks.

The runner backs off by itself first (runner/oom.py: smaller micro-batches with more accumulation, then
activation checkpointing); it only gives up - the out_of_memory event, exit code EXIT_OUT_OF_MEMORY - when one
row per micro-step with checkpointing still does not fit. Then (supervise.decide -> Do.grow -> ``grow``):

- ``choose`` (pure) picks the cheapest of the estimate's fitting offers with more memory per GPU than the card
  that failed (the same GPU count: the plan's sharding stays as priced);
- within what was accepted (bot/engine/launching/approval.py): the job's projected total there (spent so far +
  the rest of the run at that offer) within the approved cost and its max_cost, AND the offer's hourly price
  within the accepted hourly price (+ TUNEBOT_PRICE_TOLERANCE: ``approval.hourly_ceiling``). The out-of-memory
  report and the progress behind "the rest of the run" are the host's claims (a host that says "out of memory
  at step 99 of 100" makes any GPU's rest look cheap), so the hourly price is what bounds a claim: the job
  goes running -> recovering with that offer first (and only bigger ones within the same price behind it) and
  relaunches; it resumes from its newest checkpoint;
- above either: growth is a new approval. running -> pending_approval with that offer as the proposal at
  the new projected total (as approval.ask_again does for a pricier fallback); the thread names the offer,
  its hourly price and what it costs, and an approval (which accepts that hourly price) relaunches it;
- nothing bigger among the offers: the job fails with the runner's words and what would fit instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.engine.events import EngineEventKind
from bot.engine.launching import approval
from bot.engine.outcome.finish import finish, open_instances, terminate_instance
from bot.engine.record import states as S
from bot.engine.record.spend import job_spend
from bot.engine.watching.recovery import relaunch
from bot.money import money
from store.models import Job

if TYPE_CHECKING:
    from bot.engine.context import EngineContext


def memory_per_gpu(offer: dict[str, Any]) -> float:
    """The card's memory as the fit was judged (GB), or what the offer says."""
    return float(offer.get("memory_capacity_gb") or offer.get("gpu_memory_gb") or 0.0)


@dataclass(frozen=True)
class Choice:
    offer: dict[str, Any] | None  # the cheapest bigger offer, or None when there is none
    bigger: list[dict[str, Any]]  # every bigger offer, cheapest first (the relaunch's fallbacks)
    cost: float  # the job's projected total there (bot/engine/launching/approval.projected_cost)
    limit: float  # what was accepted (bot/engine/launching/approval.ceiling): inf when nothing limits it
    within_cap: bool
    price_limit: float = math.inf  # the accepted hourly price with its tolerance (approval.hourly_ceiling)
    within_price: bool = True


def choose(
    failed: dict[str, Any],
    offers: list[dict[str, Any]],
    *,
    spent: float,
    done: float,
    limit: float,
    price_limit: float = math.inf,
) -> Choice:
    """The cheapest offer with more memory per GPU than `failed`, with the same GPU count, and whether the
    job's projected total there (spent so far + the rest of the run at that offer) stays within what was
    accepted (``within_cap``) and its hourly price within the accepted one (``within_price``)."""
    floor = memory_per_gpu(failed)
    count = int(failed.get("gpu_count") or 1)
    bigger = sorted(
        (
            o
            for o in offers
            if memory_per_gpu(o) > floor and int(o.get("gpu_count") or 1) == count and o.get("fits", True)
        ),
        key=lambda o: float(o.get("total_cost") or 0.0),
    )
    if not bigger:
        return Choice(None, [], spent, limit, False, price_limit, False)
    best = bigger[0]
    cost = approval.projected_cost(spent=spent, done=done, total_cost=float(best.get("total_cost") or 0.0))
    within_price = _price(best) <= price_limit + 1e-9
    return Choice(best, bigger, cost, limit, cost <= limit + 1e-9, price_limit, within_price)


def _price(offer: dict[str, Any]) -> float:
    return float(offer.get("price_per_hour") or 0.0)


def _where(offer: dict[str, Any]) -> str:
    kind = "spot" if offer.get("interruptible") else "on-demand"
    return (
        f"{offer.get('provider')} {offer.get('gpu')} x{offer.get('gpu_count') or 1} ({kind}, "
        f"{memory_per_gpu(offer):.0f} GB per GPU)"
    )


def grow(eng: EngineContext, job_id: str, *, said: str | None = None) -> bool:
    """Carry out Do.grow for a running job whose runner ran out of memory; True when something was done."""
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return False
        spent = job_spend(s, job_id, now)
        choice = choose(
            dict(job.offer or {}),
            list(job.offers or []),
            spent=spent,
            done=approval.done_fraction(job),
            limit=approval.launch_limit(job),
            price_limit=approval.hourly_ceiling(job, eng.settings.price_tolerance),
        )
        accepted_price = approval.approved_price(job)
        failed = _where(dict(job.offer or {}))
        why = said or job.message or "out of GPU memory at micro-batch 1 with activation checkpointing"
    happened = f"Job {job_id} ran out of GPU memory on {failed} even after backing off ({why})."
    if choice.offer is None:
        finish(
            eng,
            job_id,
            S.FAILED,
            reason="out of memory",
            message=f"{happened} No offer of this estimate has more memory per GPU: try method=qlora, "
            "more GPUs, or a shorter seq.",
        )
        return True
    cost_note = (
        f"expected total {money(choice.cost)} (spent {money(spent)} so far + "
        f"{money(float(choice.offer.get('total_cost') or 0.0))} there)"
    )
    cap_note = (
        f"{money(choice.limit)} accepted" + (f" (cap {money(job.max_cost)})" if job.max_cost else "")
        if math.isfinite(choice.limit)
        else "no cap"
    )
    price = _price(choice.offer)
    price_note = (
        f"{money(price)}/h, more than the {money(accepted_price)}/h accepted for this job"
        if accepted_price is not None
        else f"{money(price)}/h"
    )
    # The bigger offer becomes the job's offer (what a launch rents without asking again,
    # engine/launching/launch.py): here it was checked against what was accepted, as approval.py checks any
    # other offer; the fallbacks behind it are only those within the same hourly price.
    within = [o for o in choice.bigger if _price(o) <= choice.price_limit + 1e-9]
    fields = {"offer": choice.offer, "offers": within or choice.bigger, "outcome": None, "message": None}
    if choice.within_cap and choice.within_price:
        with eng.session() as s:
            moved = S.transition(
                s, job_id, S.RUNNING, S.RECOVERING, actor="engine", now=now, reason="out of memory", **fields
            )
        if not moved:
            return False
        _close(eng, job_id)
        eng.publish(
            EngineEventKind.out_of_memory,
            job_id,
            f"{happened} Relaunching on {_where(choice.offer)} from the last checkpoint: "
            f"{cost_note}, within the {cap_note}.",
            reason="out of memory",
            estimated_cost=choice.cost,
        )
        relaunch(eng, job_id, actor="engine")
        return True
    with eng.session() as s:
        asked = S.transition(
            s,
            job_id,
            S.RUNNING,
            S.PENDING_APPROVAL,
            actor="engine",
            now=now,
            reason="out of memory",
            approved_by=None,
            estimated_cost=round(choice.cost, 6),
            provider=choice.offer["provider"],
            gpu=choice.offer["gpu"],
            gpu_count=choice.offer.get("gpu_count"),
            interruptible=bool(choice.offer.get("interruptible")),
            price_per_hour=float(choice.offer.get("price_per_hour") or 0.0),
            **fields,
        )
    if not asked:
        return False
    _close(eng, job_id)
    above = (
        f"above the {cap_note}"
        if not choice.within_cap
        else f"within the {cap_note}, but at {price_note}: growing is a new approval"
    )
    eng.publish(
        EngineEventKind.out_of_memory,
        job_id,
        f"{happened} The cheapest GPU with more memory is {_where(choice.offer)} at {money(price)}/h: "
        f"{cost_note}, {above}. Approve to relaunch there from the last checkpoint, or cancel.",
        reason="out of memory",
        estimated_cost=choice.cost,
    )
    reason = (
        f"it ran out of GPU memory on {failed} and needs a bigger GPU: {_where(choice.offer)} at "
        f"{money(price)}/h, {money(choice.cost)} expected in all, {above}"
    )
    eng.publish(
        EngineEventKind.approval_needed,
        job_id,
        f"Job {job_id} needs a bigger GPU: {_where(choice.offer)} at {money(price)}/h, "
        f"{money(choice.cost)} expected in all, {above}.",
        estimated_cost=choice.cost,
        reason=reason,
        offer=f"{_where(choice.offer)} at {money(price)}/h",
    )
    return True


def _close(eng: EngineContext, job_id: str) -> None:
    """The instance that ran out of memory is done: end it (confirmed gone) before anything is relaunched."""
    for open_row in open_instances(eng, job_id):
        terminate_instance(eng, open_row, reason="out of memory", actor="engine")
