"""live_catalog: live offers over the dated snapshot, clear notes when a cloud answers from the snapshot."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from fakes.clouds.fixtures import client_for, use_fake_env

from bot.providers import catalog
from bot.providers import snapshot as dated
from bot.providers.catalog import live_catalog
from bot.providers.registry import CLOUDS
from bot.settings import get_settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fresh_cache():
    catalog.clear_cache()
    yield
    catalog.clear_cache()


def _age_phrase() -> str:
    snap = dated.snapshot_date()
    return f"{snap.isoformat()} snapshot ({(NOW.date() - snap).days} days old)"


def test_keys_set_and_clouds_up_gives_live_offers_only(fake_clouds) -> None:
    clients = {name: client_for(fake) for name, fake in fake_clouds.items()}
    cat = live_catalog(get_settings(), providers=clients, now=NOW)
    assert cat.source == "live" and cat.notes == [] and cat.as_of == NOW
    assert {o.provider for o in cat.offers} == set(CLOUDS)
    assert all(o.source == "live" for o in cat.offers)
    prices = [o.price_per_hour for o in cat.offers]
    assert prices == sorted(prices)
    assert {o.gpu_count for o in cat.offers} >= {1, 2, 8}  # multi-GPU offers, like the snapshot's


def test_a_cloud_without_a_key_falls_back_to_its_snapshot_with_a_dated_note(fake_vast) -> None:
    cat = live_catalog(get_settings(), providers={"vast": client_for(fake_vast)}, now=NOW)
    assert cat.source == "mixed" and cat.live_providers == ["vast"]
    assert {o.provider for o in cat.offers if o.source == "live"} == {"vast"}
    snap = {o.provider for o in cat.offers if o.source == "snapshot"}
    assert snap == set(CLOUDS) - {"vast"} and "runpod" in snap
    notes = "\n".join(cat.notes)
    for name, spec in CLOUDS.items():
        if name != "vast":
            assert f"{name}: no {spec.key_env} — prices from the {_age_phrase()}" in notes
    assert "vast" not in notes


def test_no_keys_at_all_is_the_snapshot_with_a_note_per_cloud() -> None:
    cat = live_catalog(now=NOW)
    assert cat.source == "snapshot" and len(cat.notes) == len(CLOUDS) and cat.offers
    assert all(o.source == "snapshot" for o in cat.offers)
    assert cat.as_of is not None and cat.as_of.date() == dated.snapshot_date()
    assert any(n.startswith("lambda: no LAMBDA_API_KEY") for n in cat.notes)


def test_keys_from_the_environment_reach_the_fake(monkeypatch, fake_lambda) -> None:
    use_fake_env(monkeypatch, fake_lambda)
    cat = live_catalog(providers=["lambda"], now=NOW)
    assert cat.source == "live" and cat.offers and all(o.provider == "lambda" for o in cat.offers)
    assert fake_lambda.count("search") == 1  # every size is listed at one URL: asked once


def test_a_cloud_that_is_down_falls_back_to_its_snapshot(fake_runpod) -> None:
    client = client_for(fake_runpod)
    fake_runpod.stop()  # nothing listens there any more
    cat = live_catalog(get_settings(), providers={"runpod": client}, now=NOW)
    note = next(n for n in cat.notes if n.startswith("runpod:"))
    assert "live prices unavailable (ProviderDownError" in note and _age_phrase() in note
    assert any(o.provider == "runpod" and o.source == "snapshot" for o in cat.offers)
    assert fake_runpod.api_key not in note


def test_live_answers_are_cached_for_the_ttl(fake_tensordock) -> None:
    clients = {"tensordock": client_for(fake_tensordock)}
    live_catalog(get_settings(), providers=clients, now=NOW)
    live_catalog(get_settings(), providers=clients, now=NOW)
    per_refresh = 1  # GET /locations lists every size: one request per listing
    assert fake_tensordock.count("search") == per_refresh
    catalog.clear_cache()
    live_catalog(get_settings(), providers=clients, now=NOW)
    assert fake_tensordock.count("search") == 2 * per_refresh


def test_zero_ttl_always_asks_again(monkeypatch, fake_tensordock) -> None:
    monkeypatch.setenv("TUNEBOT_CATALOG_TTL", "0")
    get_settings.cache_clear()
    clients = {"tensordock": client_for(fake_tensordock)}
    live_catalog(get_settings(), providers=clients, now=NOW)
    live_catalog(get_settings(), providers=clients, now=NOW)
    assert fake_tensordock.count("search") == 2


def test_filters_apply_to_live_and_snapshot_offers(fake_vast) -> None:
    cat = live_catalog(
        get_settings(),
        gpu="rtx-4090",
        interruptible=False,
        providers={"vast": client_for(fake_vast)},
        now=NOW,
    )
    assert cat.offers and all(o.gpu == "rtx-4090" and not o.interruptible for o in cat.offers)


def test_tunebot_gpus_live_shows_live_offers_with_keys_and_notes_without(monkeypatch, fake_vast) -> None:
    from typer.testing import CliRunner

    from bot.cli import app

    use_fake_env(monkeypatch, fake_vast)
    result = CliRunner().invoke(app, ["gpus", "--live", "--gpu", "rtx-4090"])
    assert result.exit_code == 0, result.output
    assert "mixed" in result.output and "vast: no VAST_API_KEY" not in result.output
    assert "runpod: no RUNPOD_API_KEY" in result.output and fake_vast.count("search") > 0


def test_a_listing_sends_each_distinct_request_once(fake_clouds) -> None:
    clients = {name: client_for(fake) for name, fake in fake_clouds.items()}
    cat = live_catalog(get_settings(), providers=clients, now=NOW)
    assert cat.source == "live"
    for name, fake in fake_clouds.items():
        asked = fake.per_request("search")
        assert asked and set(asked.values()) == {1}, (name, asked)
    # Lambda and TensorDock list every size at one URL; before, each GPU count asked it again.
    assert sum(fake_clouds["lambda"].per_request("search").values()) == 1
    assert sum(fake_clouds["tensordock"].per_request("search").values()) == 1
    assert {o.gpu_count for o in cat.offers if o.provider == "lambda"} >= {1, 8}


def test_a_stalling_cloud_falls_back_to_its_snapshot_while_the_others_answer(fake_clouds) -> None:
    slow = fake_clouds["runpod"]
    slow.delay_s = 3.0  # every RunPod answer takes 3 s; the listing waits 0.5 s for all clouds together
    clients = {name: client_for(fake, timeout_s=10.0) for name, fake in fake_clouds.items()}
    cat = live_catalog(get_settings(), providers=clients, now=NOW, deadline_s=0.5)
    assert sorted(cat.live_providers) == ["lambda", "tensordock", "vast"]
    assert cat.snapshot_providers == ["runpod"] and cat.source == "mixed"
    assert cat.notes == [f"runpod: no live answer within 0.5 s — prices from the {_age_phrase()}"]
    runpod = [o for o in cat.offers if o.provider == "runpod"]
    assert runpod and all(o.source == "snapshot" for o in runpod)

    # Asked again while RunPod still stalls: the listing in flight is waited on, not asked again.
    again = live_catalog(get_settings(), providers=clients, now=NOW, deadline_s=0.2)
    assert again.snapshot_providers == ["runpod"] and slow.count("search") == 1

    # The late answer still lands in the cache: once RunPod's listing has finished in the background,
    # the next listing is live without asking RunPod again.
    slow.delay_s = 0.0
    for thread in threading.enumerate():
        if thread.name == "catalog-runpod":
            thread.join(30)
    asked = slow.count("search")
    again = live_catalog(get_settings(), providers={"runpod": clients["runpod"]}, now=NOW)
    assert again.live_providers == ["runpod"] and slow.count("search") == asked


def test_clients_built_from_settings_keep_the_documented_rate(monkeypatch, fake_lambda) -> None:
    from bot.providers.registry import build_providers, cloud_spec

    use_fake_env(monkeypatch, fake_lambda)
    client = build_providers(get_settings(), include_local=False)["lambda"]
    assert client.http.min_interval_s == cloud_spec("lambda").min_interval_s == 1.0
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(round(s, 6))
        now[0] += s

    client.http._sleep, client.http._clock = sleep, lambda: now[0]
    for _ in range(3):
        client.list_instances()
    assert slept == [1.0, 1.0]  # three requests, one per second (docs/providers.md: about 1 request/s)
