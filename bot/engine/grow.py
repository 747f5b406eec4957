"""A job out of GPU memory moves to a GPU with more of it: relaunched within its cost cap, else it asks.

The runner backs off by itself first (runner/oom.py: smaller micro-batches with more accumulation, then
activation checkpointing); it only gives up - the out_of_memory event, exit code EXIT_OUT_OF_MEMORY - when one
row per micro-step with checkpointing still does not fit. Then (supervise.decide -> Do.grow -> ``grow``):

- ``choose`` (pure) picks the cheapest of the estimate's fitting offers with more memory per GPU than the card
  that failed (the same GPU count: the plan's sharding stays as priced);
- within the cap (the job's max_cost, else the estimate that was approved), counting what the job has
  spent: the job goes running -> recovering with that offer first (and only bigger ones behind it) and
  relaunches; it resumes from its newest checkpoint;
- above the cap: running -> pending_approval at the new expected total; the thread says what happened and what
  it costs, and an approval relaunches it;
- nothing bigger among the offers: the job fails with the runner's words and what would fit instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.engine import states as S
from bot.engine.events import EngineEventKind
from bot.engine.finish import finish, open_instances, terminate_instance
from bot.engine.recovery import relaunch
from bot.engine.spend import job_spend
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
    cost: float  # what the job would have cost in all: spent so far + the offer's expected total
    cap: float | None  # the cap it is checked against
    within_cap: bool


def choose(failed: dict[str, Any], offers: list[dict[str, Any]], *, spent: float, max_cost: float | None,
           approved_estimate: float | None) -> Choice:
    """The cheapest offer with more memory per GPU than `failed`, with the same GPU count, and whether the job
    would stay within its cap there (max_cost, else the estimate someone approved)."""
    floor = memory_per_gpu(failed)
    count = int(failed.get("gpu_count") or 1)
    bigger = sorted(
        (o for o in offers
         if memory_per_gpu(o) > floor and int(o.get("gpu_count") or 1) == count and o.get("fits", True)),
        key=lambda o: float(o.get("total_cost") or 0.0),
    )
    cap = max_cost if max_cost is not None else approved_estimate
    if not bigger:
        return Choice(None, [], spent, cap, False)
    best = bigger[0]
    cost = spent + float(best.get("total_cost") or 0.0)
    return Choice(best, bigger, cost, cap, cap is not None and cost <= cap + 1e-9)


def _where(offer: dict[str, Any]) -> str:
    kind = "spot" if offer.get("interruptible") else "on-demand"
    return (f"{offer.get('provider')} {offer.get('gpu')} x{offer.get('gpu_count') or 1} ({kind}, "
            f"{memory_per_gpu(offer):.0f} GB per GPU)")


def grow(eng: EngineContext, job_id: str, *, said: str | None = None) -> bool:
    """Carry out Do.grow for a running job whose runner ran out of memory; True when something was done."""
    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING:
            return False
        spent = job_spend(s, job_id, now)
        choice = choose(dict(job.offer or {}), list(job.offers or []), spent=spent, max_cost=job.max_cost,
                        approved_estimate=job.estimated_cost)
        failed = _where(dict(job.offer or {}))
        why = said or job.message or "out of GPU memory at micro-batch 1 with activation checkpointing"
    happened = f"Job {job_id} ran out of GPU memory on {failed} even after backing off ({why})."
    if choice.offer is None:
        finish(eng, job_id, S.FAILED, reason="out of memory",
               message=f"{happened} No offer of this estimate has more memory per GPU: try method=qlora, "
                       "more GPUs, or a shorter seq.")
        return True
    cost_note = (f"expected total {money(choice.cost)} (spent {money(spent)} so far + "
                 f"{money(float(choice.offer.get('total_cost') or 0.0))} there)")
    cap_note = f"cap {money(choice.cap)}" if choice.cap is not None else "no cap set"
    fields = {"offer": choice.offer, "offers": choice.bigger, "outcome": None, "message": None}
    if choice.within_cap:
        with eng.session() as s:
            moved = S.transition(s, job_id, S.RUNNING, S.RECOVERING, actor="engine", now=now,
                                 reason="out of memory", **fields)
        if not moved:
            return False
        _close(eng, job_id)
        eng.publish(EngineEventKind.out_of_memory, job_id,
                    f"{happened} Relaunching on {_where(choice.offer)} from the last checkpoint: "
                    f"{cost_note}, within the {cap_note}.", reason="out of memory",
                    estimated_cost=choice.cost)
        relaunch(eng, job_id, actor="engine")
        return True
    with eng.session() as s:
        asked = S.transition(s, job_id, S.RUNNING, S.PENDING_APPROVAL, actor="engine", now=now,
                             reason="out of memory", approved_by=None, estimated_cost=round(choice.cost, 4),
                             **fields)
    if not asked:
        return False
    _close(eng, job_id)
    eng.publish(EngineEventKind.out_of_memory, job_id,
                f"{happened} The cheapest GPU with more memory is {_where(choice.offer)}: {cost_note}, above "
                f"the {cap_note}. Approve to relaunch there from the last checkpoint, or cancel.",
                reason="out of memory", estimated_cost=choice.cost)
    eng.publish(EngineEventKind.approval_needed, job_id,
                f"Job {job_id} needs a bigger GPU: {money(choice.cost)} expected in all, above the "
                f"{cap_note}.",
                estimated_cost=choice.cost)
    return True


def _close(eng: EngineContext, job_id: str) -> None:
    """The instance that ran out of memory is done: end it (confirmed gone) before anything is relaunched."""
    for open_row in open_instances(eng, job_id):
        terminate_instance(eng, open_row, reason="out of memory", actor="engine")
