"""One contract, every provider: each cloud in CLOUDS (against its fake server) and local."""

from __future__ import annotations

import inspect
import logging
import statistics
from dataclasses import fields

import pytest

from bot.planner.offer import GPU_NAMES
from bot.providers.base import (
    AuthError,
    Capabilities,
    CapacityError,
    InstanceStatus,
    NotFoundError,
    OfferQuery,
    Provider,
    ProviderError,
    Volume,
)
from bot.providers.lifecycle import ensure_launched
from bot.providers.registry import CLOUDS, provider_classes

from .conftest import FAKES, Harness

PROTOCOL_METHODS = [
    name for name, _ in inspect.getmembers(Provider, inspect.isfunction) if not name.startswith("_")
]


def test_every_provider_class_implements_the_whole_protocol() -> None:
    classes = provider_classes()
    assert set(classes) == {*CLOUDS, "local"} and {"vast", "runpod", "lambda", "tensordock"} <= set(CLOUDS)
    assert set(CLOUDS) <= set(FAKES), "every cloud in CLOUDS has a fake server in tests/fakes/clouds"
    for name, cls in classes.items():
        missing = [m for m in PROTOCOL_METHODS if not callable(getattr(cls, m, None))]
        assert not missing, f"{name} lacks {missing}"
        assert isinstance(cls.capabilities, Capabilities)
        assert cls.capabilities.kind in {"container", "vm", "process"}
        assert cls.name == name


def test_capabilities_are_declared(harness: Harness) -> None:
    assert isinstance(harness.provider, Provider)
    caps = harness.provider.capabilities
    assert {f.name for f in fields(caps)} >= {"interruptible", "volumes", "kind"}
    expected_kind = {
        "vast": "container",
        "runpod": "container",
        "lambda": "vm",
        "tensordock": "vm",
        "local": "process",
    }.get(harness.name)
    assert caps.kind == (expected_kind or caps.kind) and caps.kind in {"container", "vm", "process"}
    if harness.name in ("vast", "runpod", "lambda", "tensordock", "local"):
        # RunPod withdrew spot; the others never sold it
        assert caps.interruptible == (harness.name == "vast")
    if harness.name != "local":  # the snapshot sells only what the cloud sells
        snapshot = CLOUDS[harness.name].snapshot
        assert caps.interruptible or all(g[1] is None for g in snapshot.gpus.values())


def test_search_returns_normalized_offers_honouring_the_query(harness: Harness) -> None:
    p = harness.provider
    offers = p.search_offers(OfferQuery(interruptible=False))
    assert offers
    for o in offers:
        assert o.provider == harness.name
        assert o.gpu in GPU_NAMES or (harness.name == "local" and o.gpu == "cpu")
        assert o.gpu_count == 1 and o.price_per_hour > 0 and o.gpu_memory_gb > 0
        assert not o.interruptible and o.source == "live"
        assert o.reliability is None or o.reliability >= 0.95
    prices = [o.price_per_hour for o in offers]
    assert prices == sorted(prices)

    cap = statistics.median(prices)
    assert all(o.price_per_hour <= cap for o in p.search_offers(OfferQuery(max_price_per_hour=cap)))
    gpu = offers[-1].gpu
    same = p.search_offers(OfferQuery(gpu=gpu))
    assert same and all(o.gpu == gpu for o in same)
    big = p.search_offers(OfferQuery(min_gpu_memory_gb=40))
    assert all(o.gpu_memory_gb >= 40 for o in big)
    if harness.name != "local":
        assert big, "every fake sells some >= 40 GB card"
    if not p.capabilities.interruptible:
        assert p.search_offers(OfferQuery(interruptible=True)) == []


