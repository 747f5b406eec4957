"""Vast.ai: a P2P marketplace of containers; interruptible capacity is rented with a bid (``price``).

Quirks handled here (see docs/providers.md): status comes as a dict ``{"instances": {...}}``; an outbid
instance is paused and seen as cur_state == intended_status == next_state == "stopped"; exited /
unknown / offline never become running; a launch can answer ``success: false`` *with* a
``new_contract`` (created stopped: destroy it); destroy answers ``no_such_instance`` when already gone;
``gpu_ram`` is in MB; GPU names have spaces; values may be null; the instance list is paginated.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import TypeAdapter, ValidationError

from bot.planner.offer import Offer
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

# Vast's spelling of each canonical GPU (server-side filter; the normalizer decides in the end).
VAST_GPU_NAMES: dict[str, list[str]] = {
    "rtx-3090": ["RTX 3090", "RTX 3090 Ti"],
    "rtx-4090": ["RTX 4090"],
    "rtx-a6000": ["RTX A6000"],
    "rtx-6000-ada": ["RTX 6000Ada", "RTX 6000 Ada"],
    "l40s": ["L40S"],
    "a100-40gb": ["A100 PCIE", "A100 SXM4"],
    "a100-80gb": ["A100 PCIE", "A100 SXM4", "A100X"],
    "h100-80gb": ["H100 SXM", "H100 PCIE"],
    "h200": ["H200", "H200 NVL"],
}

# Assumption: how often an outbid pause hits a bid instance (the planner's preemption rate).
VAST_BID_PREEMPTIONS_PER_HOUR = 0.05

STATUS_MAP: dict[str | None, InstanceStatus] = {
    None: InstanceStatus.provisioning,
    "created": InstanceStatus.provisioning,
    "loading": InstanceStatus.provisioning,
    "rebooting": InstanceStatus.provisioning,
    "restarting": InstanceStatus.provisioning,
    "running": InstanceStatus.running,
    "stopped": InstanceStatus.stopped,
    "frozen": InstanceStatus.stopped,
    # exited / unknown / offline never become running again: the engine destroys and relaunches.
    "exited": InstanceStatus.exited,
    "unknown": InstanceStatus.exited,
    "offline": InstanceStatus.exited,
}

LIST_PAGE = 25
_OFFER_LIST = TypeAdapter(list[Offer])
MAX_PAGES = 1000


def vast_status(item: dict[str, Any]) -> tuple[InstanceStatus, str]:
    """Normalized status and the raw one; outbid (all three states "stopped") is a preemption."""
    raw = item.get("actual_status")
    states = (item.get("cur_state"), item.get("intended_status"), item.get("next_state"))
    if states == ("stopped", "stopped", "stopped"):
        return InstanceStatus.preempted, f"{raw}/outbid"
    return map_status(raw, STATUS_MAP), str(raw)


def _fields(item: dict[str, Any], interruptible: bool, now: datetime | None) -> dict[str, Any] | None:
    """The Offer fields of one Vast ask, or None when the GPU is unknown or a needed value is missing."""
    ram_mb = item.get("gpu_ram")
    mem = round(ram_mb / 1024) if isinstance(ram_mb, int | float) and ram_mb > 0 else None
    gpu = normalize_gpu(item.get("gpu_name"), mem)
    if gpu is None:
        return None
    if interruptible:
        price = item.get("min_bid")
    else:
        price = item.get("dph_base")
        if price is None:
            price = item.get("dph_total")
    ask_id = item.get("id")
    if price is None or ask_id is None:
        return None
    return {
        "provider": "vast",
        "offer_id": str(ask_id),
        "gpu": gpu,
        "gpu_count": item.get("num_gpus") or 1,
        "gpu_memory_gb": gpu_memory(gpu, mem),
        "price_per_hour": price,
        "interruptible": interruptible,
        "reliability": item.get("reliability2"),
        "location": item.get("geolocation"),
        "storage_per_gb_month": item.get("storage_cost") or 0.0,
        "egress_per_gb": item.get("inet_up_cost") or 0.0,
        "inet_down_mbps": item.get("inet_down"),
        "max_disk_gb": item.get("disk_space"),  # GB this host can give the instance
        "preemptions_per_hour": VAST_BID_PREEMPTIONS_PER_HOUR if interruptible else 0.0,
        "source": "live",
        "as_of": now,
        # Only what launch needs (validating the whole ask dict would triple the cost of a search).
        "raw": {"dph_total": item.get("dph_total"), "machine_id": item.get("machine_id")},
    }


def offer_from_vast(
    item: dict[str, Any], *, interruptible: bool, now: datetime | None = None
) -> Offer | None:
    """One Vast ask as an Offer, or None when the GPU is unknown or a value is missing or invalid."""
    fields = _fields(item, interruptible, now)
    if fields is None:
        return None
    try:
        return Offer(**fields)
    except (ValidationError, TypeError, ValueError):
        return None


def offers_from_vast(
    items: list[dict[str, Any]],
    *,
    interruptible: bool,
    query: OfferQuery | None = None,
    now: datetime | None = None,
) -> list[Offer]:
    """Normalize a whole search answer: filter the raw fields first, then validate the survivors at once."""
    rows = [f for f in (_fields(i, interruptible, now) for i in items) if f is not None]
    if query is not None:
        rows = [r for r in rows if _raw_matches(r, query)]
        rows.sort(key=lambda r: r["price_per_hour"])
        rows = rows[: query.limit]
    try:
        return _OFFER_LIST.validate_python(rows)
    except ValidationError:  # one bad row: keep the others
        return [o for o in (offer_from_vast_fields(r) for r in rows) if o is not None]


def offer_from_vast_fields(fields: dict[str, Any]) -> Offer | None:
    try:
        return Offer(**fields)
    except (ValidationError, TypeError, ValueError):
        return None


def _raw_matches(r: dict[str, Any], q: OfferQuery) -> bool:
    """The query's filters on raw fields (the same rules as common.offer_matches)."""
    if q.gpu is not None and r["gpu"] != q.gpu:
        return False
    if r["gpu_count"] != q.gpu_count:
        return False
    if q.min_gpu_memory_gb is not None and r["gpu_memory_gb"] < q.min_gpu_memory_gb:
        return False
    rel = r["reliability"]
    if rel is not None and rel < q.min_reliability:
        return False
    inet = r["inet_down_mbps"]
    if q.min_inet_down_mbps is not None and inet is not None and inet < q.min_inet_down_mbps:
        return False
    return q.max_price_per_hour is None or r["price_per_hour"] <= q.max_price_per_hour


