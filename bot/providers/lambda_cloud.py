"""Lambda Cloud: on-demand VMs with datacenter GPUs; the runner container starts from ``user_data``.

Quirks handled here (see docs/providers.md): prices are in cents per hour; the GPU name and memory
are parsed from the description ("1x A100 (40 GB SXM4)"); an empty regions list means no capacity
now; errors carry ``error.code`` (branch on it, not on the HTTP status); there is no stop, only
terminate; file systems are the volumes.
"""

from __future__ import annotations

import re
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
    ProviderDownError,
    ProviderError,
    RateLimitedError,
    Volume,
)
from bot.providers.common import CloudProvider, finish_search, map_status
from bot.providers.gpus import gpu_memory, normalize_gpu
from bot.providers.spec import CloudSpec, Snapshot

STATUS_MAP: dict[str | None, InstanceStatus] = {
    "booting": InstanceStatus.provisioning,
    "active": InstanceStatus.running,
    "unhealthy": InstanceStatus.unknown,
    "terminating": InstanceStatus.stopped,  # not billing much longer, but not confirmed gone
    "terminated": InstanceStatus.terminated,
    "preempted": InstanceStatus.preempted,
}

FILE_SYSTEM_PRICE_PER_GB_MONTH = 0.20  # billed per GiB used
_DESCRIPTION = re.compile(r"^\s*(\d+)\s*x\s*(.+?)\s*\((\d+(?:\.\d+)?)\s*GB\b[^)]*\)", re.IGNORECASE)

# error.code -> typed error (docs/providers.md: branch on the code).
ERROR_CODES: dict[str, type[ProviderError]] = {
    "global/invalid-api-key": AuthError,
    "global/unauthorized": AuthError,
    "global/object-does-not-exist": NotFoundError,
    "global/quota-exceeded": CapacityError,
    "instance-operations/launch/insufficient-capacity": CapacityError,
    "global/rate-limited": RateLimitedError,
    "global/invalid-parameters": InvalidRequestError,
    "global/internal-error": ProviderDownError,
}


def parse_description(description: str | None) -> tuple[int, str, float] | None:
    """("1x A100 (40 GB SXM4)") -> (1, "A100 SXM4", 40.0); None when unparseable."""
    if not description:
        return None
    m = _DESCRIPTION.match(description)
    if not m:
        return None
    count, name, mem = int(m.group(1)), m.group(2), float(m.group(3))
    variant = description[m.end(3) :].split(")")[0].replace("GB", "").strip()
    return count, f"{name} {variant}".strip(), mem


def offers_from_instance_types(data: dict[str, Any], now: datetime | None = None) -> list[Offer]:
    offers = []
    for type_name, entry in (data or {}).items():
        itype = entry.get("instance_type") or {}
        parsed = parse_description(itype.get("description") or itype.get("gpu_description"))
        cents = itype.get("price_cents_per_hour")
        if parsed is None or cents is None:
            continue
        count, name, mem = parsed
        gpu = normalize_gpu(name, mem)
        if gpu is None:
            continue
        gib = (itype.get("specs") or {}).get("storage_gib")  # fixed per type: no disk field at launch
        max_disk = round(float(gib) * 2**30 / 1e9, 1) if isinstance(gib, int | float) else None
        for region in entry.get("regions_with_capacity_available") or []:  # empty = no capacity now
            try:
                offers.append(
                    Offer(
                        provider="lambda",
                        offer_id=f"{itype.get('name') or type_name}@{region['name']}",
                        gpu=gpu,
                        gpu_count=count,
                        gpu_memory_gb=gpu_memory(gpu, mem),
                        price_per_hour=round(cents / 100.0, 6),  # cents per hour
                        interruptible=False,
                        reliability=None,
                        location=region.get("description") or region["name"],
                        storage_per_gb_month=FILE_SYSTEM_PRICE_PER_GB_MONTH,
                        max_disk_gb=max_disk,
                        source="live",
                        as_of=now,
                        raw=entry,
                    )
                )
            except (ValidationError, TypeError, ValueError, KeyError):
                continue
    return offers


