"""One request's quote on the GPU it names, by phase: what bench/gpu_check prints beside each row it measures
(issue 36 item 7), so a GPU run sets the planner's quote against the runner's own figures as the local
provider's bench does on the CPU (bench/quote_vs_run.py).

    from bot.planner.quote import phase_quote
    q = phase_quote(EstimateRequest(model="meta-llama/Llama-3.2-1B", method="qlora", seq_len=4096,
                                    max_steps=23, tokens=100_000, gpu="h100-80gb"))
    q.tokens_per_second, q.tokens_per_second_range, q.step_seconds, q.phases["steps"], q.hours, q.memory_gb

bench/gpu_check/versus_trainer.py calls it through ``quote_by_phase(request, card)`` (a dict of the same
figures). It lives here, not in bot/planner/phases.py: pricing a request resolves its inputs, which price the
phases (an import circle).

The model is resolved as every estimate resolves it (the built-in table, a config file or the Hub:
bot/planner/inputs.py); the GPU is priced on one on-demand offer of it at ``price_per_hour`` (the time does
not depend on the price), started the planner's default way (its boot, the runner's install on a stock
image when ``install_minutes`` says so, the imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.planner.errors import BadRequestError
from bot.planner.gpus import GPUS
from bot.planner.gpus import gpu as lookup_gpu
from bot.planner.offer import Offer
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate


@dataclass(frozen=True)
class PhaseQuote:
    """The quote of one request on its GPU: the steady speed (and its range), one optimizer step, the whole
    run's hours and its seconds by phase (runner/contract/phases.py, plus the offer's start and saves)."""

    gpu: str
    tokens_per_second: float
    tokens_per_second_range: tuple[float, float]
    step_seconds: float
    hours: float
    phases: dict[str, float]
    memory_gb: float  # the memory range's top per GPU: what a card must hold
    estimate: Estimate


def phase_quote(
    request: EstimateRequest, *, price_per_hour: float = 1.0, install_minutes: float = 0.0
) -> PhaseQuote:
    """The planner's quote for ``request`` on ``request.gpu`` x ``request.gpus`` by phase (BadRequestError
    without a GPU the planner knows)."""
    from bot.planner.inputs import plan_request

    if not request.gpu or request.gpu == "cpu":
        raise BadRequestError("phase_quote needs gpu=<a GPU the planner knows>")
    card = lookup_gpu(request.gpu)
    if card.name not in GPUS:
        raise BadRequestError(f"unknown GPU {request.gpu!r}")
    offer = Offer(
        provider="quote",
        offer_id=f"{card.name}x{request.gpus}",
        gpu=card.name,
        gpu_count=request.gpus,
        gpu_memory_gb=card.memory_gb,
        price_per_hour=price_per_hour,
        boot_minutes=None if not install_minutes else 4.0 + install_minutes,
    )
    est = plan_request(request.model_copy(update={"gpu": card.name}), offers=[offer])
    ranked = next((o for o in est.offers if o.provider == "quote"), None)
    low, high = est.speed.tokens_per_second_range or [est.speed.tokens_per_second] * 2
    return PhaseQuote(
        gpu=card.name,
        tokens_per_second=est.speed.tokens_per_second,
        tokens_per_second_range=(low, high),
        step_seconds=est.speed.step_seconds,
        hours=ranked.hours if ranked is not None else est.time.hours,
        phases=dict((ranked.phases if ranked is not None else None) or est.time.phases or {}),
        memory_gb=(est.memory.per_gpu_gb_range or [est.memory.per_gpu_gb] * 2)[1],
        estimate=est,
    )


def quote_by_phase(request: EstimateRequest, card: str) -> dict[str, Any]:
    """bench/gpu_check's quote beside each row it measures (issue 36 item 7): the planner's figures for
    ``request`` on ``card`` (``phase_quote``): steady tokens/s and its range, one step's
    seconds, the memory range's top, the whole run's hours and its seconds by phase."""
    q = phase_quote(request.model_copy(update={"gpu": card}))
    return {
        "tokens_per_second": q.tokens_per_second,
        "tokens_per_second_range": q.tokens_per_second_range,
        "step_seconds": q.step_seconds,
        "memory_gb": q.memory_gb,
        "hours": q.hours,
        "phases": q.phases,
    }
