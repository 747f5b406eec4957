"""TensorDock v2: marketplace VMs; the runner container starts from ``cloud_init`` runcmd.

THE LEAST CERTAIN CLIENT of the four: dstack and SkyPilot dropped their TensorDock backends, the v2
docs are thin, and the total price is inferred from field names. Every assumption lives in
``ASSUMPTIONS`` / the helpers right below it, so correcting one is a one-line change. No spot, no
volume API in v2.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

from bot.planner.offer import Offer
from bot.providers import cloud_init
from bot.providers.base import (
    AuthError,
    Capabilities,
    CapacityError,
    Instance,
    InstanceStatus,
    InvalidRequestError,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
    ProviderError,
    Volume,
)
from bot.providers.common import CloudProvider, finish_search, map_status
from bot.providers.gpus import gpu_memory, normalize_gpu
from bot.providers.spec import CloudSpec, Snapshot

# --- every TensorDock assumption, in one place -----------------------------------------------------
ASSUMPTIONS = {
    # Resources we rent next to each GPU (capped by the location's max_*), priced per the location.
    "vcpus_per_gpu": 8,
    "ram_gb_per_gpu": 32,
    "storage_gb": 100,  # the API's minimum
    "image": "ubuntu2404",
    # Total $/h = gpus*price_per_hr + vcpu*per_vcpu_hr + ram*per_gb_ram_hr + storage*per_gb_storage_hr
    # (inferred from the field names in GET /locations, not documented as such).
    # Responses: objects may come wrapped in {"data": ...}; lists as {"data": {"instances": [...]}} or
    # {"data": [...]}; both are accepted.
    # Errors: {"error": "..."} or {"message": "..."}; a 4xx whose text mentions capacity/availability
    # is a CapacityError.
}

STATUS_MAP: dict[str | None, InstanceStatus] = {
    "pending": InstanceStatus.provisioning,
    "creating": InstanceStatus.provisioning,
    "starting": InstanceStatus.provisioning,
    "running": InstanceStatus.running,
    "stopping": InstanceStatus.stopped,
    "stopped": InstanceStatus.stopped,
    "deleting": InstanceStatus.stopped,
    "deleted": InstanceStatus.terminated,
    "terminated": InstanceStatus.terminated,
    "error": InstanceStatus.exited,
}

_CAPACITY_WORDS = ("capacity", "no available", "not available", "insufficient", "out of stock", "unavailable")


def resources_for(gpu: dict[str, Any], count: int) -> dict[str, int]:
    res = gpu.get("resources") or {}
    vcpu = ASSUMPTIONS["vcpus_per_gpu"] * count
    ram = ASSUMPTIONS["ram_gb_per_gpu"] * count
    if res.get("max_vcpus"):
        vcpu = min(vcpu, int(res["max_vcpus"]))
    if res.get("max_ram_gb"):
        ram = min(ram, int(res["max_ram_gb"]))
    return {"vcpu_count": vcpu, "ram_gb": ram, "storage_gb": ASSUMPTIONS["storage_gb"]}


def total_price(gpu: dict[str, Any], count: int) -> float | None:
    """$/h for count GPUs plus the vCPU / RAM / storage we rent with them (see ASSUMPTIONS)."""
    per_gpu = gpu.get("price_per_hr")
    if per_gpu is None:
        return None
    pricing = gpu.get("pricing") or {}
    res = resources_for(gpu, count)
    return round(
        count * float(per_gpu)
        + res["vcpu_count"] * float(pricing.get("per_vcpu_hr") or 0.0)
        + res["ram_gb"] * float(pricing.get("per_gb_ram_hr") or 0.0)
        + res["storage_gb"] * float(pricing.get("per_gb_storage_hr") or 0.0),
        6,
    )


def _unwrap(body: Any) -> Any:
    return body.get("data", body) if isinstance(body, dict) else body


def offers_from_locations(
    locations: list[dict[str, Any]], count: int, now: datetime | None = None
) -> list[Offer]:
    offers = []
    for loc in locations:
        place = ", ".join(
            str(x) for x in (loc.get("city"), loc.get("stateprovince"), loc.get("country")) if x
        )
        for gpu in loc.get("gpus") or []:
            v0 = gpu.get("v0Name") or ""
            canonical = normalize_gpu(v0) or normalize_gpu(gpu.get("displayName"))
            if canonical is None or (gpu.get("max_count") or 0) < count:
                continue
            price = total_price(gpu, count)
            if price is None:
                continue
            storage_hr = float((gpu.get("pricing") or {}).get("per_gb_storage_hr") or 0.0)
            max_storage = (gpu.get("resources") or {}).get("max_storage_gb")
            try:
                offers.append(
                    Offer(
                        provider="tensordock",
                        offer_id=f"{loc.get('id')}:{v0}",
                        gpu=canonical,
                        gpu_count=count,
                        gpu_memory_gb=gpu_memory(canonical),
                        price_per_hour=price,
                        interruptible=False,
                        reliability=None,
                        location=place or None,
                        storage_per_gb_month=round(storage_hr * 730, 4),
                        max_disk_gb=float(max_storage) if isinstance(max_storage, int | float) else None,
                        source="live",
                        as_of=now,
                        raw=gpu,
                    )
                )
            except (ValidationError, TypeError, ValueError):
                continue
    return offers


class TensorDockProvider(CloudProvider):
    name = "tensordock"
    capabilities = Capabilities(interruptible=False, volumes=False, kind="vm", stop=True, burn_rate=False)

    def __init__(self, *, ssh_public_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ssh_public_key = ssh_public_key

    def _map_error(self, response: httpx.Response) -> ProviderError | None:
        code = response.status_code
        if code in (401, 403):
            return AuthError(f"tensordock: the API key was rejected (HTTP {code})", provider=self.name)
        if code == 429 or code >= 500:
            return None
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text}
        message = ""
        if isinstance(body, dict):
            err = body.get("error") or body.get("message") or body.get("detail") or ""
            message = str(err.get("message") if isinstance(err, dict) else err)[:200]
        if code == 404:
            return NotFoundError(f"tensordock: not found: {message}", provider=self.name)
        if any(w in message.lower() for w in _CAPACITY_WORDS):
            return CapacityError(f"tensordock: {message}", provider=self.name)
        return InvalidRequestError(f"tensordock: HTTP {code}: {message}", provider=self.name)

    # -- offers ------------------------------------------------------------------------------------
    def _locations(self) -> list[dict[str, Any]]:
        data = _unwrap(self.http.json("GET", "/locations", idempotent=True)) or {}
        return data.get("locations") or [] if isinstance(data, dict) else list(data)

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        if query.interruptible is True:
            return []
        return finish_search(
            offers_from_locations(self._locations(), query.gpu_count, datetime.now(UTC)), query
        )

    def quote(self, offer: Offer) -> Offer:
        for live in offers_from_locations(self._locations(), offer.gpu_count, datetime.now(UTC)):
            if live.offer_id == offer.offer_id:
                return live
        raise CapacityError(
            f"tensordock: {offer.offer_id} x{offer.gpu_count} is not available now", provider=self.name
        )

    # -- instances ---------------------------------------------------------------------------------
    def _instance(self, item: dict[str, Any]) -> Instance:
        raw = item.get("status")
        return Instance(
            provider=self.name,
            instance_id=str(item.get("id")),
            label=item.get("name"),
            status=map_status(raw, STATUS_MAP),
            raw_status=raw,
            price_per_hour=item.get("rateHourly"),
            ip=item.get("ipAddress"),
        )

    def launch(self, request: LaunchRequest) -> Instance:
        existing = self.find_by_label(request.label)
        if existing:
            return existing[0]
        if request.bid_per_hour is not None or request.volume_id:
            raise InvalidRequestError("tensordock: no spot and no volumes in the v2 API", provider=self.name)
        offer = request.offer
        location_id, _, v0 = offer.offer_id.partition(":")
        gpu_info = (offer.raw or {}) if offer.raw else {}
        resources = resources_for(gpu_info, offer.gpu_count)
        resources["storage_gb"] = max(resources["storage_gb"], request.disk_gb)
        attributes: dict[str, Any] = {
            "name": request.label,
            "type": "virtualmachine",
            "image": ASSUMPTIONS["image"],
            "resources": {**resources, "gpus": {v0: {"count": offer.gpu_count}}},
            "location_id": location_id,
            "useDedicatedIp": False,
            "cloud_init": cloud_init.cloud_init_dict(request.image, request.env, request.command),
        }
        if self.ssh_public_key:
            attributes["ssh_key"] = self.ssh_public_key
        body = {"data": {"type": "virtualmachine", "attributes": attributes}}
        data = _unwrap(self.http.json("POST", "/instances", json=body, idempotent=False)) or {}
        iid = data.get("id") if isinstance(data, dict) else None
        if not iid:
            raise InvalidRequestError(
                "tensordock: create answered without an instance id", provider=self.name
            )
        return Instance(
            provider=self.name,
            instance_id=str(iid),
            label=request.label,
            status=map_status(data.get("status"), STATUS_MAP)
            if data.get("status")
            else InstanceStatus.provisioning,
            raw_status=data.get("status"),
            price_per_hour=offer.price_per_hour,
            gpu=offer.gpu,
            gpu_count=offer.gpu_count,
            started_at=datetime.now(UTC),
        )

    def status(self, instance_id: str) -> Instance:
        data = _unwrap(self.http.json("GET", f"/instances/{instance_id}", idempotent=True))
        if not data:
            raise NotFoundError(f"tensordock: instance {instance_id} not found", provider=self.name)
        data.setdefault("id", instance_id)
        return self._instance(data)

    def list_instances(self) -> list[Instance]:
        data = _unwrap(self.http.json("GET", "/instances", idempotent=True))
        items = data.get("instances") or [] if isinstance(data, dict) else list(data or [])
        return self._live(self._instance(i) for i in items if self._ours(i.get("name")))

    def _terminate_call(self, instance_id: str) -> None:
        self.http.request("DELETE", f"/instances/{instance_id}", idempotent=True)

    def burn_rate(self) -> float | None:
        return None  # no billing endpoint in v2

    def list_volumes(self) -> list[Volume]:
        return []

    def delete_volume(self, volume_id: str) -> None:
        return None  # no volumes exist here


CLOUD = CloudSpec(
    name="tensordock",
    client=TensorDockProvider,
    key_env="TENSORDOCK_API_KEY",
    url_env="TENSORDOCK_API_URL",
    default_url="https://dashboard.tensordock.com/api/v2",
    min_interval_s=0.6,
    rate_limit="100 requests/min per organization",
    snapshot=Snapshot(
        date="2026-11-20",
        gpus={  # on-demand VMs $/GPU-h
            "rtx-3090": (0.22, None),
            "rtx-4090": (0.37, None),
            "rtx-a6000": (0.47, None),
            "rtx-6000-ada": (0.72, None),
            "l40s": (0.95, None),
            "a100-80gb": (1.25, None),
            "h100-80gb": (2.25, None),
        },
        storage_per_gb_month=0.05,
        egress_per_gb=0.0,
        reliability=0.975,
        inet_down_mbps=1000,
        preemptions_per_hour=0.0,
        location="marketplace",
        note="on-demand VMs only",
    ),
)
