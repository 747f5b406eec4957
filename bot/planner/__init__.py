"""The cost planner: what a fine-tune needs (memory, time) and what it costs on each GPU offer.

Public API (others call these): estimate() (pure: no I/O), resolve_inputs() (the planner's only I/O, once
per request; bot/planner/inputs.py), plan_request() (both, for callers without an engine), EstimateRequest,
Estimate, Offer, PlanningError and its subclasses, young_daly_interval_hours(), and
bot.providers.snapshot.snapshot_offers().

The names are loaded on first use (PEP 562), so that importing a light module of the package (the
request options for the command line, bot/planner/options.py) does not load the whole planner.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.planner.errors import BadRequestError, PlanningError, UnknownModelError
    from bot.planner.inputs import plan_request, resolve_inputs
    from bot.planner.offer import GPU_NAMES, Offer
    from bot.planner.plan import estimate
    from bot.planner.preemption import young_daly_interval_hours
    from bot.planner.request import EstimateRequest
    from bot.planner.resolved import PlanInputs
    from bot.planner.result import Estimate, RankedOffer

_EXPORTS = {
    "GPU_NAMES": "bot.planner.offer",
    "BadRequestError": "bot.planner.errors",
    "Estimate": "bot.planner.result",
    "EstimateRequest": "bot.planner.request",
    "Offer": "bot.planner.offer",
    "PlanInputs": "bot.planner.resolved",
    "PlanningError": "bot.planner.errors",
    "RankedOffer": "bot.planner.result",
    "UnknownModelError": "bot.planner.errors",
    "estimate": "bot.planner.plan",
    "plan_request": "bot.planner.inputs",
    "resolve_inputs": "bot.planner.inputs",
    "young_daly_interval_hours": "bot.planner.preemption",
}
__all__ = [
    "GPU_NAMES",
    "BadRequestError",
    "Estimate",
    "EstimateRequest",
    "Offer",
    "PlanInputs",
    "PlanningError",
    "RankedOffer",
    "UnknownModelError",
    "estimate",
    "plan_request",
    "resolve_inputs",
    "young_daly_interval_hours",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bot.planner' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
