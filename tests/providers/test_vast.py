"""Vast.ai quirks: dict-shaped status, outbid = preempted, refused-but-created launches, pagination."""

from __future__ import annotations

import pytest
from fakes.clouds import FakeVast
from fakes.clouds.fixtures import client_for

from bot.providers.base import CapacityError, InstanceStatus, LaunchRequest, NotFoundError, OfferQuery
from bot.providers.vast import offer_from_vast, search_body, vast_status


@pytest.fixture
def vast(fake_vast: FakeVast):
    return client_for(fake_vast), fake_vast


def _request(provider, job: str, **kw) -> LaunchRequest:
    offer = provider.search_offers(OfferQuery(interruptible=kw.pop("interruptible", False)))[0]
    return LaunchRequest(job_id=job, offer=offer, image="img:1", env={"TUNEBOT_JOB_SPEC": "{}"}, **kw)


def test_search_body_follows_the_documented_shape(vast) -> None:
    provider, fake = vast
    provider.search_offers(
        OfferQuery(gpu="rtx-4090", min_inet_down_mbps=128, min_disk_gb=100, interruptible=True)
    )
    body = fake.last_body("search")
    assert body["type"] == "bid" and body["gpu_name"] == {"in": ["RTX 4090"]}
    assert body["reliability2"] == {"gte": 0.95} and body["inet_down"] == {"gte": 128}
    assert body["verified"] == {"eq": True} and body["rented"] == {"eq": False}
    assert body["order"] == [["dph_total", "asc"]] and body["allocated_storage"] == 100
    assert search_body(OfferQuery(), "on-demand")["type"] == "on-demand"


def test_offer_normalization_units_names_and_nulls() -> None:
    item = {
        "id": 7,
        "gpu_name": "RTX 4090",
        "num_gpus": 2,
        "gpu_ram": 24564,
        "dph_base": 0.7,
        "dph_total": 0.75,
        "min_bid": 0.3,
        "reliability2": None,
        "geolocation": None,
        "inet_down": None,
        "storage_cost": 0.1,
    }
    od = offer_from_vast(item, interruptible=False)
    assert (
        od
        and od.gpu == "rtx-4090"
        and od.gpu_memory_gb == pytest.approx(25.76, abs=0.01)
        and od.gpu_count == 2
    )
    assert od.price_per_hour == 0.7 and od.reliability is None and od.storage_per_gb_month == 0.1
    spot = offer_from_vast(item, interruptible=True)
    assert spot and spot.price_per_hour == 0.3 and spot.interruptible and spot.preemptions_per_hour > 0
    assert offer_from_vast({**item, "gpu_name": "RTX 3060"}, interruptible=False) is None  # unknown card
    assert offer_from_vast({**item, "min_bid": None}, interruptible=True) is None
    a100 = offer_from_vast({**item, "gpu_name": "A100 SXM4", "gpu_ram": 81920}, interruptible=False)
    assert a100 and a100.gpu == "a100-80gb"


def test_unknown_gpus_are_dropped_and_reliability_is_honoured(vast) -> None:
    provider, fake = vast
    offers = provider.search_offers(OfferQuery(min_reliability=0.0))
    assert offers and {o.gpu for o in offers} <= {
        "rtx-3090",
        "rtx-4090",
        "rtx-a6000",
        "rtx-6000-ada",
        "l40s",
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200",
    }
    assert all(
        o.reliability is None or o.reliability >= 0.99
        for o in provider.search_offers(OfferQuery(min_reliability=0.99))
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"actual_status": None}, InstanceStatus.provisioning),
        ({"actual_status": "loading"}, InstanceStatus.provisioning),
        ({"actual_status": "running"}, InstanceStatus.running),
        ({"actual_status": "exited"}, InstanceStatus.exited),
        ({"actual_status": "offline"}, InstanceStatus.exited),
        ({"actual_status": "unknown"}, InstanceStatus.exited),
        ({"actual_status": "something-new"}, InstanceStatus.unknown),
        (
            {
                "actual_status": "exited",
                "cur_state": "stopped",
                "intended_status": "stopped",
                "next_state": "stopped",
            },
            InstanceStatus.preempted,
        ),
    ],
)
def test_status_map(fields: dict, expected: InstanceStatus) -> None:
    assert vast_status(fields)[0] == expected


def test_outbid_instance_reads_as_preempted_with_the_raw_status_kept(vast) -> None:
    provider, fake = vast
    inst = provider.launch(_request(provider, "spot", interruptible=True))
    fake.preempt(inst.instance_id)
    seen = provider.status(inst.instance_id)
    assert seen.status == InstanceStatus.preempted and "outbid" in seen.raw_status
    fake.crash(inst.instance_id, "offline")
    fake.instances[inst.instance_id]["intended_status"] = "running"
    assert provider.status(inst.instance_id).status == InstanceStatus.exited


def test_missing_instance_answers_null_and_reads_as_not_found(vast) -> None:
    provider, _ = vast
    with pytest.raises(NotFoundError):
        provider.status("424242")
    provider.terminate("424242")  # "no_such_instance" = already gone


def test_refused_launch_that_created_a_contract_is_destroyed(vast) -> None:
    provider, fake = vast
    request = _request(provider, "lowbid", interruptible=True)
    request.bid_per_hour = 0.0001  # below min_bid: Vast answers success=false *with* new_contract
    with pytest.raises(CapacityError, match="invalid_price"):
        provider.launch(request)
    assert fake.created_total == 1 and fake.live_instances() == []


def test_launch_sends_label_env_image_and_bid(vast) -> None:
    provider, fake = vast
    request = _request(provider, "body", interruptible=True)
    provider.launch(request)
    body = fake.last_body("create")
    assert body["label"] == "tunebot-body" and body["image"] == "img:1"
    assert body["env"] == {"TUNEBOT_JOB_SPEC": "{}"} and body["price"] == pytest.approx(
        request.offer.price_per_hour
    )
    provider.launch(_request(provider, "ondemand"))
    assert "price" not in fake.last_body("create")


def test_gone_offer_is_a_capacity_error(vast) -> None:
    provider, fake = vast
    fake.inject("capacity")
    with pytest.raises(CapacityError):
        provider.launch(_request(provider, "gone"))


def test_list_follows_next_token_through_every_page(vast) -> None:
    provider, fake = vast
    ids = {provider.launch(_request(provider, f"page{k}")).instance_id for k in range(12)}
    before = fake.count("list")
    assert {i.instance_id for i in provider.list_instances()} == ids
    assert fake.count("list") - before == 3  # page size 5: 5 + 5 + 2


def test_burn_rate_sums_dph_total_of_every_instance(vast) -> None:
    provider, fake = vast
    for k in range(3):
        provider.launch(_request(provider, f"b{k}"))
    assert provider.burn_rate() == pytest.approx(sum(i["dph_total"] for i in fake.instances.values()))
