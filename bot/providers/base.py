"""The one interface every GPU provider implements, its data types and its errors.

Error hierarchy (translated once, at each client's HTTP boundary, with ``raise X(...) from exc``)::

    ProviderError
    ├── CapacityError        no machine of that kind is available now (try another offer)
    ├── AuthError            the key is missing or wrong
    ├── RateLimitedError     too many requests; ``retry_after`` seconds if the provider said
    ├── NotFoundError        the instance / offer / volume does not exist (terminate treats it as done)
    ├── InvalidRequestError  the provider rejected the request as malformed (a bug or bad input)
    ├── PriceChangedError    the live price rose above the accepted estimate by more than the tolerance
    └── ProviderDownError    connection errors, timeouts, 5xx after retries

Messages never contain API keys: clients build messages from status codes and provider error
codes, and ``redact`` scrubs anything that slipped through - including, inside ``redacting(values)``,
every value a launch hands to the instance (a provider error body that echoes the create request
would otherwise carry the runner's storage keys and tokens into job messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

from bot.planner.offer import Offer

LABEL_PREFIX = "tunebot-"


def job_label(job_id: str) -> str:
    """The label/name every instance of a job carries at its provider."""
    return f"{LABEL_PREFIX}{job_id}"


def job_id_from_label(label: str | None) -> str | None:
    if label and label.startswith(LABEL_PREFIX):
        return label[len(LABEL_PREFIX) :] or None
    return None


class ProviderError(Exception):
    """Base of every error a provider client raises."""

    def __init__(self, message: str, *, provider: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.provider = provider
        self.retry_after = retry_after


class CapacityError(ProviderError):
    """No capacity for this offer right now."""


class AuthError(ProviderError):
    """The API key is missing or rejected."""


class RateLimitedError(ProviderError):
    """The provider asked us to slow down."""


class NotFoundError(ProviderError):
    """The object does not exist (any more)."""


class InvalidRequestError(ProviderError):
    """The provider rejected the request as invalid."""


class PriceChangedError(ProviderError):
    """The live price is above the accepted price by more than the tolerance."""


class ProviderDownError(ProviderError):
    """The provider cannot be reached or keeps failing."""

    def __init__(
        self, message: str, *, provider: str = "", retry_after: float | None = None, unreachable: bool = False
    ) -> None:
        super().__init__(message, provider=provider, retry_after=retry_after)
        # no HTTP answer at all (connection refused, unroutable, timed out): asking again at once is futile
        self.unreachable = unreachable


class InstanceStatus(StrEnum):
    provisioning = "provisioning"
    running = "running"
    preempted = "preempted"
    stopped = "stopped"
    exited = "exited"
    terminated = "terminated"
    unknown = "unknown"


GONE_STATUSES = frozenset({InstanceStatus.terminated})


@dataclass(frozen=True)
class Capabilities:
    interruptible: bool
    volumes: bool
    kind: str  # "container" | "vm" | "process"
    stop: bool = True  # can stop without terminating
    burn_rate: bool = False


@dataclass
class LaunchRequest:
    job_id: str
    offer: Offer
    image: str
    env: dict[str, str] = field(default_factory=dict)  # secrets allowed here; never logged
    disk_gb: int = 100
    volume_id: str | None = None
    bid_per_hour: float | None = None  # interruptible bid; None = on-demand
    command: list[str] | None = None  # container args / VM docker command override

    @property
    def label(self) -> str:
        return job_label(self.job_id)


@dataclass
class Instance:
    provider: str
    instance_id: str
    label: str | None
    status: InstanceStatus
    raw_status: str | None = None
    price_per_hour: float | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    ip: str | None = None
    started_at: datetime | None = None
    exit_code: int | None = None  # where known (local provider)
    # When its process ended, where the provider itself knows it (local provider: the runner's exit, written
    # by the wrapper on this machine). A process bills nothing after it: the books end there.
    exited_at: datetime | None = None
    # When the provider created it, on the provider's clock (billing starts there); None where its API
    # does not say (Lambda, TensorDock): the engine then bills from its launch request.
    created_at: datetime | None = None

    @property
    def job_id(self) -> str | None:
        return job_id_from_label(self.label)


@dataclass
class Volume:
    provider: str
    volume_id: str
    name: str
    size_gb: float
    price_per_gb_month: float
    attached: bool = False
    idle_since: datetime | None = None
    region: str | None = None

    @property
    def cost_per_month(self) -> float:
        return self.size_gb * self.price_per_gb_month


@dataclass
class OfferQuery:
    gpu: str | None = None  # canonical GPU name
    gpu_count: int = 1
    min_gpu_memory_gb: float | None = None
    min_reliability: float = 0.95
    min_inet_down_mbps: float | None = None
    interruptible: bool | None = None  # None = both
    max_price_per_hour: float | None = None
    min_disk_gb: int = 50
    limit: int = 200


@runtime_checkable
class Provider(Protocol):
    """What every cloud (and the local provider) implements. Calls are synchronous and bounded."""

    name: str
    capabilities: Capabilities

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        """Offers matching the query, normalized to canonical GPU names and $/h for the whole offer."""

    def launch(self, request: LaunchRequest) -> Instance:
        """Create an instance for the job; idempotent by label: an existing one is returned instead."""

    def status(self, instance_id: str) -> Instance:
        """Current normalized status; raises NotFoundError when the provider no longer knows it."""

    def list_instances(self) -> list[Instance]:
        """Every instance of ours (label starting with ``tunebot-``), all pages."""

    def terminate(self, instance_id: str) -> None:
        """Terminate and confirm it is gone; an instance that does not exist is already done."""

    def list_volumes(self) -> list[Volume]:
        """Our volumes with size, price and idle-since (empty where the provider has none)."""

    def delete_volume(self, volume_id: str) -> None:
        """Delete a volume; missing is done."""

    def burn_rate(self) -> float | None:
        """Current $/h across our running instances where the API reports it, else None."""


_IN_FLIGHT: ContextVar[tuple[str, ...]] = ContextVar("tunebot_in_flight_secrets", default=())


@contextmanager
def redacting(values: Iterable[str | None]) -> Iterator[None]:
    """Inside the block, ``redact`` also scrubs these values (what a launch passes to an instance)."""
    token = _IN_FLIGHT.set((*_IN_FLIGHT.get(), *(v for v in values if v)))
    try:
        yield
    finally:
        _IN_FLIGHT.reset(token)


def _forms(secret: str) -> list[str]:
    """A value as it may come back: raw, JSON-escaped (a body echoing a JSON request), with escaped '/'."""
    escaped = json.dumps(secret)[1:-1]
    return list(dict.fromkeys([secret, escaped, escaped.replace("/", "\\/")]))


def redact(text: str, secrets: Sequence[str | None]) -> str:
    """Replace every secret value in text (and those of the enclosing ``redacting`` blocks); used on every
    message built from provider responses. Longer values first, so one that contains another goes whole."""
    values = {s for s in (*secrets, *_IN_FLIGHT.get()) if s and len(s) >= 4}
    for secret in sorted(values, key=len, reverse=True):
        for form in _forms(secret):
            text = text.replace(form, "***")
    return text
