"""The estimate cache behind the launch buttons: small per estimate, and a click launches what was shown."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from engine.fakes import FakeProvider

from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.permissions import Permissions
from bot.chat.replies import Buttons
from bot.planner.sources import SourcePolicy
from bot.providers import catalog
from bot.settings import Settings

ALICE = Actor("U_ALICE", "C1")


def _chat(tmp_path: Path, provider: FakeProvider) -> tuple[ChatHandlers, object]:
    from bot.engine.service import Engine

    catalog.clear_cache()
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), TUNEBOT_APPROVAL_ABOVE=1e9)
    engine = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"vast": provider})
    engine.auto_launch = False
    # the tests' datasets are in tmp_path: the folder Slack users may name (bot/planner/sources.py)
    return ChatHandlers(engine, Permissions(), sources=SourcePolicy(data_dir=tmp_path)), engine


def _estimate_id(reply) -> str:  # type: ignore[no-untyped-def]
    buttons = next(p for p in reply.parts if isinstance(p, Buttons))
    return buttons.buttons[0].value


def test_the_store_keeps_a_few_kilobytes_per_estimate_not_whole_estimates(tmp_path: Path) -> None:
    chat, _ = _chat(tmp_path, FakeProvider("vast", price=0.40))
    chat.handle_text("estimate meta-llama/Llama-3.1-8B tokens=1000000", ALICE)  # caches warm
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(30):
            chat.handle_text(f"estimate meta-llama/Llama-3.1-8B tokens={1_000_001 + i}", ALICE)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    # A whole Estimate (every offer, fitting or not) held ~140 KB; 2,000 of them made the bot ~0.4 GB.
    assert held / 30 < 20_000, f"{held / 30:.0f} bytes kept per estimate"


def test_a_click_launches_the_offer_and_price_shown_even_after_prices_moved(tmp_path: Path) -> None:
    cloud = FakeProvider("vast", price=0.40)
    chat, engine = _chat(tmp_path, cloud)
    data = tmp_path / "train.jsonl"
    data.write_text('{"instruction": "Say hi.", "input": "", "output": "Hi there!"}\n' * 50)
    reply = chat.handle_text(f"estimate Llama-3.1-8B method=qlora dataset={data}", ALICE)
    stored = chat.store.get(_estimate_id(reply))
    assert stored is not None
    seen = stored.estimate
    cheapest = next(o for o in seen.offers if "cheapest" in o.labels)
    assert (cheapest.provider, cheapest.price_per_hour) == ("vast", 0.40)
    assert all(o.fits for o in seen.offers)  # the rejected offers are not kept

    cloud.price = 0.43  # the live price moves within the tolerance before the click
    catalog.clear_cache()
    launched = chat.launch(_estimate_id(reply), "cheapest", ALICE)
    assert "Launching job" in launched.fallback or "Job" in launched.fallback, launched.fallback
    job = engine.list_jobs(user="U_ALICE")[0]
    assert (job.provider, job.price_per_hour) == ("vast", 0.40)
    assert job.estimated_cost == cheapest.total_cost
