"""The planner on every cloud's dated snapshot, for tests that price a request without an engine.

The planner never asks a cloud (tests/test_layers.py): whoever calls it hands it the offers, as
bot/engine/launching/offers.snapshot_estimate does. This is that hand-over for tests.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bot.planner.inputs import plan_request
from bot.planner.offer import Offer
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from bot.providers.snapshot import snapshot_as_of, snapshot_offers


def snapshot_plan(
    request: EstimateRequest,
    *,
    offers: list[Offer] | None = None,
    prices_as_of: datetime | None = None,
    **kw: Any,
) -> Estimate:
    """plan_request with ``offers`` (default: the snapshot's, dated as the snapshot)."""
    if offers is None:
        offers, prices_as_of = snapshot_offers(), prices_as_of or snapshot_as_of()
    return plan_request(request, offers=offers, prices_as_of=prices_as_of, **kw)
