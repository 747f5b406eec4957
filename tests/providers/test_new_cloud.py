"""Adding a cloud is one module plus its fake server: nothing else in tunebot changes.

tests/providers/extra_cloud/ holds a made-up cloud, Acme (acme.py, written like bot/providers/vast.py)
and its fake server (fake_acme.py, written like tests/fakes/clouds/vast.py). The fixture puts that
folder on the two packages' paths, exactly as if the files had been dropped into bot/providers/ and
tests/fakes/clouds/; from there the registry, settings, the snapshot, the live catalog, the estimate
and the provider contract find Acme on their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import fakes.clouds
import pytest
from fakes.clouds.fixtures import client_for, use_fake_env

import bot.providers
from bot.planner.catalog import snapshot_offers
from bot.planner.request import EstimateRequest
from bot.providers import catalog
from bot.providers.base import InstanceStatus, LaunchRequest, OfferQuery
from bot.providers.catalog import live_catalog
from bot.providers.lifecycle import ensure_launched
from bot.providers.registry import build_providers, cloud_names, configured_clouds, provider_classes
from bot.settings import Settings, get_settings

from . import test_contract
from .conftest import Harness

EXTRA = Path(__file__).parent / "extra_cloud"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> Iterator[fakes.clouds.FakeCloud]:
    monkeypatch.setattr(bot.providers, "__path__", [*bot.providers.__path__, str(EXTRA)])
    monkeypatch.setattr(fakes.clouds, "__path__", [*fakes.clouds.__path__, str(EXTRA)])
    get_settings.cache_clear()
    catalog.clear_cache()
    fake = fakes.clouds.discover_fakes()["acme"]().start()
    try:
        yield fake
    finally:
        fake.stop()
        monkeypatch.undo()
        for name in ("bot.providers.acme", "fakes.clouds.fake_acme"):
            sys.modules.pop(name, None)
        get_settings.cache_clear()
        catalog.clear_cache()


def test_the_new_cloud_is_discovered_and_priced_from_its_snapshot_without_a_key(acme) -> None:
    assert "acme" in cloud_names() and provider_classes()["acme"].__name__ == "AcmeProvider"
    assert "acme" not in configured_clouds(get_settings())
    snap = [o for o in snapshot_offers() if o.provider == "acme"]
    assert {(o.gpu, o.gpu_count, o.price_per_hour) for o in snap} >= {
        ("rtx-4090", 1, 0.15),
        ("h100-80gb", 8, 11.92),
    }
    cat = live_catalog(now=NOW)
    assert "acme: no ACME_API_KEY — prices from the 2026-11-25 snapshot (7 days old)" in cat.notes
    assert any(o.provider == "acme" and o.source == "snapshot" for o in cat.offers)


def test_the_new_cloud_is_configured_listed_live_and_labelled_for_launch(monkeypatch, acme, tmp_path) -> None:
    use_fake_env(monkeypatch, acme)  # ACME_API_KEY / ACME_API_URL, the names its module declares
    settings = get_settings()
    assert "acme" in configured_clouds(settings) and acme.api_key in settings.secrets()
    client = build_providers(settings, include_local=False)["acme"]
    assert client.base_url == acme.url and client.http.min_interval_s == 0.5

    cat = live_catalog(settings, providers=["acme"], now=NOW)
    assert cat.source == "live" and cat.notes == []
    assert {(o.offer_id, o.price_per_hour) for o in cat.offers} == {
        ("m-4090x1", 0.14),
        ("m-4090x2", 0.28),
        ("m-h100x1", 1.45),
        ("m-h100x8", 11.6),
    }
    assert sum(acme.per_request("search").values()) == 1  # four GPU counts, one URL, one request

    from bot.engine.service import Engine

    engine = Engine(
        Settings(TUNEBOT_DATA_DIR=str(tmp_path)),
        db_url=f"sqlite:///{tmp_path / 'db'}",
        providers={"acme": client},
    )
    est = engine.estimate(EstimateRequest(model="meta-llama/Llama-3.1-8B", method="qlora", tokens=1_000_000))
    cheapest = next(o for o in est.offers if "cheapest" in o.labels)
    assert (cheapest.provider, cheapest.offer_id, cheapest.source) == ("acme", "m-4090x1", "live")

    offer = client.search_offers(OfferQuery(gpu="rtx-4090", interruptible=False))[0]
    inst = ensure_launched(
        client, LaunchRequest(job_id="acme-1", offer=offer, image="img"), sleep=lambda s: 0
    )
    assert client.status(inst.instance_id).status == InstanceStatus.running
    assert [i["name"] for i in acme.live_instances()] == ["tunebot-acme-1"]


@pytest.mark.parametrize(
    "check",
    [
        test_contract.test_search_returns_normalized_offers_honouring_the_query,
        test_contract.test_launch_status_list_terminate_lifecycle,
        test_contract.test_launching_twice_with_the_same_job_label_gives_one_instance,
        test_contract.test_errors_are_typed,
        test_contract.test_volumes_list_and_delete_where_supported,
        test_contract.test_burn_rate_where_reported,
    ],
    ids=lambda f: f.__name__.removeprefix("test_"),
)
def test_the_new_cloud_meets_the_provider_contract(acme, check, caplog) -> None:
    harness = Harness("acme", client_for(acme), acme)
    if "caplog" in check.__code__.co_varnames:
        check(harness, caplog)
    else:
        check(harness)
