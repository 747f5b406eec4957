"""Lambda Cloud quirks: cents, parsed descriptions, empty regions, error codes, terminate only."""

from __future__ import annotations

import pytest
from fakes.clouds import FakeLambda
from fakes.clouds.fixtures import client_for

from bot.providers.base import (
    AuthError,
    CapacityError,
    InstanceStatus,
    InvalidRequestError,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
)
from bot.providers.lambda_cloud import parse_description


@pytest.fixture
def lam(fake_lambda: FakeLambda):
    return client_for(fake_lambda), fake_lambda


def test_parse_description() -> None:
    assert parse_description("1x A100 (40 GB SXM4)") == (1, "A100 SXM4", 40.0)
    assert parse_description("8x H100 (80 GB SXM5)") == (8, "H100 SXM5", 80.0)
    assert parse_description("1x A6000 (48 GB)") == (1, "A6000", 48.0)
    assert parse_description("CPU only") is None and parse_description(None) is None


def test_offers_in_dollars_per_region_with_capacity_only(lam) -> None:
    provider, _ = lam
    offers = provider.search_offers(OfferQuery(min_reliability=0.0))
    by_id = {o.offer_id: o for o in offers}
    assert by_id["gpu_1x_a100@us-east-1"].price_per_hour == pytest.approx(1.29)  # 129 cents
    assert by_id["gpu_1x_a100@us-east-1"].gpu == "a100-40gb"
    assert {"gpu_1x_h100_pcie@us-west-3", "gpu_1x_h100_pcie@us-south-1"} <= set(by_id)
    assert not any(k.startswith("gpu_8x_h100_sxm5") for k in by_id)  # empty regions = no capacity
    assert not any(k.startswith(("gpu_1x_rtx6000", "gpu_1x_a10@", "gpu_1x_gh200")) for k in by_id)
    eight = provider.search_offers(OfferQuery(gpu_count=8))
    assert [o.offer_id for o in eight] == ["gpu_8x_a100_80gb_sxm4@us-east-1"]
    assert eight[0].gpu == "a100-80gb" and eight[0].price_per_hour == pytest.approx(14.32)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("global/invalid-api-key", AuthError),
        ("instance-operations/launch/insufficient-capacity", CapacityError),
        ("global/quota-exceeded", CapacityError),
        ("global/object-does-not-exist", NotFoundError),
        ("global/something-new", InvalidRequestError),
    ],
)
def test_error_codes_decide_the_error_type(lam, code: str, expected: type) -> None:
    provider, fake = lam
    offer = provider.search_offers(OfferQuery())[0]
    fake.inject_response(400, {"error": {"code": code, "message": "m", "suggestion": None}}, ops={"create"})
    with pytest.raises(expected):
        provider.launch(LaunchRequest(job_id="codes", offer=offer, image="img"))


def test_launch_uses_cloud_init_user_data_and_the_label_as_name(lam) -> None:
    provider, fake = lam
    offer = provider.search_offers(OfferQuery())[0]
    inst = provider.launch(
        LaunchRequest(
            job_id="vm",
            offer=offer,
            image="ghcr.io/x/runner:1",
            env={"TUNEBOT_JOB_SPEC": '{"job_id": "vm"}'},
            command=["tunebot-runner"],
        )
    )
    body = fake.last_body("create")
    assert body["name"] == "tunebot-vm" and body["quantity"] == 1
    assert body["instance_type_name"] + "@" + body["region_name"] == offer.offer_id
    ud = body["user_data"]
    assert ud.startswith("#cloud-config") and "docker run" in ud and "ghcr.io/x/runner:1 tunebot-runner" in ud
    assert "--env-file /etc/tunebot/runner.env" in ud and "TUNEBOT_JOB_SPEC=" in ud
    assert provider.status(inst.instance_id).status == InstanceStatus.provisioning
    assert provider.status(inst.instance_id).status == InstanceStatus.running


def test_terminate_waits_through_terminating_until_gone(lam) -> None:
    provider, fake = lam
    fake.gone_polls = 2
    offer = provider.search_offers(OfferQuery())[0]
    inst = provider.launch(LaunchRequest(job_id="bye", offer=offer, image="img"))
    provider.terminate(inst.instance_id)
    assert fake.instances.get(inst.instance_id, {"status": "terminated"})["status"] == "terminated"
    assert fake.count("status") >= 3  # terminating, terminating, terminated
    provider.terminate(inst.instance_id)


def test_no_capacity_in_region_is_a_capacity_error(lam) -> None:
    provider, fake = lam
    offer = provider.search_offers(OfferQuery())[0]
    for t in fake.offers:  # sold out between the search and the launch
        t["regions"] = []
    with pytest.raises(CapacityError):
        provider.launch(LaunchRequest(job_id="nocap", offer=offer, image="img"))
