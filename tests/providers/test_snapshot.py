"""The dated offline price snapshot (bot/providers/snapshot.py)."""

from __future__ import annotations

from datetime import date

from bot.planner.offer import GPU_NAMES
from bot.providers.registry import CLOUDS
from bot.providers.snapshot import snapshot_date, snapshot_offers


def test_snapshot_is_dated_and_uses_canonical_gpu_names() -> None:
    assert snapshot_date() == date(2026, 11, 20)
    offers = snapshot_offers()
    assert {o.gpu for o in offers} == set(GPU_NAMES)
    assert {o.provider for o in offers} == set(CLOUDS)  # every cloud has snapshot prices
    assert all(o.source == "snapshot" and o.as_of is not None for o in offers)


def test_only_vast_sells_interruptible_capacity() -> None:
    spot = [o for o in snapshot_offers() if o.interruptible]
    assert spot and {o.provider for o in spot} == {"vast"}
    assert all(o.preemptions_per_hour > 0 for o in spot)
    assert all(o.preemptions_per_hour == 0 for o in snapshot_offers() if not o.interruptible)


def test_interruptible_is_cheaper_and_prices_scale_with_count() -> None:
    offers = {(o.provider, o.gpu, o.gpu_count, o.interruptible): o for o in snapshot_offers()}
    for (provider, gpu, n, spot), o in offers.items():
        if spot:
            assert o.price_per_hour < offers[(provider, gpu, n, False)].price_per_hour
        if n > 1 and (provider, gpu, 1, spot) in offers:
            assert o.price_per_hour == round(n * offers[(provider, gpu, 1, spot)].price_per_hour, 4)
    assert ("lambda", "a100-80gb", 1, False) not in offers  # sold as 8-GPU nodes only
