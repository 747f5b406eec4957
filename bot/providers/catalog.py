"""Live GPU catalog: live offers from each cloud merged over its dated offline snapshot.

A cloud with a key answers live (cached for ``settings.catalog_ttl_s``); a cloud without a key, one
that is down, or one that has not answered by the deadline (``settings.catalog_deadline_s``) falls back
to its snapshot offers and a note says so and how old those prices are, so an answer never silently
mixes today's prices with last month's.

Clouds are asked at once (a thread each), so a slow one delays nobody; within a cloud the queries (one
per GPU count) go one after another through its paced client (the documented rate limit, see
bot/providers/spec.py), and identical requests are sent once (Lambda and TensorDock list every size at
one URL). A cloud that answers after the deadline still fills the cache for the next listing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from bot.planner.offer import Offer
from bot.providers import snapshot as dated
from bot.providers.base import OfferQuery, Provider, ProviderError
from bot.providers.registry import CLOUDS, build_providers, key_env

if TYPE_CHECKING:
    from bot.settings import Settings

log = logging.getLogger(__name__)
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8)  # the offer sizes the snapshot carries; live answers match them


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


def _snapshot() -> tuple[list[Offer], dict[str, date], str | None]:
    """The snapshot offers and each cloud's snapshot date (bot/providers/snapshot.py builds the offers)."""
    try:
        offers = list(dated.snapshot_offers())
        dates = dated.snapshot_dates()
    except Exception as exc:  # a broken snapshot must not break live answers
        return [], {}, f"the offline snapshot could not be read ({type(exc).__name__})"
    return offers, {name: d for name, d in ((n, _as_date(v)) for n, v in dates.items()) if d}, None


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
        clouds = list(CLOUDS)
        return chosen, clouds + [n for n in chosen if n not in clouds]
    names = list(CLOUDS) if providers is None else [n for n in providers if n != "local"]
    built = build_providers(settings, include_local=False)
    return {n: p for n, p in built.items() if n in names}, names


def live_catalog(
    settings: Settings | None = None,
    *,
    gpu: str | None = None,
    interruptible: bool | None = None,
    providers: Mapping[str, Provider] | Iterable[str] | None = None,
    now: datetime | None = None,
    deadline_s: float | None = None,
) -> LiveCatalog:
    """Offers for every cloud: live where a key is set and the API answers in time, else the dated snapshot.

    ``providers`` is either a mapping of ready clients (tests point them at fake servers) or a list
    of cloud names to restrict to; by default every cloud, with clients built from settings.
    ``deadline_s`` (default ``settings.catalog_deadline_s``) bounds the wait for all clouds together.
    """
    if settings is None:
        from bot.settings import get_settings

        settings = get_settings()
    now = now or datetime.now(UTC)
    clients, names = _resolve_providers(settings, providers)
    snap_offers, snap_dates, snap_problem = _snapshot()
    queries = [
        OfferQuery(
            gpu=gpu, gpu_count=n, interruptible=interruptible, min_reliability=settings.min_reliability
        )
        for n in GPU_COUNTS
    ]
    deadline = settings.catalog_deadline_s if deadline_s is None else deadline_s
    answers = _ask_all(clients, queries, settings.catalog_ttl_s, deadline)

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
        if name not in clients:
            reason = f"no {key_env(name)}"
        elif answer is None:
            reason = f"no live answer within {deadline:g} s"
        else:
            reason = f"live prices unavailable ({type(answer).__name__}: {answer})"
        mine = [o for o in snap_offers if o.provider == name and _matches(o, gpu, interruptible)]
        offers.extend(mine)
        from_snapshot.append(name)
        phrase = _snapshot_phrase(snap_dates.get(name), now.date())
        notes.append(f"{name}: {reason} — {phrase}" + ("" if mine else " (no snapshot offers match)"))
    if snap_problem and from_snapshot:
        notes.append(snap_problem)

    if live and from_snapshot:
        source = "mixed"
    elif live:
        source = "live"
    else:
        source = "snapshot"
    oldest = min((snap_dates[n] for n in from_snapshot if n in snap_dates), default=None)
    as_of = now if live else (datetime(oldest.year, oldest.month, oldest.day, tzinfo=UTC) if oldest else None)
    offers.sort(key=lambda o: (o.price_per_hour, o.provider, o.offer_id))
    return LiveCatalog(
        offers=offers,
        notes=notes,
        source=source,
        as_of=as_of,
        live_providers=live,
        snapshot_providers=from_snapshot,
    )


class _Listing:
    """One cloud's listing in flight: a later listing with the same queries waits on it, not asking again."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: list[Offer] | ProviderError | None = None


_in_flight: dict[tuple, _Listing] = {}
_in_flight_lock = threading.Lock()


def _ask_all(
    clients: Mapping[str, Provider], queries: list[OfferQuery], ttl_s: float, deadline_s: float
) -> dict[str, list[Offer] | ProviderError]:
    """Every client's offers for the queries, a thread per cloud; whoever has not answered by the
    deadline is left out. Its thread (a daemon) finishes on its own and fills the cache; until then a
    new listing waits on that thread rather than asking the slow cloud again."""
    shape = tuple((q.gpu, q.gpu_count, q.interruptible, q.min_reliability) for q in queries)
    listings: dict[str, _Listing] = {}
    for name, client in clients.items():
        key = (id(client), shape)
        with _in_flight_lock:
            listing = _in_flight.get(key)
            fresh = listing is None
            if listing is None:
                listing = _in_flight[key] = _Listing()
        listings[name] = listing
        if fresh:
            thread = threading.Thread(
                target=_run_listing,
                args=(key, listing, name, client, queries, ttl_s),
                name=f"catalog-{name}",
                daemon=True,
            )
            thread.start()
    end = time.monotonic() + max(0.0, deadline_s)
    for listing in listings.values():
        listing.done.wait(max(0.0, end - time.monotonic()))
    return {
        name: listing.answer
        for name, listing in listings.items()
        if listing.done.is_set() and listing.answer is not None
    }


def _run_listing(
    key: tuple, listing: _Listing, name: str, client: Provider, queries: list[OfferQuery], ttl_s: float
) -> None:
    try:
        listing.answer = _search_all(client, queries, ttl_s)
    except ProviderError as exc:
        listing.answer = exc
    except Exception as exc:  # a client bug: this cloud answers from its snapshot, the others go on
        log.exception("live offers from %s failed", name)
        listing.answer = ProviderError(f"{name}: {type(exc).__name__}", provider=name)
    finally:
        with _in_flight_lock:
            if _in_flight.get(key) is listing:
                del _in_flight[key]
        listing.done.set()


def _search_all(client: Provider, queries: list[OfferQuery], ttl_s: float) -> list[Offer]:
    """One cloud's answer to every query, in order; identical requests among them are sent once."""
    http = getattr(client, "http", None)
    once = http.reads_once() if hasattr(http, "reads_once") else contextlib.nullcontext()
    with once:
        return [o for q in queries for o in _cached_search(client, q, ttl_s)]


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
