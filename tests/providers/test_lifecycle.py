"""ensure_launched / ensure_terminated / check_price against fake clouds with injected faults."""

from __future__ import annotations

import pytest
from fakes.clouds import FAKES
from fakes.clouds.fixtures import client_for

from bot.providers.base import (
    CapacityError,
    InstanceStatus,
    LaunchRequest,
    OfferQuery,
    PriceChangedError,
    ProviderDownError,
)
from bot.providers.lifecycle import check_price, ensure_launched, ensure_terminated
from bot.providers.registry import CLOUDS


def no_sleep(seconds: float) -> None:
    return None


@pytest.fixture(params=list(CLOUDS))
def cloud(request: pytest.FixtureRequest):
    fake = FAKES[request.param](timeout_sleep_s=0.3).start()
    try:
        yield client_for(fake, timeout_s=0.15), fake
    finally:
        fake.stop()


def _req(provider, job: str) -> LaunchRequest:
    return LaunchRequest(job_id=job, offer=provider.search_offers(OfferQuery())[0], image="img")


@pytest.mark.parametrize("after", ["500", "timeout", "reset"])
def test_a_create_that_fails_after_creating_is_adopted_not_duplicated(cloud, after: str) -> None:
    provider, fake = cloud
    request = _req(provider, f"adopt-{after}")
    fake.inject("create_fails", after=after)
    inst = ensure_launched(provider, request, sleep=no_sleep)
    assert fake.created_total == 1, "the create was not repeated"
    assert [i.instance_id for i in provider.list_instances()] == [inst.instance_id]
    assert fake.max_live_per_label[request.label] == 1


def test_an_existing_instance_with_the_label_is_adopted_without_a_create(cloud) -> None:
    provider, fake = cloud
    request = _req(provider, "exists")
    first = provider.launch(request)
    creates = fake.count("create")
    assert ensure_launched(provider, request, sleep=no_sleep).instance_id == first.instance_id
    assert fake.count("create") == creates


def test_rate_limited_creates_are_retried_after_looking_for_the_label(cloud) -> None:
    provider, fake = cloud
    request = _req(provider, "busy")
    fake.inject("429", ops={"create"}, times=2)
    inst = ensure_launched(provider, request, sleep=no_sleep)
    assert fake.created_total == 1 and inst.label == request.label


def test_capacity_errors_are_raised_at_once(cloud) -> None:
    provider, fake = cloud
    fake.inject("capacity")
    with pytest.raises(CapacityError):
        ensure_launched(provider, _req(provider, "full"), sleep=no_sleep)
    assert fake.live_instances() == []


def test_a_provider_that_stays_down_raises_and_creates_nothing(cloud) -> None:
    provider, fake = cloud
    request = _req(provider, "down")
    fake.inject("503", times=1000)
    with pytest.raises(ProviderDownError):
        ensure_launched(provider, request, attempts=3, sleep=no_sleep)
    assert fake.live_instances() == []


def test_extra_instances_of_a_job_are_terminated(cloud) -> None:
    provider, fake = cloud
    request = _req(provider, "twins")
    a = provider.launch(request)
    # A second instance with the same label (e.g. created by a crashed bot that launched blindly).
    b = provider.launch(LaunchRequest(job_id="twins-tmp", offer=request.offer, image="img"))
    key = "label" if fake.provider == "vast" else "name"
    fake.instances[b.instance_id][key] = request.label
    kept = ensure_launched(provider, request, sleep=no_sleep)
    assert kept.instance_id in (a.instance_id, b.instance_id)
    assert [i.instance_id for i in provider.list_instances() if i.label == request.label] == [
        kept.instance_id
    ]


