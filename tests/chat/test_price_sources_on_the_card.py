"""The estimate card says where every cloud's prices come from, in Slack's compact form too."""

from __future__ import annotations

from bot.chat.blockkit import to_blocks, violations
from bot.chat.cards import estimate_reply
from bot.engine.launching.offers import priced_estimate
from bot.planner.request import EstimateRequest
from bot.providers.registry import CLOUDS
from bot.settings import Settings


def test_the_compact_card_names_every_clouds_price_source(tmp_path) -> None:
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path))
    est = priced_estimate(settings, {}, EstimateRequest(model="llama-3.2-1b", tokens=1_000_000))
    for detailed in (False, True):
        reply = estimate_reply(est, estimate_id="e1", detailed=detailed)
        blocks = to_blocks(reply)
        assert violations({"blocks": blocks, "text": reply.fallback or "estimate"}) == []
        text = str(blocks)
        for cloud in CLOUDS:  # no key set anywhere: each one priced from its dated snapshot, said so
            assert f"{cloud}: no " in text and "snapshot" in text, (cloud, detailed)
