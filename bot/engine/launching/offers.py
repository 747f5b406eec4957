"""Which offers of an estimate this engine can launch, and the labels among those; the one priced estimate.

An estimate shows every cloud's prices (live where a key is set, else the dated snapshot), so a person
sees what a fine-tune would cost everywhere. Only offers of providers configured in this process can be
launched: the cheapest / fastest / safest labels (the launch buttons) go to those, and a fitting offer
elsewhere says what would make it launchable.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from bot.engine.launching.runner_bundle import with_install
from bot.planner.rank import DEFAULT_RELIABILITY, LABEL_KEYS  # the planner's own label criteria
from bot.planner.result import Estimate, RankedOffer
from bot.providers.registry import key_env

if TYPE_CHECKING:
    from bot.engine.api import PriceList
    from bot.planner.calibration import Calibration
    from bot.planner.request import EstimateRequest
    from bot.providers.base import Provider
    from bot.providers.catalog import LiveCatalog
    from bot.settings import Settings

log = logging.getLogger(__name__)


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


def price_list(settings: Settings, providers: Mapping[str, Provider], *, gpu: str | None = None) -> PriceList:
    """Every cloud's offers from the same source as ``priced_estimate``: live from the clouds configured here
    (within TUNEBOT_CATALOG_DEADLINE), every other cloud from its dated snapshot with a note saying so."""
    from bot.engine.api import PriceList
    from bot.providers.catalog import live_catalog

    clouds = {n: p for n, p in providers.items() if n != "local"}
    catalog = live_catalog(settings, gpu=gpu, providers=clouds)
    return PriceList(
        offers=list(catalog.offers), notes=_price_notes(catalog), source=catalog.source, as_of=catalog.as_of
    )


def _price_notes(catalog: LiveCatalog) -> list[str]:
    """Where each cloud's prices come from ("vast: live prices as of ...", "runpod: no RUNPOD_API_KEY")."""
    when = f" as of {catalog.as_of:%Y-%m-%d %H:%M} UTC" if catalog.as_of else ""
    return [f"{name}: live prices{when}" for name in catalog.live_providers] + catalog.notes


def local_note(settings: Settings, providers: Mapping[str, Provider], request: EstimateRequest) -> str | None:
    """Why this machine's CPU is not among the offers where it would be (no cloud configured, or gpu=cpu)."""
    from bot.providers.registry import local_unavailable

    if "local" in providers:
        return None
    problem = local_unavailable()
    if problem is not None:
        return f"local: this machine's CPU is not offered: the runner cannot start here: {problem}"
    if request.gpu == "cpu":
        return "local: this machine's CPU is not offered here (TUNEBOT_LOCAL_PROVIDER is off in this process)"
    return None


def priced_estimate(
    settings: Settings,
    providers: Mapping[str, Provider],
    request: EstimateRequest,
    *,
    calibration: Calibration | None = None,
    offline: bool = False,
) -> Estimate:
    """The estimate every door shows (Slack, the console, `tunebot estimate`, and `tunebot launch` rents its
    pick): every cloud's offers, live where a key is set and the API answers within TUNEBOT_CATALOG_DEADLINE,
    else the dated snapshot with a note saying so (``offline``: the snapshot for every cloud, none asked);
    labelled among the offers these providers can launch; this machine's CPU only when no cloud is
    configured or gpu=cpu, and only where the runner can start (``local_note`` says why it is absent)."""
    from bot.engine.launching.approval import checked_cap
    from bot.planner.inputs import resolve_inputs
    from bot.planner.plan import estimate
    from bot.providers.base import OfferQuery, ProviderError
    from bot.providers.catalog import live_catalog

    checked_cap(request.max_cost, settings.max_cost_limit_usd)  # refused now, not after a Launch button
    request = with_wandb(request, settings)
    inputs = resolve_inputs(request)  # the model and the dataset, read once; before any cloud is asked
    clouds = {n: p for n, p in providers.items() if n != "local"}
    if offline:
        from bot.providers.snapshot import snapshot_as_of, snapshot_offers

        offers, source, as_of = snapshot_offers(), "snapshot", snapshot_as_of()
        notes = [f"{name}: snapshot prices (--offline)" for name in clouds]
    else:
        catalog = live_catalog(settings, interruptible=request.interruptible, providers=clouds)
        offers, source, as_of = list(catalog.offers), catalog.source, catalog.as_of
        notes = _price_notes(catalog)
    from bot.engine.launching.runner_bundle import install_minutes, install_note

    offers = with_install(offers, install_minutes(settings))  # the runner's install at every cloud start
    if note := install_note(settings):
        notes.append(note)
    local = providers.get("local")
    if local is not None and (not clouds or request.gpu == "cpu"):
        query = OfferQuery(gpu_count=request.gpus, interruptible=request.interruptible)
        try:
            offers.extend(local.search_offers(query))
            source = "live" if source == "live" else "mixed"  # this machine's price is always live
        except ProviderError as exc:
            log.warning("offers from local unavailable: %s", exc)
    elif not clouds or request.gpu == "cpu":
        absent = local_note(settings, providers, request)
        if absent:
            notes.append(absent)
    est = estimate(
        request,
        inputs,
        offers=offers,
        prices_source=source,
        prices_as_of=as_of,
        calibration=calibration,
    )
    return for_this_engine(est, providers, notes, local_max_hours=settings.local_max_hours)


def with_wandb(request: EstimateRequest, settings: Settings) -> EstimateRequest:
    """The request as this bot's runners will log it to W&B (its start is priced: planner/phases.py)."""
    from bot.engine.launching.launch import wandb_mode

    mode = wandb_mode(settings)
    return request if request.wandb == mode else request.model_copy(update={"wandb": mode})


def snapshot_estimate(
    request: EstimateRequest, *, calibration: Calibration | None = None, settings: Settings | None = None
) -> Estimate:
    """`tunebot estimate` with nothing here to launch on: every cloud's dated snapshot, labelled by the
    planner among all fitting offers; the card says "prices: snapshot". With ``settings``, the runner's
    install on a stock image is priced as start-up time, as for the engine's estimates."""
    from bot.engine.launching.runner_bundle import install_minutes, install_note
    from bot.planner.inputs import plan_request
    from bot.providers.snapshot import snapshot_as_of, snapshot_offers

    offers = snapshot_offers()
    note = None
    if settings is not None:
        offers = with_install(offers, install_minutes(settings))
        note = install_note(settings)
        request = with_wandb(request, settings)
    est = plan_request(request, offers=offers, prices_as_of=snapshot_as_of(), calibration=calibration)
    if note:
        est.assumptions.append(f"prices: {note}")
    return est