def test_launch_status_list_terminate_lifecycle(harness: Harness) -> None:
    p = harness.provider
    inst = p.launch(harness.request("contract-1", env={"TUNEBOT_JOB_SPEC": "{}"}))
    assert inst.label == "tunebot-contract-1" and inst.job_id == "contract-1"
    assert inst.status in (InstanceStatus.provisioning, InstanceStatus.running)
    seen = [p.status(inst.instance_id).status for _ in range(4)]
    assert seen[-1] == InstanceStatus.running, seen
    assert set(seen) <= {InstanceStatus.provisioning, InstanceStatus.running}
    listed = [i for i in p.list_instances() if i.label == "tunebot-contract-1"]
    assert [i.instance_id for i in listed] == [inst.instance_id]

    p.terminate(inst.instance_id)
    try:
        assert p.status(inst.instance_id).status == InstanceStatus.terminated
    except NotFoundError:
        pass
    assert all(i.instance_id != inst.instance_id for i in p.list_instances())
    p.terminate(inst.instance_id)  # already gone: a no-op, no error
    if harness.fake is not None:
        assert harness.fake.live_instances() == []


def test_launching_twice_with_the_same_job_label_gives_one_instance(harness: Harness) -> None:
    p = harness.provider
    request = harness.request("twice")
    first = p.launch(request)
    second = p.launch(request)
    third = ensure_launched(p, request, sleep=lambda s: None)
    assert first.instance_id == second.instance_id == third.instance_id
    assert len([i for i in p.list_instances() if i.label == request.label]) == 1
    if harness.fake is not None:
        assert harness.fake.max_live_per_label[request.label] == 1


def test_errors_are_typed(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    p = harness.provider
    with pytest.raises(NotFoundError):
        p.status("99999999")
    if harness.fake is None:
        return
    from fakes.clouds.fixtures import client_for

    stranger = client_for(harness.fake, api_key="wrong-key-123456")
    with pytest.raises(AuthError) as err:
        stranger.search_offers(OfferQuery())
    assert "wrong-key-123456" not in str(err.value)
    harness.fake.inject("capacity")
    with pytest.raises(CapacityError):
        p.launch(harness.request("no-room"))
    harness.fake.inject("429", times=2)
    harness.fake.inject("503")
    assert p.search_offers(OfferQuery())  # idempotent calls ride out 429 bursts and 5xx
    harness.fake.inject("500", times=50)
    with pytest.raises(ProviderError) as down:
        p.list_instances()
    assert harness.fake.api_key not in str(down.value)
    assert caplog.records, "retries are logged"
    assert all(harness.fake.api_key not in r.getMessage() for r in caplog.records)


def test_volumes_list_and_delete_where_supported(harness: Harness) -> None:
    p = harness.provider
    assert p.list_volumes() == [] if not p.capabilities.volumes else isinstance(p.list_volumes(), list)
    p.delete_volume("does-not-exist")  # missing is done, everywhere
    if not p.capabilities.volumes:
        return
    create = {
        "vast": lambda: p.create_volume(name="ckpt", size_gb=50, offer_id=harness.offer().offer_id),
        "runpod": lambda: p.create_volume(name="ckpt", size_gb=50, data_center_id="EU-RO-1"),
        "lambda": lambda: p.create_volume(name="ckpt", region="us-east-1"),
    }.get(harness.name)
    if create is None:  # a newer cloud: creating volumes takes cloud-specific arguments
        return
    volume_id = create()
    volumes = p.list_volumes()
    assert [v.volume_id for v in volumes] == [volume_id]
    vol = volumes[0]
    assert isinstance(vol, Volume) and vol.name == "ckpt" and vol.size_gb > 0 and vol.price_per_gb_month > 0
    assert not vol.attached and vol.cost_per_month > 0
    p.delete_volume(volume_id)
    assert p.list_volumes() == []
    p.delete_volume(volume_id)


def test_burn_rate_where_reported(harness: Harness) -> None:
    p = harness.provider
    inst = p.launch(harness.request("burn"))
    locked = p.status(inst.instance_id).price_per_hour
    rate = p.burn_rate()
    if not p.capabilities.burn_rate:
        assert rate is None
        return
    assert rate == pytest.approx(locked) and rate == pytest.approx(inst.price_per_hour, rel=0.05)
