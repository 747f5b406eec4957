"""Acme GPU Cloud: a made-up cloud, written the way a new cloud is added to tunebot.

This file and its line in CLOUDS (bot/providers/registry.py) are all tunebot needs: dropped into
bot/providers/ (tests/providers/test_new_cloud.py puts its folder on the package's path instead) and listed
there, it is priced live and from its snapshot, configured from ACME_API_KEY / ACME_API_URL and launchable.
Its fake server is fake_acme.py, dropped into tests/fakes/clouds/ the same way. API: GET /v1/machines
(every size, one URL), POST /v1/instances, GET /v1/instances[/{id}], DELETE /v1/instances/{id}.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bot.planner.offer import Offer
from bot.providers.base import (
    Capabilities,
    CapacityError,
    Instance,
    InstanceStatus,
    LaunchRequest,
    OfferQuery,
    Volume,
)
from bot.providers.common import CloudProvider, finish_search, map_status
from bot.providers.gpus import gpu_memory, normalize_gpu
from bot.providers.spec import CloudSpec, Snapshot

STATUS_MAP: dict[str | None, InstanceStatus] = {
    "starting": InstanceStatus.provisioning,
    "running": InstanceStatus.running,
    "deleting": InstanceStatus.stopped,
    "deleted": InstanceStatus.terminated,
}


class AcmeProvider(CloudProvider):
    name = "acme"
    capabilities = Capabilities(interruptible=False, volumes=False, kind="container", stop=False)

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        now = datetime.now(UTC)
        offers = []
        for m in (self.http.json("GET", "/v1/machines", idempotent=True) or {}).get("machines") or []:
            gpu = normalize_gpu(m.get("gpu"))
            if gpu is None:
                continue
            offers.append(
                Offer(
                    provider=self.name,
                    offer_id=str(m["id"]),
                    gpu=gpu,
                    gpu_count=int(m["gpus"]),
                    gpu_memory_gb=gpu_memory(gpu),
                    price_per_hour=float(m["usd_per_hour"]),
                    interruptible=False,
                    reliability=None,
                    location=m.get("region"),
                    source="live",
                    as_of=now,
                )
            )
        return finish_search(offers, query)

    def _instance(self, item: dict[str, Any]) -> Instance:
        return Instance(
            provider=self.name,
            instance_id=str(item["id"]),
            label=item.get("name"),
            status=map_status(item.get("state"), STATUS_MAP),
            raw_status=item.get("state"),
            price_per_hour=item.get("usd_per_hour"),
        )

    def launch(self, request: LaunchRequest) -> Instance:
        existing = self.find_by_label(request.label)
        if existing:
            return existing[0]
        body = {
            "machine": request.offer.offer_id,
            "name": request.label,
            "image": request.image,
            "env": dict(request.env),
            "command": list(request.command or []),
        }
        data = self.http.json("POST", "/v1/instances", json=body, idempotent=False) or {}
        if data.get("error") == "sold_out":
            raise CapacityError(f"acme: {request.offer.offer_id} is sold out", provider=self.name)
        return self._instance(data)

    def status(self, instance_id: str) -> Instance:
        return self._instance(self.http.json("GET", f"/v1/instances/{instance_id}", idempotent=True))

    def list_instances(self) -> list[Instance]:
        items = (self.http.json("GET", "/v1/instances", idempotent=True) or {}).get("instances") or []
        return self._live(self._instance(i) for i in items if self._ours(i.get("name")))

    def _terminate_call(self, instance_id: str) -> None:
        self.http.request("DELETE", f"/v1/instances/{instance_id}", idempotent=True)

    def list_volumes(self) -> list[Volume]:
        return []

    def delete_volume(self, volume_id: str) -> None:
        return None

    def burn_rate(self) -> float | None:
        return None


CLOUD = CloudSpec(
    name="acme",
    client=AcmeProvider,
    key_env="ACME_API_KEY",
    url_env="ACME_API_URL",
    default_url="https://api.acme-gpu.example/",
    min_interval_s=0.5,
    rate_limit="2 requests/s",
    snapshot=Snapshot(
        date="2026-11-25",
        gpus={"rtx-4090": (0.15, None), "h100-80gb": (1.49, None, (1, 8))},
        storage_per_gb_month=0.05,
        egress_per_gb=0.0,
        reliability=0.99,
        preemptions_per_hour=0.0,
        location="eu",
        note="on-demand containers",
    ),
)
