"""Which offers of an estimate this engine can launch, and the labels among those.

An estimate shows every cloud's prices (live where a key is set, else the dated snapshot), so a person
sees what a fine-tune would cost everywhere. Only offers of providers configured in this process can be
launched: the cheapest / fastest / safest labels (the launch buttons) go to those, and a fitting offer
elsewhere says what would make it launchable.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from bot.planner.rank import DEFAULT_RELIABILITY, LABEL_KEYS  # the planner's own label criteria
from bot.planner.result import Estimate, RankedOffer
from bot.providers.registry import key_env


def _label_key(label: str, o: RankedOffer) -> tuple:
    rel = DEFAULT_RELIABILITY if o.reliability is None else o.reliability
    return LABEL_KEYS[label](o.total_cost, o.hours, o.interruptible, rel)


def launchable(offers: list[RankedOffer], providers: Collection[str]) -> list[RankedOffer]:
    return [o for o in offers if o.fits and o.provider in providers]


def pick(offers: list[RankedOffer], choice: str) -> RankedOffer | None:
    """The offer for "cheapest" | "fastest" | "safest" among these, or None for another choice."""
    if choice not in LABEL_KEYS or not offers:
        return None
    return min(offers, key=lambda o: _label_key(choice, o))


def too_long_here(estimate: Estimate, local_max_hours: float | None) -> Estimate:
    """The local provider (this machine's CPU) is for short jobs: longer ones are not offered there."""
    if local_max_hours is None:
        return estimate
    offers = []
    for o in estimate.offers:
        if o.provider == "local" and o.fits and o.hours > local_max_hours:
            reason = (
                f"would take {o.hours:.1f} h on this machine's CPU; the local provider runs jobs under "
                f"{local_max_hours:g} h (TUNEBOT_LOCAL_MAX_HOURS)"
            )
            o = o.model_copy(update={"fits": False, "reason": reason, "rejected_by": "time", "labels": []})
        offers.append(o)
    return estimate.model_copy(update={"offers": offers})


def for_this_engine(
    estimate: Estimate, providers: Collection[str], notes: list[str], *, local_max_hours: float | None = None
) -> Estimate:
    """Move the labels onto launchable offers and explain the fitting ones that are not."""
    estimate = too_long_here(estimate, local_max_hours)
    ready = launchable(estimate.offers, providers)
    labels: dict[int, list[str]] = {}
    for label in LABEL_KEYS:
        chosen = pick(ready, label)
        if chosen is not None:
            labels.setdefault(id(chosen), []).append(label)
    offers = []
    for o in estimate.offers:
        update: dict[str, Any] = {"labels": labels.get(id(o), [])}
        if o.fits and o.provider not in providers:
            update["reason"] = f"fits; set {key_env(o.provider)} to launch on {o.provider}"
        elif id(o) in labels:
            update["reason"] = "recommended: " + ", ".join(labels[id(o)])
        offers.append(o.model_copy(update=update))
    assumptions = [*estimate.assumptions, *(f"prices: {n}" for n in notes)]
    return estimate.model_copy(update={"offers": offers, "assumptions": assumptions})
