"""An in-memory provider for engine tests: thread-safe, counts creates, prices and statuses settable."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime

from bot.planner.offer import Offer
from bot.planner.result import Estimate, MemoryEstimate, ModelInfo, RankedOffer, SpeedEstimate, TimeEstimate
from bot.providers.base import (
    Capabilities,
    CapacityError,
    Instance,
    InstanceStatus,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
    Volume,
)


class FakeProvider:
    """Runs nothing. By default it says its instances share the bot's disk (kind "process"), so that the
    storage rules for remote hosts (tests/engine/test_staging.py, the remote-host end-to-end test) stay out
    of the lifecycle tests; ``kind="container"`` makes it a remote host for those rules."""

    def __init__(
        self,
        name: str = "fake",
        *,
        price: float = 1.0,
        gpu: str = "rtx-4090",
        interruptible: bool = False,
        volumes: bool = False,
        kind: str = "process",
        gpu_count: int = 1,
        memory_gb: float = 24,
    ) -> None:
        self.name = name
        self.gpu_count = gpu_count
        self.memory_gb = memory_gb
        self.capabilities = Capabilities(interruptible=interruptible, volumes=volumes, kind=kind)
        self.price = price
        self.live_price: float | None = None
        self.gpu = gpu
        self.interruptible = interruptible
        self.instances: dict[str, Instance] = {}
        self.creates = 0
        self.machines = 1  # the hosts it sells (a marketplace: an offer a machine, <name>-1, <name>-2)
        self.terminates: list[str] = []
        self.capacity = True
        self.launch_requests: list[LaunchRequest] = []
        self.volumes: dict[str, Volume] = {}
        self.deleted_volumes: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def offer(self, offer_id: str | None = None) -> Offer:
        return Offer(
            provider=self.name,
            offer_id=offer_id or f"{self.name}-1",
            gpu=self.gpu,
            gpu_count=self.gpu_count,
            gpu_memory_gb=self.memory_gb,
            price_per_hour=self.price if self.live_price is None else self.live_price,
            interruptible=self.interruptible,
            reliability=0.99,
            source="live",
        )

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        return [self.offer(f"{self.name}-{i}") for i in range(1, self.machines + 1)]

    def quote(self, offer: Offer) -> Offer:
        if not self.capacity:
            raise CapacityError("gone", provider=self.name)
        return self.offer(offer.offer_id)

    def launch(self, request: LaunchRequest) -> Instance:
        with self._lock:
            for inst in self.instances.values():
                if inst.label == request.label and inst.status != InstanceStatus.terminated:
                    return inst
            if not self.capacity:
                raise CapacityError("no capacity", provider=self.name)
            self.creates += 1
            self.launch_requests.append(request)
            iid = f"{self.name}-i{next(self._ids)}"
            inst = Instance(
                provider=self.name,
                instance_id=iid,
                label=request.label,
                status=InstanceStatus.running,
                raw_status="running",
                price_per_hour=request.offer.price_per_hour,
                gpu=self.gpu,
                gpu_count=1,
                started_at=datetime.now(UTC),
            )
            self.instances[iid] = inst
            return inst

    def add_instance(
        self, label: str | None, status: InstanceStatus = InstanceStatus.running, price: float | None = None
    ) -> Instance:
        with self._lock:
            iid = f"{self.name}-x{next(self._ids)}"
            inst = Instance(
                provider=self.name,
                instance_id=iid,
                label=label,
                status=status,
                raw_status=str(status),
                price_per_hour=self.price if price is None else price,
            )
            self.instances[iid] = inst
            return inst

    def set_status(self, iid: str, status: InstanceStatus, exit_code: int | None = None) -> None:
        inst = self.instances[iid]
        inst.status, inst.raw_status, inst.exit_code = status, str(status), exit_code

    def status(self, instance_id: str) -> Instance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise NotFoundError("no such instance", provider=self.name)
        return inst

    def list_instances(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.status != InstanceStatus.terminated]

    def terminate(self, instance_id: str) -> None:
        with self._lock:
            inst = self.instances.pop(instance_id, None)
            if inst is not None:
                self.terminates.append(instance_id)

    def live(self) -> list[Instance]:
        return self.list_instances()

    def list_volumes(self) -> list[Volume]:
        return list(self.volumes.values())

    def delete_volume(self, volume_id: str) -> None:
        self.volumes.pop(volume_id, None)
        self.deleted_volumes.append(volume_id)

    def burn_rate(self) -> float | None:
        return None


def ranked(
    offer: Offer,
    *,
    hours: float = 1.0,
    labels: list[str] | None = None,
    checkpoint_minutes: float | None = None,
) -> RankedOffer:
    return RankedOffer(
        provider=offer.provider,
        offer_id=offer.offer_id,
        gpu=offer.gpu,
        gpu_count=offer.gpu_count,
        gpu_memory_gb=offer.gpu_memory_gb,
        interruptible=offer.interruptible,
        price_per_hour=offer.price_per_hour,
        hours=hours,
        total_cost=offer.price_per_hour * hours,
        compute_cost=offer.price_per_hour * hours,
        checkpoint_minutes=checkpoint_minutes,
        fits=True,
        reason="fits",
        labels=labels or [],
        reliability=offer.reliability,
        source=offer.source,
    )


def make_estimate(
    offers: list[Offer], *, hours: float = 1.0, checkpoint_minutes: float | None = None
) -> Estimate:
    """A planner answer ranking these offers (cheapest first), without running the planner."""
    ranked_offers = [
        ranked(o, hours=hours, checkpoint_minutes=checkpoint_minutes)
        for o in sorted(offers, key=lambda o: o.price_per_hour)
    ]
    if ranked_offers:
        ranked_offers[0].labels.append("cheapest")
        ranked_offers[0].labels.append("fastest")
        ranked_offers[-1].labels.append("safest")
    return Estimate(
        model=ModelInfo(
            name="tiny",
            architecture="llama",
            parameters=1000,
            active_parameters=1000,
            trainable_parameters=100,
            layers=2,
            hidden_size=64,
            vocab_size=512,
            source="built-in table",
        ),
        method="lora",
        memory=MemoryEstimate(per_gpu_gb=1.0, breakdown_gb={"weights": 1.0}, gpus=1, sharding="none"),
        speed=SpeedEstimate(
            gpu=offers[0].gpu if offers else "cpu",
            gpus=1,
            tokens_per_second=1000.0,
            step_seconds=1.0,
            mfu=0.3,
            flops_per_token=1e6,
        ),
        time=TimeEstimate(tokens=1000, epochs=1.0, steps=10, hours=hours, token_source="tokens="),
        offers=ranked_offers,
        assumptions=[],
        prices_as_of=datetime.now(UTC),
        prices_source="live",
    )
