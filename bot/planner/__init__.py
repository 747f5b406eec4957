"""The cost planner: what a fine-tune needs (memory, time) and what it costs on each GPU offer.

Public API (others call these): estimate(), EstimateRequest, Estimate, Offer, PlanningError and its
subclasses, young_daly_interval_hours(), and bot.planner.catalog.snapshot_offers().
"""

from __future__ import annotations

from bot.planner.errors import BadRequestError, PlanningError, UnknownModelError
from bot.planner.offer import GPU_NAMES, Offer
from bot.planner.plan import estimate
from bot.planner.preemption import young_daly_interval_hours
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate, RankedOffer

__all__ = [
    "GPU_NAMES",
    "BadRequestError",
    "Estimate",
    "EstimateRequest",
    "Offer",
    "PlanningError",
    "RankedOffer",
    "UnknownModelError",
    "estimate",
    "young_daly_interval_hours",
]
