"""Adding a cloud is its module, its fake server, and its line in CLOUDS: nothing else in tunebot changes.

tests/providers/extra_cloud/ holds a made-up cloud, Acme (acme.py, written like bot/providers/vast.py)
and its fake server (fake_acme.py, written like tests/fakes/clouds/vast.py). The fixture puts that
folder on the two packages' paths, exactly as if the files had been dropped into bot/providers/ and
tests/fakes/clouds/, and adds Acme's line to ``CLOUDS`` (bot/providers/registry.py); from there the
registry, the cloud variables, the snapshot, the live catalog, the estimate, `/tune gpus` and the whole
provider contract suite find Acme on their own.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import fakes.clouds
import pytest
from fakes.clouds.fixtures import client_for, use_fake_env

import bot.providers
from bot.planner.request import EstimateRequest
from bot.providers import catalog, registry
from bot.providers.base import InstanceStatus, LaunchRequest, OfferQuery
from bot.providers.catalog import live_catalog
from bot.providers.lifecycle import ensure_launched
from bot.providers.registry import CLOUDS, build_providers, configured_clouds, provider_classes, secrets
from bot.providers.snapshot import snapshot_offers
from bot.settings import Settings, get_settings

from . import test_contract
from .conftest import Harness

EXTRA = Path(__file__).parent / "extra_cloud"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def dropped(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Acme's two files dropped in (its module importable as bot.providers.acme, its fake found by the fakes'
    folder scan), but not yet its line in CLOUDS."""
    monkeypatch.setattr(bot.providers, "__path__", [*bot.providers.__path__, str(EXTRA)])
    monkeypatch.setattr(fakes.clouds, "__path__", [*fakes.clouds.__path__, str(EXTRA)])
    monkeypatch.setitem(fakes.clouds.FAKES, "acme", fakes.clouds.discover_fakes()["acme"])  # the scan, again
    get_settings.cache_clear()
    catalog.clear_cache()
    try:
        yield importlib.import_module("bot.providers.acme")
    finally:
        monkeypatch.undo()
        for name in ("bot.providers.acme", "fakes.clouds.fake_acme"):
            sys.modules.pop(name, None)
        get_settings.cache_clear()
        catalog.clear_cache()


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch, dropped) -> Iterator[fakes.clouds.FakeCloud]:
    monkeypatch.setitem(registry.CLOUDS, "acme", dropped.CLOUD)  # the one line in CLOUDS
    fake = fakes.clouds.FAKES["acme"]().start()
    try:
        yield fake
    finally:
        fake.stop()


def test_a_module_is_not_a_cloud_until_its_line_is_in_clouds(dropped) -> None:
    assert "acme" not in CLOUDS and "acme" not in provider_classes()
    assert not any(o.provider == "acme" for o in snapshot_offers())
    assert not any(n.startswith("acme:") for n in live_catalog(now=NOW).notes)


def test_the_new_cloud_is_discovered_and_priced_from_its_snapshot_without_a_key(acme) -> None:
    assert "acme" in CLOUDS and provider_classes()["acme"].__name__ == "AcmeProvider"
    assert "acme" not in configured_clouds()
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
    assert "acme" in configured_clouds() and acme.api_key in secrets(settings)
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


CONTRACT = [
    f
    for name, f in inspect.getmembers(test_contract, inspect.isfunction)
    if name.startswith("test_") and f.__module__ == test_contract.__name__
]


@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("test_"))
def test_the_new_cloud_meets_the_whole_provider_contract(
    acme, check: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    """Every test of tests/providers/test_contract.py, run against Acme and its fake."""
    available = {"harness": Harness("acme", client_for(acme), acme), "caplog": caplog}
    wanted = inspect.signature(check).parameters
    assert set(wanted) <= set(available), f"{check.__name__} wants a fixture this test does not give"
    check(**{name: available[name] for name in wanted})


def test_the_contract_suite_is_all_here() -> None:
    names = {f.__name__ for f in CONTRACT}
    assert len(names) >= 8 and "test_launch_status_list_terminate_lifecycle" in names
