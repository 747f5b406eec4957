"""`/tune gpus` prices from the one price source every other door uses (bot/engine/launching/offers.py).

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


def _cli_rows(output: str) -> set[tuple[str, int, str]]:
    """(provider, GPUs, $/h) of every row of `tunebot gpus`'s table."""
    rows = set()
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 11 and cells[2].isdigit():
            rows.add((cells[0], int(cells[2]), cells[5]))
    return rows


def test_tunebot_gpus_and_slack_render_the_same_live_offers(
    keys_set: dict[str, FakeCloud], chat, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from bot.cli import app
    from bot.settings import get_settings

    monkeypatch.setenv("TUNEBOT_MIN_RELIABILITY", "0")  # as the chat's engine: the same offers on both doors
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["gpus", "--live", "--gpu", "rtx-4090"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in CLOUDS:
        assert f"note: {name}: live prices as of" in result.output
    cli = _cli_rows(result.output)
    reply = chat.handle_text("gpus RTX-4090", ALICE)
    table = next(p for p in reply.parts if isinstance(p, Table))
    prices = chat.engine.price_list("rtx-4090")
    by_row = {(o.provider, o.gpu_count, money(o.price_per_hour)): o for o in prices.offers}
    slack = [by_row[(r[0], int(r[2]), r[5].removesuffix("/h"))] for r in table.rows]
    assert slack and all(o.source == "live" for o in slack)
    assert {(o.provider, o.gpu_count, f"{o.price_per_hour:.2f}") for o in slack} <= cli


def test_one_gpu_table_two_forms() -> None:
    from datetime import UTC, datetime

    from bot.chat.cards import gpu_rows, gpus_reply
    from bot.engine.api import PriceList
    from bot.planner.offer import Offer

    offer = Offer(
        provider="vast",
        offer_id="1",
        gpu="h100-80gb",
        gpu_count=2,
        gpu_memory_gb=85.52,
        price_per_hour=3.8,
        interruptible=True,
        reliability=0.97,
        preemptions_per_hour=0.12,
        storage_per_gb_month=0.15,
        egress_per_gb=0.02,
    )
    assert gpu_rows([offer]) == (
        ["provider", "gpu", "n", "memory", "type", "price", "$/GPU-h"],
        [["vast", "h100-80gb", "2", "85.52 GB", "spot", "$3.80/h", "$1.90"]],
    )
    columns, rows = gpu_rows([offer], detailed=True)
    assert dict(zip(columns, rows[0], strict=True)) == {
        "provider": "vast",
        "gpu": "H100 80GB SXM",
        "n": "2",
        "memory GB": "85.5",
        "class": "interruptible",
        "$/h": "3.80",
        "$/GPU-h": "1.90",
        "storage $/GB-mo": "0.15",
        "egress $/GB": "0.02",
        "reliability": "0.970",
        "preempt/h": "0.12",
    }
    prices = PriceList(
        offers=[offer],
        notes=["vast: live prices as of 2026-12-03 10:00 UTC"],
        source="live",
        as_of=datetime(2026, 12, 3, 10, 0, tzinfo=UTC),
    )
    compact = flat(gpus_reply(prices, "h100-80gb"))
    assert "(live as of 2026-12-03 10:00 UTC)" in compact and "prices: vast: live prices" in compact
    assert "No offers for rtx-4090" in flat(gpus_reply(prices, "rtx-4090"))
