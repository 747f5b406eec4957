"""RunPod quirks: GraphQL errors with HTTP 200, per-GPU prices, null stockStatus, runtime null."""

from __future__ import annotations

import pytest
from fakes.clouds import FakeRunPod
from fakes.clouds.fixtures import client_for

from bot.providers.base import (
    AuthError,
    CapacityError,
    InstanceStatus,
    InvalidRequestError,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
    ProviderDownError,
)
from bot.providers.runpod import graphql_error, network_volume_price


@pytest.fixture
def runpod(fake_runpod: FakeRunPod):
    return client_for(fake_runpod), fake_runpod


def test_prices_are_per_gpu_times_the_count(runpod) -> None:
    provider, fake = runpod
    one = {o.offer_id: o for o in provider.search_offers(OfferQuery(gpu_count=1))}
    two = {o.offer_id: o for o in provider.search_offers(OfferQuery(gpu_count=2))}
    shared = set(one) & set(two)
    assert shared
    for gid in shared:
        assert two[gid].price_per_hour == pytest.approx(2 * one[gid].price_per_hour)
        assert two[gid].gpu_count == 2
    assert fake.last_body("search")["variables"]["input"]["gpuCount"] == 2


def test_null_stock_status_means_unavailable(runpod) -> None:
    provider, fake = runpod
    before = {o.offer_id for o in provider.search_offers(OfferQuery())}
    target = sorted(before)[0]
    fake.unavailable.add(target)
    assert target not in {o.offer_id for o in provider.search_offers(OfferQuery())}
    assert "NVIDIA L4" not in before  # unknown card dropped


def test_no_interruptible_offers(runpod) -> None:
    provider, _ = runpod
    assert provider.search_offers(OfferQuery(interruptible=True)) == []
    assert not provider.capabilities.interruptible


def test_graphql_errors_with_http_200_become_typed_errors(runpod) -> None:
    provider, fake = runpod
    offer = provider.search_offers(OfferQuery())[0]
    fake.inject("capacity")
    with pytest.raises(CapacityError, match="no longer any instances"):
        provider.launch(LaunchRequest(job_id="full", offer=offer, image="img"))
    fake.inject_response(200, {"errors": [{"message": "Something went wrong. Internal server error"}]})
    with pytest.raises(ProviderDownError):
        provider.list_instances()
    with pytest.raises(InvalidRequestError):
        provider.launch(LaunchRequest(job_id="noimage", offer=offer, image=""))


def test_error_messages_map() -> None:
    assert isinstance(graphql_error([{"message": "pod not found to terminate"}]), NotFoundError)
    assert isinstance(graphql_error([{"message": "Unauthorized"}]), AuthError)
    assert isinstance(graphql_error([{"message": "Field 'x' is not defined"}]), InvalidRequestError)


def test_bad_key_is_an_auth_error_without_the_key(fake_runpod: FakeRunPod) -> None:
    with pytest.raises(AuthError) as err:
        client_for(fake_runpod, api_key="rp-wrong-key-9876").search_offers(OfferQuery())
    assert "rp-wrong-key-9876" not in str(err.value)


def test_runtime_null_until_up_reads_as_provisioning_and_name_is_the_label(runpod) -> None:
    provider, fake = runpod
    offer = provider.search_offers(OfferQuery())[0]
    inst = provider.launch(LaunchRequest(job_id="rt", offer=offer, image="img", env={"A": "1"}))
    assert fake.instances[inst.instance_id]["name"] == "tunebot-rt"
    assert fake.instances[inst.instance_id]["env"] == [{"key": "A", "value": "1"}]
    first = provider.status(inst.instance_id)
    assert first.status == InstanceStatus.provisioning and first.raw_status == "RUNNING"
    assert provider.status(inst.instance_id).status == InstanceStatus.running
    fake.preempt(inst.instance_id)
    assert provider.status(inst.instance_id).status == InstanceStatus.exited


def test_the_creation_time_comes_from_the_rented_by_user_status(runpod) -> None:
    """Billing starts on RunPod's clock: lastStatusChange says when the pod was rented (until it changes)."""
    import time

    from bot.providers.runpod import rented_at

    provider, _ = runpod
    offer = provider.search_offers(OfferQuery())[0]
    before = time.time()
    inst = provider.launch(LaunchRequest(job_id="ct", offer=offer, image="img"))
    listed = next(i for i in provider.list_instances() if i.instance_id == inst.instance_id)
    for seen in (provider.status(inst.instance_id), listed):
        assert seen.created_at is not None and before - 1.5 <= seen.created_at.timestamp() <= time.time()
    real = rented_at("Rented by User: Fri Jan 26 2024 15:32:41 GMT+0000 (Coordinated Universal Time)")
    assert real is not None and real.isoformat() == "2024-01-26T15:32:41+00:00"
    assert rented_at("Exited by User: Fri Jan 26 2024 16:00:00 GMT+0000") is None and rented_at(None) is None


def test_terminate_of_a_missing_pod_is_already_gone(runpod) -> None:
    """The delete goes out, RunPod answers "pod not found to terminate", and terminate takes that as done
    (no error) without touching another pod."""
    provider, fake = runpod
    offer = provider.search_offers(OfferQuery())[0]
    kept = provider.launch(LaunchRequest(job_id="kept", offer=offer, image="img"))
    deletes = fake.count("delete")
    provider.terminate("pod-that-never-was")
    assert fake.count("delete") == deletes + 1
    assert fake.last_body("delete")["variables"]["input"]["podId"] == "pod-that-never-was"
    assert "pod-that-never-was" not in fake.instances
    assert fake.instances[kept.instance_id]["desiredStatus"] != "TERMINATED"


def test_burn_rate_comes_from_current_spend(runpod) -> None:
    provider, _ = runpod
    offer = provider.search_offers(OfferQuery())[0]
    provider.launch(LaunchRequest(job_id="spend", offer=offer, image="img"))
    assert provider.burn_rate() == pytest.approx(offer.price_per_hour)


def test_network_volume_prices() -> None:
    assert network_volume_price(100) == 0.07 and network_volume_price(2000) == 0.05
