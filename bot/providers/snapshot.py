"""The dated offline price snapshot: what offers cost when no cloud is asked.

Each cloud module declares its own dated snapshot (``CLOUD.snapshot`` in bot/providers/<cloud>.py,
bot/providers/spec.py); this module turns those of ``CLOUDS`` (bot/providers/registry.py) into Offers. The
live catalog (bot/providers/catalog.py) falls back to it per cloud; `tunebot estimate --offline` prices
from it alone.
An offer of N GPUs costs N x the per-GPU price; storage is $/GB-month, egress $/GB, USD throughout.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime
from typing import Any

from bot.planner.gpus import GPUS
from bot.planner.offer import Offer
from bot.providers.registry import CLOUDS
from bot.providers.spec import Snapshot

_built: dict[tuple[tuple[str, int], ...], tuple[Offer, ...]] = {}
_lock = threading.Lock()


def snapshots() -> dict[str, Snapshot]:
    """Every cloud's snapshot by provider name, in ``CLOUDS`` order."""
    return {name: spec.snapshot for name, spec in CLOUDS.items()}


def snapshot_dates() -> dict[str, date]:
    return {name: date.fromisoformat(s.date) for name, s in snapshots().items()}


def snapshot_date() -> date:
    """The oldest cloud snapshot's date: no snapshot price is older than this."""
    return min(snapshot_dates().values())


def snapshot_as_of() -> datetime:
    d = snapshot_date()
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def provider_terms(provider: str) -> dict[str, Any]:
    """Storage, egress, reliability and preemption figures of a provider in the snapshot."""
    snap = snapshots().get(provider)
    if snap is None:
        return {}
    return {
        "storage_per_gb_month": snap.storage_per_gb_month,
        "egress_per_gb": snap.egress_per_gb,
        "reliability": snap.reliability,
        "inet_down_mbps": snap.inet_down_mbps,
        "preemptions_per_hour": snap.preemptions_per_hour,
        "location": snap.location,
        "note": snap.note,
    }


def _offers_of(provider: str, snap: Snapshot) -> list[Offer]:
    d = date.fromisoformat(snap.date)
    as_of = datetime(d.year, d.month, d.day, tzinfo=UTC)
    out: list[Offer] = []
    for gpu_name, spec in snap.gpus.items():
        od, spot = spec[0], spec[1]
        counts = spec[2] if len(spec) > 2 else snap.counts
        for n in counts:
            for interruptible, price in ((False, od), (True, spot)):
                if price is None:
                    continue
                out.append(
                    Offer(
                        provider=provider,
                        offer_id=f"{gpu_name}x{n}",
                        gpu=gpu_name,
                        gpu_count=n,
                        gpu_memory_gb=round(GPUS[gpu_name].memory_gb, 2),
                        price_per_hour=round(price * n, 4),
                        interruptible=interruptible,
                        reliability=snap.reliability,
                        location=snap.location,
                        storage_per_gb_month=snap.storage_per_gb_month,
                        egress_per_gb=snap.egress_per_gb,
                        inet_down_mbps=snap.inet_down_mbps,
                        preemptions_per_hour=snap.preemptions_per_hour if interruptible else 0.0,
                        source="snapshot",
                        as_of=as_of,
                    )
                )
    return out


def snapshot_offers() -> list[Offer]:
    """Every offer of the snapshot (one per provider, GPU, count and capacity class)."""
    snaps = snapshots()
    key = tuple((name, id(s)) for name, s in snaps.items())
    with _lock:
        offers = _built.get(key)
        if offers is None:
            offers = tuple(o for name, s in snaps.items() for o in _offers_of(name, s))
            _built.clear()
            _built[key] = offers
    return list(offers)