def search_body(query: OfferQuery, order_type: str) -> dict[str, Any]:
    """The ``POST /api/v0/bundles/`` body for a query (docs/providers.md example)."""
    body: dict[str, Any] = {
        "verified": {"eq": True},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "num_gpus": {"eq": query.gpu_count},
        "reliability2": {"gte": query.min_reliability},
        "disk_space": {"gte": query.min_disk_gb},
        "order": [["dph_total", "asc"]],
        "type": order_type,
        "limit": query.limit,
        "allocated_storage": query.min_disk_gb,
    }
    if query.gpu is not None:
        body["gpu_name"] = {"in": VAST_GPU_NAMES.get(query.gpu, [query.gpu])}
    if query.min_gpu_memory_gb is not None:
        body["gpu_ram"] = {"gte": query.min_gpu_memory_gb * 1000}  # MB; exact check after rounding
    if query.min_inet_down_mbps is not None:
        body["inet_down"] = {"gte": query.min_inet_down_mbps}
    return body


class VastProvider(CloudProvider):
    name = "vast"
    capabilities = Capabilities(interruptible=True, volumes=True, kind="container", stop=True, burn_rate=True)

    def _map_error(self, response: httpx.Response) -> ProviderError | None:
        if response.status_code in (401, 403):
            return AuthError(
                f"vast: the API key was rejected (HTTP {response.status_code})", provider=self.name
            )
        try:
            body = response.json()
        except ValueError:
            return None  # 429s come as plain text; the status code decides
        if not isinstance(body, dict):
            return None
        code = str(body.get("error") or "")
        msg = str(body.get("msg") or "")[:200]
        if code in ("no_such_instance", "no_such_ask", "no_such_volume"):
            return NotFoundError(f"vast: {code}: {msg}", provider=self.name)
        if code and response.status_code < 500 and response.status_code != 429:
            return InvalidRequestError(f"vast: {code}: {msg}", provider=self.name)
        return None

    # -- offers ------------------------------------------------------------------------------------
    def _search(
        self, body: dict[str, Any], *, interruptible: bool, query: OfferQuery | None = None
    ) -> list[Offer]:
        data = self.http.json("POST", "/api/v0/bundles/", json=body, idempotent=True)
        items = (data or {}).get("offers") or []
        return offers_from_vast(items, interruptible=interruptible, query=query, now=datetime.now(UTC))

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        offers: list[Offer] = []
        if query.interruptible in (None, False):
            offers += self._search(search_body(query, "on-demand"), interruptible=False, query=query)
        if query.interruptible in (None, True):
            offers += self._search(search_body(query, "bid"), interruptible=True, query=query)
        return finish_search(offers, query)

    def quote(self, offer: Offer) -> Offer:
        """The live price of this very ask (it may be rented or repriced since the search)."""
        body = {
            "id": {"eq": int(offer.offer_id)},
            "type": "bid" if offer.interruptible else "on-demand",
            "rentable": {"eq": True},
            "limit": 1,
        }
        found = self._search(body, interruptible=offer.interruptible)
        if not found:
            raise CapacityError(f"vast: offer {offer.offer_id} is no longer available", provider=self.name)
        return found[0]

    # -- instances ---------------------------------------------------------------------------------
    def _instance(self, item: dict[str, Any]) -> Instance:
        status, raw = vast_status(item)
        started = item.get("start_date")
        return Instance(
            provider=self.name,
            instance_id=str(item.get("id")),
            label=item.get("label"),
            status=status,
            raw_status=raw,
            price_per_hour=item.get("dph_total"),
            gpu=normalize_gpu(item.get("gpu_name")),
            gpu_count=item.get("num_gpus"),
            ip=item.get("public_ipaddr"),
            started_at=datetime.fromtimestamp(started, UTC) if isinstance(started, int | float) else None,
            # start_date is the contract's start: Vast bills from it
            created_at=datetime.fromtimestamp(started, UTC) if isinstance(started, int | float) else None,
        )

    def launch(self, request: LaunchRequest) -> Instance:
        existing = self.find_by_label(request.label)
        if existing:
            return existing[0]
        if request.volume_id:
            raise InvalidRequestError(
                "vast: attaching a volume at launch is not supported by this client", provider=self.name
            )
        offer = request.offer
        body: dict[str, Any] = {
            "client_id": "me",
            "image": request.image,
            "disk": request.disk_gb,
            "label": request.label,
            "env": dict(request.env),
            "runtype": "args",
            "cancel_unavail": True,
        }
        if request.command:
            body["args"] = list(request.command)
        bid = request.bid_per_hour
        if bid is None and offer.interruptible:
            bid = offer.price_per_hour
        if bid is not None:
            body["price"] = round(float(bid), 4)  # present = interruptible
        try:
            response = self.http.request(
                "PUT", f"/api/v0/asks/{offer.offer_id}/", json=body, idempotent=False
            )
        except NotFoundError as exc:
            raise CapacityError(f"vast: offer {offer.offer_id} is gone", provider=self.name) from exc
        data = self.http.decode(response) or {}
        contract = data.get("new_contract")
        if not data.get("success"):
            code = str(data.get("error") or "rejected")
            if contract:
                # Created although refused (e.g. a bid too low): destroy it before anyone pays for it.
                self._destroy_quietly(str(contract))
            cls = InvalidRequestError if code == "invalid_args" else CapacityError
            raise cls(f"vast: launch on offer {offer.offer_id} refused: {code}", provider=self.name)
        if not contract:
            raise InvalidRequestError(
                "vast: launch answered success without a new_contract", provider=self.name
            )
        return Instance(
            provider=self.name,
            instance_id=str(contract),
            label=request.label,
            status=InstanceStatus.provisioning,
            raw_status=None,
            price_per_hour=float(bid)
            if bid is not None
            else float((offer.raw or {}).get("dph_total") or offer.price_per_hour),
            gpu=offer.gpu,
            gpu_count=offer.gpu_count,
            started_at=datetime.now(UTC),
        )

    def _destroy_quietly(self, instance_id: str) -> None:
        try:
            self.terminate(instance_id)
        except ProviderError:
            pass  # the label sweep finds it later

    def status(self, instance_id: str) -> Instance:
        data = self.http.json(
            "GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"}, idempotent=True
        )
        item = (data or {}).get("instances")
        if isinstance(item, list):  # tolerate a list-shaped answer
            item = item[0] if item else None
        if not item:
            raise NotFoundError(f"vast: instance {instance_id} not found", provider=self.name)
        item.setdefault("id", instance_id)
        return self._instance(item)

    def _list_raw(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"limit": LIST_PAGE}
            if token:
                params["after_token"] = token
            data = self.http.json("GET", "/api/v1/instances/", params=params, idempotent=True) or {}
            items.extend(data.get("instances") or [])
            token = data.get("next_token")
            if not token or token in seen:
                break
            seen.add(token)
        return items

    def list_instances(self) -> list[Instance]:
        return self._live(self._instance(i) for i in self._list_raw() if self._ours(i.get("label")))

    def _terminate_call(self, instance_id: str) -> None:
        self.http.request("DELETE", f"/api/v0/instances/{instance_id}/", idempotent=True)

    def burn_rate(self) -> float | None:
        return round(sum(float(i.get("dph_total") or 0.0) for i in self._list_raw()), 6)

    # -- volumes -----------------------------------------------------------------------------------
    def list_volumes(self) -> list[Volume]:
        data = (
            self.http.json(
                "GET", "/api/v0/volumes", params={"owner": "me", "type": "all_volume"}, idempotent=True
            )
            or {}
        )
        volumes = []
        for v in data.get("volumes") or []:
            idle = v.get("idle_since")
            volumes.append(
                Volume(
                    provider=self.name,
                    volume_id=str(v.get("id")),
                    name=str(v.get("name") or v.get("label") or v.get("id")),
                    size_gb=float(v.get("size") or v.get("disk_space") or 0.0),
                    price_per_gb_month=float(v.get("storage_cost") or 0.0),
                    attached=bool(v.get("instances") or v.get("inst_id")),
                    idle_since=datetime.fromtimestamp(idle, UTC) if isinstance(idle, int | float) else None,
                    region=v.get("geolocation"),
                )
            )
        return volumes

    def create_volume(self, *, name: str, size_gb: int, offer_id: str) -> str:
        data = (
            self.http.json(
                "PUT",
                "/api/v0/volumes/",
                json={"size": size_gb, "id": int(offer_id), "name": name},
                idempotent=False,
            )
            or {}
        )
        if not data.get("success", True) or data.get("volume_id") is None:
            raise InvalidRequestError(f"vast: volume not created: {data.get('error')}", provider=self.name)
        return str(data["volume_id"])

    def delete_volume(self, volume_id: str) -> None:
        try:
            self.http.request("DELETE", "/api/v0/volumes/", params={"id": volume_id}, idempotent=True)
        except NotFoundError:
            return


CLOUD = CloudSpec(
    name="vast",
    client=VastProvider,
    key_env="VAST_API_KEY",
    url_env="VAST_API_URL",
    default_url="https://console.vast.ai",
    # Per-endpoint limits, not published: a 429 "API requests too frequent" (backoff rides it out).
    rate_limit="per endpoint, unpublished (429 on excess)",
    snapshot=Snapshot(
        date="2026-11-20",
        gpus={  # marketplace medians of verified hosts: (on-demand, bid) $/GPU-h
            "rtx-3090": (0.2, 0.1),
            "rtx-4090": (0.36, 0.19),
            "rtx-a6000": (0.45, 0.24),
            "rtx-6000-ada": (0.78, 0.42),
            "l40s": (0.82, 0.45),
            "a100-40gb": (0.78, 0.4),
            "a100-80gb": (1.15, 0.6),
            "h100-80gb": (1.9, 1.0),
            "h200": (2.65, 1.45),
        },
        storage_per_gb_month=0.15,
        egress_per_gb=0.02,
        reliability=0.97,
        inet_down_mbps=800,
        preemptions_per_hour=0.12,
        location="marketplace",
        note="marketplace medians of verified hosts; interruptible = bid instances",
    ),
)
