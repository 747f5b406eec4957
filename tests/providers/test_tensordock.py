"""TensorDock v2 (the least certain client): computed totals, cloud_init, no spot, no volumes."""

from __future__ import annotations

import pytest
from fakes.clouds import FakeTensorDock
from fakes.clouds.fixtures import client_for

from bot.providers.base import CapacityError, InstanceStatus, LaunchRequest, NotFoundError, OfferQuery
from bot.providers.tensordock import ASSUMPTIONS, total_price


@pytest.fixture
def td(fake_tensordock: FakeTensorDock):
    return client_for(fake_tensordock), fake_tensordock


def test_total_price_adds_vcpu_ram_and_storage() -> None:
    gpu = {
        "price_per_hr": 0.35,
        "resources": {"max_vcpus": 64, "max_ram_gb": 256},
        "pricing": {"per_vcpu_hr": 0.003, "per_gb_ram_hr": 0.002, "per_gb_storage_hr": 0.00005},
    }
    expected = 2 * 0.35 + 16 * 0.003 + 64 * 0.002 + ASSUMPTIONS["storage_gb"] * 0.00005
    assert total_price(gpu, 2) == pytest.approx(expected)
    assert total_price({"price_per_hr": None}, 1) is None


def test_offers_from_locations(td) -> None:
    provider, _ = td
    offers = provider.search_offers(OfferQuery())
    assert offers and all(o.provider == "tensordock" and ":" in o.offer_id for o in offers)
    assert not any(o.offer_id.endswith(("l40-pcie-48gb", "rtx4000ada-pcie-20gb")) for o in offers)
    assert provider.search_offers(OfferQuery(interruptible=True)) == []


def test_launch_starts_the_runner_with_cloud_init(td) -> None:
    provider, fake = td
    offer = provider.search_offers(OfferQuery())[0]
    inst = provider.launch(
        LaunchRequest(job_id="td", offer=offer, image="img:2", env={"K": "v"}, disk_gb=150)
    )
    attrs = fake.last_body("create")["data"]["attributes"]
    assert attrs["name"] == "tunebot-td" and attrs["location_id"] == offer.offer_id.split(":")[0]
    assert attrs["resources"]["storage_gb"] == 150
    assert attrs["resources"]["gpus"] == {offer.offer_id.split(":", 1)[1]: {"count": 1}}
    assert any("docker run" in step and "img:2" in step for step in attrs["cloud_init"]["runcmd"])
    assert attrs["cloud_init"]["write_files"][0]["content"] == "K=v\n"
    assert provider.status(inst.instance_id).status in (InstanceStatus.provisioning, InstanceStatus.running)


def test_capacity_and_not_found(td) -> None:
    provider, fake = td
    offer = provider.search_offers(OfferQuery())[0]
    fake.inject("capacity")
    with pytest.raises(CapacityError):
        provider.launch(LaunchRequest(job_id="full", offer=offer, image="img"))
    with pytest.raises(NotFoundError):
        provider.status("00000000-0000-0000-0000-000000000000")
