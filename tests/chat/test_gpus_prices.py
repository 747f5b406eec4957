"""`/tune gpus` prices from the one price source every other door uses (bot/engine/offers.py).

On 497be72 the handler asked ``getattr(engine, "offers")``, which no engine has, so `/tune gpus` showed the
dated snapshot even with every cloud's key set. Here: the real Engine against the fake clouds on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.clouds import FakeCloud
from fakes.clouds.fixtures import client_for, fake_clouds, use_fake_env  # noqa: F401 - fixture

from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.permissions import Permissions
from bot.chat.replies import Table
from bot.engine.service import Engine
from bot.money import money
from bot.providers import catalog
from bot.providers.base import OfferQuery
from bot.providers.registry import CLOUDS
from bot.settings import Settings

from .test_handlers import flat

ALICE = Actor("U_ALICE", "C1")


@pytest.fixture
def chat(tmp_path: Path) -> Iterator[ChatHandlers]:
    catalog.clear_cache()
    engine = Engine(
        Settings(TUNEBOT_DATA_DIR=str(tmp_path), TUNEBOT_MIN_RELIABILITY="0"),
        db_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        local_provider=False,
    )
    try:
        yield ChatHandlers(engine, Permissions())
    finally:
        engine.close()
        catalog.clear_cache()


@pytest.fixture
def keys_set(monkeypatch: pytest.MonkeyPatch, fake_clouds: dict[str, FakeCloud]) -> dict[str, FakeCloud]:  # noqa: F811
    for fake in fake_clouds.values():
        use_fake_env(monkeypatch, fake)
    return fake_clouds


def test_gpus_shows_live_prices_when_the_cloud_keys_are_set(keys_set: dict[str, FakeCloud], chat) -> None:
    reply = chat.handle_text("gpus", ALICE)
    text = flat(reply)
    assert "(live as of" in text and "snapshot" not in text, text[:600]
    for name in CLOUDS:
        assert f"{name}: live prices as of" in text
    table = next(p for p in reply.parts if isinstance(p, Table))
    live = {
        (o.provider, o.gpu, o.gpu_count, money(o.price_per_hour))
        for name, fake in keys_set.items()
        for n in (1, 2, 4, 8)
        for o in client_for(fake).search_offers(OfferQuery(gpu_count=n, min_reliability=0))
    }
    shown = {(row[0], row[1], int(row[2]), row[5].removesuffix("/h")) for row in table.rows}
    assert shown and shown <= live  # every row is an offer a fake cloud answered, at its live price
    assert all(sum(f.per_request("search").values()) >= 1 for f in keys_set.values())

    h100 = flat(chat.handle_text("gpus H100", ALICE))
    assert "h100-80gb" in h100 and "rtx-4090" not in h100 and "(live as of" in h100


def test_gpus_without_keys_says_every_cloud_is_priced_from_its_snapshot(chat) -> None:
    text = flat(chat.handle_text("gpus", ALICE))
    assert "(snapshot as of 2026-" in text
    for name, spec in CLOUDS.items():
        assert f"{name}: no {spec.key_env}" in text