def test_a_dead_instance_is_terminated_before_relaunching(cloud) -> None:
    provider, fake = cloud
    request = _req(provider, "relaunch")
    old = provider.launch(request)
    provider.status(old.instance_id)
    fake.preempt(old.instance_id)
    alive = (InstanceStatus.running, InstanceStatus.provisioning, InstanceStatus.unknown)
    seen = [provider.status(old.instance_id).status]
    while seen[-1] in alive and len(seen) < 3:  # Lambda: unhealthy (may recover), then terminated
        seen.append(provider.status(old.instance_id).status)
    assert seen[-1] not in alive, f"{fake.provider}: its host failure still reads as {seen}"
    new = ensure_launched(provider, request, sleep=no_sleep)
    assert new.instance_id != old.instance_id
    assert [i.instance_id for i in provider.list_instances() if i.label == request.label] == [new.instance_id]


def test_ensure_terminated_rides_out_an_outage(cloud) -> None:
    provider, fake = cloud
    inst = provider.launch(_req(provider, "outage"))
    fake.inject("502", times=12)
    assert ensure_terminated(provider, inst.instance_id, deadline_s=10, sleep=no_sleep) is True
    assert fake.live_instances() == []
    assert ensure_terminated(provider, inst.instance_id, deadline_s=1, sleep=no_sleep) is True


def test_ensure_terminated_gives_up_at_the_deadline(cloud) -> None:
    provider, fake = cloud
    inst = provider.launch(_req(provider, "stuck"))
    fake.inject("500", times=10_000)
    clock = iter(range(0, 10_000, 5))
    assert (
        ensure_terminated(
            provider, inst.instance_id, deadline_s=20, sleep=no_sleep, clock=lambda: float(next(clock))
        )
        is False
    )
    fake.clear_faults()
    assert len(fake.live_instances()) == 1


def test_check_price_within_tolerance_returns_the_live_offer(cloud) -> None:
    provider, _ = cloud
    offer = provider.search_offers(OfferQuery())[0]
    live = check_price(provider, offer, accepted_price_per_hour=offer.price_per_hour / 1.05, tolerance=0.10)
    assert live.offer_id == offer.offer_id and live.price_per_hour == pytest.approx(offer.price_per_hour)


def test_check_price_stops_a_launch_when_the_price_rose_too_much(cloud) -> None:
    provider, _ = cloud
    offer = provider.search_offers(OfferQuery())[0]
    accepted = round(offer.price_per_hour / 1.5, 4)
    with pytest.raises(PriceChangedError) as err:
        check_price(provider, offer, accepted_price_per_hour=accepted, tolerance=0.10)
    message = str(err.value)
    assert f"${offer.price_per_hour:.3f}/h" in message and f"${accepted:.3f}/h" in message
    assert "launch stopped" in message


def test_check_price_of_a_vanished_offer_quotes_an_equivalent_one(cloud) -> None:
    provider, fake = cloud
    offer = provider.search_offers(OfferQuery())[0]
    gone = offer.model_copy(update={"offer_id": "999999" if fake.provider == "vast" else "nope@nowhere:x"})
    live = check_price(provider, gone, accepted_price_per_hour=offer.price_per_hour, tolerance=0.1)
    assert live.gpu == offer.gpu and live.gpu_count == 1 and live.price_per_hour <= offer.price_per_hour * 1.1
    unsold = gone.model_copy(update={"gpu_count": 16})  # nobody sells 16-GPU machines
    with pytest.raises(CapacityError):
        check_price(provider, unsold, accepted_price_per_hour=offer.price_per_hour, tolerance=0.1)


def test_check_price_of_a_snapshot_offer_uses_the_cheapest_live_equivalent(cloud) -> None:
    from bot.providers.snapshot import snapshot_offers

    provider, fake = cloud
    live_offers = provider.search_offers(OfferQuery(interruptible=False))
    gpu = live_offers[0].gpu
    snap = next(
        (o for o in snapshot_offers() if o.gpu == gpu and o.gpu_count == 1 and not o.interruptible), None
    )
    if snap is None:
        pytest.skip(f"the snapshot has no 1x {gpu} on-demand offer")
    snap = snap.model_copy(update={"provider": fake.provider})
    live = check_price(provider, snap, accepted_price_per_hour=live_offers[0].price_per_hour, tolerance=0.0)
    assert live.source == "live" and live.offer_id == live_offers[0].offer_id
