"""RunPod: containers (pods) through the GraphQL API at ``RUNPOD_API_URL + "/graphql"``.

Quirks handled here (see docs/providers.md): client errors come as HTTP 200 with
``{"errors":[{"message":...}]}``; prices are per GPU per hour (times the count); ``stockStatus``
None / null means unavailable; ``runtime`` is null until the container is up (provisioning);
``podTerminate`` on a missing pod answers "pod not found to terminate" (already gone). Interruptible
pods were withdrawn in September 2026: the capability flag says so, nothing else hard-codes it.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

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
    ProviderDownError,
    ProviderError,
    RateLimitedError,
    Volume,
)
from bot.providers.common import CloudProvider, finish_search, map_status
from bot.providers.gpus import gpu_memory, normalize_gpu
from bot.providers.spec import CloudSpec, Snapshot

STATUS_MAP: dict[str | None, InstanceStatus] = {
    "created": InstanceStatus.provisioning,
    "provisioning": InstanceStatus.provisioning,
    "starting": InstanceStatus.provisioning,
    "running": InstanceStatus.running,
    "restarting": InstanceStatus.provisioning,
    "exited": InstanceStatus.exited,
    "error": InstanceStatus.exited,
    "dead": InstanceStatus.exited,
    "paused": InstanceStatus.stopped,
    "terminated": InstanceStatus.terminated,
}

GPU_TYPES_QUERY = """
query GpuTypes($input: GpuLowestPriceInput) {
  gpuTypes {
    id displayName memoryInGb maxGpuCount secureCloud communityCloud securePrice communityPrice
    lowestPrice(input: $input) { uninterruptablePrice minimumBidPrice minVcpu minMemory stockStatus }
  }
}"""
DEPLOY_MUTATION = """
mutation Deploy($input: PodFindAndDeployOnDemandInput) {
  podFindAndDeployOnDemand(input: $input) { id name desiredStatus costPerHr machine { podHostId } }
}"""
POD_QUERY = """
query Pod($input: PodFilter) {
  pod(input: $input) {
    id name desiredStatus costPerHr lastStatusChange gpuCount networkVolumeId
    runtime { uptimeInSeconds } machine { gpuDisplayName }
  }
}"""
PODS_QUERY = """
query Pods {
  myself {
    pods { id name desiredStatus costPerHr lastStatusChange gpuCount networkVolumeId
           runtime { uptimeInSeconds } machine { gpuDisplayName } }
  }
}"""
TERMINATE_MUTATION = """
mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }"""
VOLUMES_QUERY = """
query Volumes { myself { networkVolumes { id name size dataCenterId } pods { id networkVolumeId } } }"""
CREATE_VOLUME_MUTATION = """
mutation CreateVolume($input: CreateNetworkVolumeInput!) { createNetworkVolume(input: $input) { id } }"""
DELETE_VOLUME_MUTATION = """
mutation DeleteVolume($input: DeleteNetworkVolumeInput!) { deleteNetworkVolume(input: $input) }"""
BILLING_QUERY = """query Billing { myself { clientBalance currentSpendPerHr spendLimit } }"""


def network_volume_price(size_gb: float) -> float:
    """$/GB-month of a network volume: $0.07 under 1 TB, $0.05 above (docs/providers.md)."""
    return 0.05 if size_gb > 1000 else 0.07


def graphql_error(errors: list[Any], *, provider: str = "runpod") -> ProviderError:
    """The typed error for a GraphQL ``errors`` list (RunPod answers these with HTTP 200)."""
    first = errors[0] if errors else {}
    message = str(first.get("message") if isinstance(first, dict) else first)[:300]
    low = message.lower()
    text = f"runpod: {message}"
    if "not found" in low or "does not exist" in low:
        return NotFoundError(text, provider=provider)
    if "unauthorized" in low or "api key" in low or "authenticat" in low or "forbidden" in low:
        return AuthError("runpod: the API key was rejected", provider=provider)
    if (
        "no longer any instances available" in low
        or "no instances" in low
        or "not enough" in low
        or "capacity" in low
        or "unavailable" in low
    ):
        return CapacityError(text, provider=provider)
    if "rate limit" in low or "too many requests" in low:
        return RateLimitedError(text, provider=provider)
    if "internal" in low or "something went wrong" in low:
        return ProviderDownError(text, provider=provider)
    return InvalidRequestError(text, provider=provider)


def offers_from_gpu_types(
    items: list[dict[str, Any]], count: int, now: datetime | None = None
) -> list[Offer]:
    offers = []
    for item in items:
        mem = item.get("memoryInGb")
        gpu = normalize_gpu(item.get("displayName") or item.get("id"), mem)
        lowest = item.get("lowestPrice") or {}
        stock = lowest.get("stockStatus")
        price = lowest.get("uninterruptablePrice")
        if gpu is None or price is None or stock in (None, "None", "NONE", ""):
            continue  # unknown card, or null stockStatus = unavailable
        if (item.get("maxGpuCount") or 0) < count:
            continue
        try:
            offers.append(
                Offer(
                    provider="runpod",
                    offer_id=str(item["id"]),
                    gpu=gpu,
                    gpu_count=count,
                    gpu_memory_gb=gpu_memory(gpu, mem),
                    price_per_hour=round(float(price) * count, 6),  # per GPU per hour x count
                    interruptible=False,
                    reliability=None,
                    location=None,
                    storage_per_gb_month=0.10,
                    source="live",
                    as_of=now,
                    raw=item,
                )
            )
        except (ValidationError, TypeError, ValueError):
            continue
    return offers


class RunPodProvider(CloudProvider):
    name = "runpod"
    # Spot pods were withdrawn in September 2026; flip this flag (not code) if they come back.
    capabilities = Capabilities(
        interruptible=False, volumes=True, kind="container", stop=True, burn_rate=True
    )

    def _map_error(self, response: httpx.Response) -> ProviderError | None:
        if response.status_code in (401, 403):
            return AuthError(
                f"runpod: the API key was rejected (HTTP {response.status_code})", provider=self.name
            )
        try:
            body = response.json()
        except ValueError:
            return None
        if (
            isinstance(body, dict)
            and body.get("errors")
            and response.status_code < 500
            and response.status_code != 429
        ):
            return graphql_error(body["errors"])
        return None

    def gql(self, query: str, variables: dict[str, Any] | None = None, *, idempotent: bool) -> dict[str, Any]:
        """POST a GraphQL document; ``errors`` (even with HTTP 200) become typed errors."""
        body = self.http.json(
            "POST", "/graphql", json={"query": query, "variables": variables or {}}, idempotent=idempotent
        )
        if not isinstance(body, dict):
            raise ProviderDownError("runpod: GraphQL answered without a JSON object", provider=self.name)
        if body.get("errors"):
            error = graphql_error(body["errors"])
            error.args = (self.http.redact(str(error)),)
            raise error
        return body.get("data") or {}

    # -- offers ------------------------------------------------------------------------------------
    def search_offers(self, query: OfferQuery) -> list[Offer]:
        if query.interruptible is True and not self.capabilities.interruptible:
            return []
        data = self.gql(
            GPU_TYPES_QUERY,
            {"input": {"gpuCount": query.gpu_count, "minDisk": query.min_disk_gb}},
            idempotent=True,
        )
        offers = offers_from_gpu_types(data.get("gpuTypes") or [], query.gpu_count, datetime.now(UTC))
        return finish_search(offers, query)

    def quote(self, offer: Offer) -> Offer:
        data = self.gql(GPU_TYPES_QUERY, {"input": {"gpuCount": offer.gpu_count}}, idempotent=True)
        items = [i for i in data.get("gpuTypes") or [] if str(i.get("id")) == offer.offer_id]
        found = offers_from_gpu_types(items, offer.gpu_count, datetime.now(UTC))
        if not found:
            raise CapacityError(
                f"runpod: {offer.offer_id} x{offer.gpu_count} is not available now", provider=self.name
            )
        return found[0]

    # -- instances ---------------------------------------------------------------------------------
    def _instance(self, pod: dict[str, Any]) -> Instance:
        raw = pod.get("desiredStatus")
        status = map_status(raw, STATUS_MAP)
        if status == InstanceStatus.running and not pod.get("runtime"):
            status = InstanceStatus.provisioning  # runtime is null until the container is up
        machine = pod.get("machine") or {}
        return Instance(
            provider=self.name,
            instance_id=str(pod.get("id")),
            label=pod.get("name"),
            status=status,
            raw_status=raw,
            price_per_hour=pod.get("costPerHr"),
            gpu=normalize_gpu(machine.get("gpuDisplayName")),
            gpu_count=pod.get("gpuCount"),
            created_at=rented_at(pod.get("lastStatusChange")),
        )

    def launch(self, request: LaunchRequest) -> Instance:
        existing = self.find_by_label(request.label)
        if existing:
            return existing[0]
        if request.bid_per_hour is not None and not self.capabilities.interruptible:
            raise InvalidRequestError(
                "runpod: interruptible pods are not sold (withdrawn Sept 2026)", provider=self.name
            )
        offer = request.offer
        pod_input: dict[str, Any] = {
            "name": request.label,
            "imageName": request.image,
            "gpuTypeId": offer.offer_id,
            "cloudType": "ALL",
            "gpuCount": offer.gpu_count,
            "containerDiskInGb": request.disk_gb,
            "volumeInGb": 0,
            "env": [{"key": k, "value": v} for k, v in request.env.items()],
        }
        if request.command:
            pod_input["dockerArgs"] = shlex.join(request.command)  # one string: its words quoted
        if request.volume_id:
            pod_input["networkVolumeId"] = request.volume_id
            pod_input["volumeMountPath"] = "/workspace"
        data = self.gql(DEPLOY_MUTATION, {"input": pod_input}, idempotent=False)
        pod = data.get("podFindAndDeployOnDemand")
        if not pod or not pod.get("id"):
            raise CapacityError(f"runpod: no pod created for {offer.offer_id}", provider=self.name)
        pod.setdefault("name", request.label)
        inst = self._instance(pod)
        inst.status = InstanceStatus.provisioning
        inst.price_per_hour = pod.get("costPerHr") or offer.price_per_hour
        inst.gpu, inst.gpu_count = offer.gpu, offer.gpu_count
        inst.started_at = datetime.now(UTC)
        return inst

    def status(self, instance_id: str) -> Instance:
        data = self.gql(POD_QUERY, {"input": {"podId": instance_id}}, idempotent=True)
        pod = data.get("pod")
        if not pod:
            raise NotFoundError(f"runpod: pod {instance_id} not found", provider=self.name)
        return self._instance(pod)

    def list_instances(self) -> list[Instance]:
        data = self.gql(PODS_QUERY, idempotent=True)
        pods = (data.get("myself") or {}).get("pods") or []
        return self._live(self._instance(p) for p in pods if self._ours(p.get("name")))

    def _terminate_call(self, instance_id: str) -> None:
        # "pod not found to terminate" arrives as a GraphQL error -> NotFoundError -> already gone.
        self.gql(TERMINATE_MUTATION, {"input": {"podId": instance_id}}, idempotent=True)

    def burn_rate(self) -> float | None:
        data = self.gql(BILLING_QUERY, idempotent=True)
        value = (data.get("myself") or {}).get("currentSpendPerHr")
        return float(value) if value is not None else None

    # -- network volumes ---------------------------------------------------------------------------
    def list_volumes(self) -> list[Volume]:
        data = self.gql(VOLUMES_QUERY, idempotent=True)
        me = data.get("myself") or {}
        in_use = {p.get("networkVolumeId") for p in me.get("pods") or [] if p.get("networkVolumeId")}
        return [
            Volume(
                provider=self.name,
                volume_id=str(v["id"]),
                name=str(v.get("name") or v["id"]),
                size_gb=float(v.get("size") or 0),
                price_per_gb_month=network_volume_price(float(v.get("size") or 0)),
                attached=v["id"] in in_use,
                region=v.get("dataCenterId"),
            )
            for v in me.get("networkVolumes") or []
        ]

    def create_volume(self, *, name: str, size_gb: int, data_center_id: str) -> str:
        data = self.gql(
            CREATE_VOLUME_MUTATION,
            {"input": {"name": name, "size": size_gb, "dataCenterId": data_center_id}},
            idempotent=False,
        )
        return str((data.get("createNetworkVolume") or {}).get("id"))

    def delete_volume(self, volume_id: str) -> None:
        try:
            self.gql(DELETE_VOLUME_MUTATION, {"input": {"id": volume_id}}, idempotent=True)
        except NotFoundError:
            return


_RENTED = re.compile(r"^Rented by User:\s*(.+?)\s*$")


def rented_at(text: Any) -> datetime | None:
    """The pod's creation time from ``lastStatusChange`` ("Rented by User: Fri Jan 26 2024 15:32:41 GMT+0000
    (Coordinated Universal Time)"): it says so only until the pod's status first changes; None otherwise."""
    match = _RENTED.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    raw = re.sub(r"\s*\(.*\)$", "", match.group(1)).strip()
    for fmt in ("%a %b %d %Y %H:%M:%S GMT%z", "%a %b %d %H:%M:%S %Y"):
        try:
            parsed = datetime.strptime(raw, fmt)
        except ValueError:
            continue
        # without a zone (the fake's time.ctime()): the local time of this machine
        return parsed if parsed.tzinfo else parsed.astimezone()
    return None


CLOUD = CloudSpec(
    name="runpod",
    client=RunPodProvider,
    key_env="RUNPOD_API_KEY",
    url_env="RUNPOD_API_URL",
    default_url="https://api.runpod.io",
    snapshot=Snapshot(
        date="2026-11-20",
        gpus={  # Secure Cloud on-demand $/GPU-h; no spot since September 2026
            "rtx-3090": (0.43, None),
            "rtx-4090": (0.59, None),
            "rtx-a6000": (0.49, None),
            "rtx-6000-ada": (0.77, None),
            "l40s": (0.86, None),
            "a100-80gb": (1.39, None),
            "h100-80gb": (2.69, None),
            "h200": (3.59, None),
        },
        storage_per_gb_month=0.07,
        egress_per_gb=0.0,
        reliability=0.99,
        inet_down_mbps=1000,
        preemptions_per_hour=0.0,
        location="secure cloud",
        note="Secure Cloud on-demand; spot pods discontinued in September 2026",
    ),
)
