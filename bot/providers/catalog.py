"""Live GPU catalog: live offers from each cloud merged over the planner's dated offline snapshot.

A cloud with a key answers live (cached for ``settings.catalog_ttl_s``); a cloud without a key, or one
that is down, falls back to its snapshot offers and a note says so and how old those prices are, so an
answer never silently mixes today's prices with last month's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from bot.planner.offer import Offer
from bot.providers.base import OfferQuery, Provider, ProviderError

if TYPE_CHECKING:
    from bot.settings import Settings

CLOUDS: tuple[str, ...] = ("vast", "runpod", "lambda", "tensordock")
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8)  # the offer sizes the snapshot carries; live answers match them
KEY_ENV = {
    "vast": "VAST_API_KEY",
    "runpod": "RUNPOD_API_KEY",
    "lambda": "LAMBDA_API_KEY",
    "tensordock": "TENSORDOCK_API_KEY",
}


@dataclass
class LiveCatalog:
    offers: list[Offer]
    notes: list[str] = field(default_factory=list)
    source: str = "snapshot"  # "live" | "snapshot" | "mixed"
    as_of: datetime | None = None
    live_providers: list[str] = field(default_factory=list)
    snapshot_providers: list[str] = field(default_factory=list)


_cache: dict[tuple, tuple[float, list[Offer]]] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    """Forget cached live offers (tests; a manual refresh)."""
    with _cache_lock:
        _cache.clear()


def _snapshot() -> tuple[list[Offer], date | None, str | None]:
    """The planner's snapshot offers and date; imported lazily (the planner owns that module)."""
    try:
        from bot.planner import catalog as planner_catalog
    except ImportError:
        return [], None, "the offline snapshot is not available in this build"
    try:
        offers = list(planner_catalog.snapshot_offers())
        raw_date = planner_catalog.snapshot_date()
    except Exception as exc:  # a broken snapshot must not break live answers
        return [], None, f"the offline snapshot could not be read ({type(exc).__name__})"
    return offers, _as_date(raw_date), None


def _as_date(value: object) -> date | None:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value[:10])
        except ValueError:
            return None
    return None


def _snapshot_phrase(snap_date: date | None, today: date) -> str:
    if snap_date is None:
        return "prices from the offline snapshot"
    days = (today - snap_date).days
    age = "today" if days <= 0 else ("1 day old" if days == 1 else f"{days} days old")
    return f"prices from the {snap_date.isoformat()} snapshot ({age})"


def _matches(offer: Offer, gpu: str | None, interruptible: bool | None) -> bool:
    if gpu is not None and offer.gpu != gpu:
        return False
    return interruptible is None or offer.interruptible == interruptible


def _resolve_providers(
    settings: Settings, providers: Mapping[str, Provider] | Iterable[str] | None
) -> tuple[dict[str, Provider], list[str]]:
    """The live clients to ask, and the cloud names this answer covers."""
    if isinstance(providers, Mapping):
        # Ready clients; every cloud missing from the mapping is answered from the snapshot.
        chosen = {name: p for name, p in providers.items() if name != "local"}
        return chosen, list(CLOUDS) + [n for n in chosen if n not in CLOUDS]
    names = list(CLOUDS) if providers is None else [n for n in providers if n != "local"]
    from bot.providers.registry import build_providers

    built = build_providers(settings, include_local=False)
    return {n: p for n, p in built.items() if n in names}, names


def live_catalog(
    settings: Settings | None = None,
    *,
    gpu: str | None = None,
    interruptible: bool | None = None,
    providers: Mapping[str, Provider] | Iterable[str] | None = None,
    now: datetime | None = None,
) -> LiveCatalog:
    """Offers for every cloud: live where a key is set and the API answers, else the dated snapshot.

    ``providers`` is either a mapping of ready clients (tests point them at fake servers) or a list
    of cloud names to restrict to; by default every cloud, with clients built from settings.
    """
    if settings is None:
        from bot.settings import get_settings

        settings = get_settings()
    now = now or datetime.now(UTC)
    clients, names = _resolve_providers(settings, providers)
    snap_offers, snap_date, snap_problem = _snapshot()
    phrase = _snapshot_phrase(snap_date, now.date())
    queries = [
        OfferQuery(
            gpu=gpu, gpu_count=n, interruptible=interruptible, min_reliability=settings.min_reliability
        )
        for n in GPU_COUNTS
    ]

    def ask(client: Provider) -> list[Offer] | ProviderError:
        try:
            return [o for q in queries for o in _cached_search(client, q, settings.catalog_ttl_s)]
        except ProviderError as exc:
            return exc

    # One thread per cloud: a slow API delays only its own answer, not the others'.
    with ThreadPoolExecutor(max_workers=max(1, len(clients)), thread_name_prefix="catalog") as pool:
        answers = dict(zip(clients, pool.map(ask, clients.values()), strict=True))

    offers: list[Offer] = []
    notes: list[str] = []
    live: list[str] = []
    from_snapshot: list[str] = []
    for name in names:
        answer = answers.get(name)
        if isinstance(answer, list):
            offers.extend(answer)
            live.append(name)
            continue
        if answer is None:
            reason = f"no {KEY_ENV.get(name, name.upper() + '_API_KEY')}"
        else:
            reason = f"live prices unavailable ({type(answer).__name__}: {answer})"
        mine = [o for o in snap_offers if o.provider == name and _matches(o, gpu, interruptible)]
        offers.extend(mine)
        from_snapshot.append(name)
        notes.append(f"{name}: {reason} — {phrase}" + ("" if mine else " (no snapshot offers match)"))
    if snap_problem and from_snapshot:
        notes.append(snap_problem)

    if live and from_snapshot:
        source = "mixed"
    elif live:
        source = "live"
    else:
        source = "snapshot"
    as_of = (
        now
        if live
        else (datetime(snap_date.year, snap_date.month, snap_date.day, tzinfo=UTC) if snap_date else None)
    )
    offers.sort(key=lambda o: (o.price_per_hour, o.provider, o.offer_id))
    return LiveCatalog(
        offers=offers,
        notes=notes,
        source=source,
        as_of=as_of,
        live_providers=live,
        snapshot_providers=from_snapshot,
    )


def _cached_search(client: Provider, query: OfferQuery, ttl_s: float) -> list[Offer]:
    key = (
        client.name,
        getattr(client, "base_url", None),
        query.gpu,
        query.gpu_count,
        query.interruptible,
        query.min_reliability,
        id(client) if not getattr(client, "base_url", None) else 0,
    )
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
        if hit and now - hit[0] < ttl_s:
            return hit[1]
    result = client.search_offers(query)
    with _cache_lock:
        _cache[key] = (time.monotonic(), result)
    return result