class LambdaProvider(CloudProvider):
    name = "lambda"
    capabilities = Capabilities(interruptible=False, volumes=True, kind="vm", stop=False, burn_rate=True)

    def __init__(self, *, ssh_key_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ssh_key_name = ssh_key_name

    def _map_error(self, response: httpx.Response) -> ProviderError | None:
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("code"):
            code = str(error["code"])
            cls = ERROR_CODES.get(code)
            if cls is None:
                if response.status_code == 429 or response.status_code >= 500:
                    return None  # let the status decide (retryable)
                cls = InvalidRequestError
            message = str(error.get("message") or "")[:200]
            return cls(f"lambda: {code}: {message}", provider=self.name)
        if response.status_code in (401, 403):
            return AuthError(
                f"lambda: the API key was rejected (HTTP {response.status_code})", provider=self.name
            )
        return None

    # -- offers ------------------------------------------------------------------------------------
    def _types(self) -> dict[str, Any]:
        return (self.http.json("GET", "/instance-types", idempotent=True) or {}).get("data") or {}

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        if query.interruptible is True:
            return []
        return finish_search(offers_from_instance_types(self._types(), datetime.now(UTC)), query)

    def quote(self, offer: Offer) -> Offer:
        for live in offers_from_instance_types(self._types(), datetime.now(UTC)):
            if live.offer_id == offer.offer_id:
                return live
        raise CapacityError(f"lambda: no capacity for {offer.offer_id} now", provider=self.name)

    # -- instances ---------------------------------------------------------------------------------
    def _instance(self, item: dict[str, Any]) -> Instance:
        raw = item.get("status")
        itype = item.get("instance_type") or {}
        cents = itype.get("price_cents_per_hour")
        parsed = parse_description(itype.get("description"))
        return Instance(
            provider=self.name,
            instance_id=str(item.get("id")),
            label=item.get("name"),
            status=map_status(raw, STATUS_MAP),
            raw_status=raw,
            price_per_hour=cents / 100.0 if cents is not None else None,
            gpu=normalize_gpu(parsed[1], parsed[2]) if parsed else None,
            gpu_count=parsed[0] if parsed else None,
            ip=item.get("ip"),
        )

    def launch(self, request: LaunchRequest) -> Instance:
        existing = self.find_by_label(request.label)
        if existing:
            return existing[0]
        if request.bid_per_hour is not None:
            raise InvalidRequestError("lambda: no interruptible capacity", provider=self.name)
        type_name, _, region = request.offer.offer_id.partition("@")
        body: dict[str, Any] = {
            "region_name": region,
            "instance_type_name": type_name,
            "quantity": 1,
            "name": request.label,
            "user_data": cloud_init.user_data(request.image, request.env, request.command),
        }
        if self.ssh_key_name:
            body["ssh_key_names"] = [self.ssh_key_name]
        if request.volume_id:  # the API attaches by name; our volume ids are file-system ids
            names = [v.name for v in self.list_volumes() if request.volume_id in (v.volume_id, v.name)]
            if not names:
                raise NotFoundError(f"lambda: file system {request.volume_id} not found", provider=self.name)
            body["file_system_names"] = names[:1]
        data = self.http.json("POST", "/instance-operations/launch", json=body, idempotent=False) or {}
        ids = (data.get("data") or {}).get("instance_ids") or []
        if not ids:
            raise CapacityError(
                f"lambda: launch of {type_name} in {region} created nothing", provider=self.name
            )
        return Instance(
            provider=self.name,
            instance_id=str(ids[0]),
            label=request.label,
            status=InstanceStatus.provisioning,
            raw_status="booting",
            price_per_hour=request.offer.price_per_hour,
            gpu=request.offer.gpu,
            gpu_count=request.offer.gpu_count,
            started_at=datetime.now(UTC),
        )

    def status(self, instance_id: str) -> Instance:
        data = self.http.json("GET", f"/instances/{instance_id}", idempotent=True) or {}
        item = data.get("data")
        if not item:
            raise NotFoundError(f"lambda: instance {instance_id} not found", provider=self.name)
        return self._instance(item)

    def _list_raw(self) -> list[dict[str, Any]]:
        return (self.http.json("GET", "/instances", idempotent=True) or {}).get("data") or []

    def list_instances(self) -> list[Instance]:
        return self._live(self._instance(i) for i in self._list_raw() if self._ours(i.get("name")))

    def _terminate_call(self, instance_id: str) -> None:
        self.http.request(
            "POST", "/instance-operations/terminate", json={"instance_ids": [instance_id]}, idempotent=True
        )

    def burn_rate(self) -> float | None:
        total = 0.0
        for item in self._list_raw():
            if item.get("status") in ("booting", "active", "unhealthy"):
                total += ((item.get("instance_type") or {}).get("price_cents_per_hour") or 0) / 100.0
        return round(total, 6)

    # -- file systems ------------------------------------------------------------------------------
    def list_volumes(self) -> list[Volume]:
        items = (self.http.json("GET", "/file-systems", idempotent=True) or {}).get("data") or []
        volumes = []
        for fs in items:
            region = fs.get("region")
            volumes.append(
                Volume(
                    provider=self.name,
                    volume_id=str(fs.get("id")),
                    name=str(fs.get("name") or fs.get("id")),
                    size_gb=round(float(fs.get("bytes_used") or 0) / 2**30, 3),
                    price_per_gb_month=FILE_SYSTEM_PRICE_PER_GB_MONTH,
                    attached=bool(fs.get("is_in_use")),
                    region=region.get("name") if isinstance(region, dict) else region,
                )
            )
        return volumes

    def create_volume(self, *, name: str, region: str) -> str:
        data = (
            self.http.json("POST", "/filesystems", json={"name": name, "region": region}, idempotent=False)
            or {}
        )
        return str((data.get("data") or {}).get("id"))

    def delete_volume(self, volume_id: str) -> None:
        try:
            self.http.request("DELETE", f"/filesystems/{volume_id}", idempotent=True)
        except NotFoundError:
            return


CLOUD = CloudSpec(
    name="lambda",
    client=LambdaProvider,
    key_env="LAMBDA_API_KEY",
    url_env="LAMBDA_API_URL",
    default_url="https://cloud.lambda.ai/api/v1",
    min_interval_s=1.0,
    rate_limit="about 1 request/s (launch about 1 per 12 s)",
    options={"ssh_key_name": "LAMBDA_SSH_KEY_NAME"},
    snapshot=Snapshot(
        date="2026-11-20",
        gpus={  # on-demand $/GPU-h and the node sizes sold; A100 80GB and H200 as 8-GPU nodes only
            "rtx-a6000": (0.8, None, (1, 2, 4)),
            "a100-40gb": (1.29, None, (1, 2, 4, 8)),
            "a100-80gb": (1.79, None, (8,)),
            "h100-80gb": (2.99, None, (1, 2, 4, 8)),
            "h200": (3.79, None, (8,)),
        },
        storage_per_gb_month=0.2,
        egress_per_gb=0.0,
        reliability=0.995,
        inet_down_mbps=2000,
        preemptions_per_hour=0.0,
        location="us",
        note="on-demand only; A100 80GB and H200 sold as 8-GPU nodes",
    ),
)
