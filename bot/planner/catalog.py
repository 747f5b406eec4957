"""The dated offline price catalog (data/catalog.json): what offers cost when no provider is asked.

The providers area refreshes prices live (bot.providers.catalog.live_catalog); this snapshot is the
fallback and the default for `tunebot estimate`. RunPod stopped selling spot capacity in September
2026; Lambda and TensorDock sell on-demand only; Vast.ai sells interruptible (bid) instances.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from bot.planner.gpus import GPUS
from bot.planner.offer import Offer

DATA = Path(__file__).parent / "data" / "catalog.json"


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return json.loads(DATA.read_text())


def snapshot_date() -> date:
    return date.fromisoformat(_raw()["snapshot_date"])


def snapshot_as_of() -> datetime:
    d = snapshot_date()
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def provider_terms(provider: str) -> dict[str, Any]:
    """Storage, egress, reliability and preemption figures of a provider in the snapshot."""
    terms = _raw()["providers"].get(provider, {})
    return {k: v for k, v in terms.items() if k != "gpus"}


@lru_cache(maxsize=1)
def _offers() -> tuple[Offer, ...]:
    as_of = snapshot_as_of()
    out: list[Offer] = []
    for provider, p in _raw()["providers"].items():
        for gpu_name, spec in p["gpus"].items():
            od, spot = spec[0], spec[1]
            counts = spec[2] if len(spec) > 2 else p["counts"]
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
                            reliability=p["reliability"],
                            location=p.get("location"),
                            storage_per_gb_month=p["storage_per_gb_month"],
                            egress_per_gb=p["egress_per_gb"],
                            inet_down_mbps=p.get("inet_down_mbps"),
                            preemptions_per_hour=p["preemptions_per_hour"] if interruptible else 0.0,
                            source="snapshot",
                            as_of=as_of,
                        )
                    )
    return tuple(out)


def snapshot_offers() -> list[Offer]:
    """Every offer of the snapshot (one per provider, GPU, count and capacity class)."""
    return list(_offers())
