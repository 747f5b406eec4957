"""What every HTTP cloud client shares: construction, query filtering, label lookup, confirmed terminate."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import httpx

from bot.planner.offer import Offer
from bot.providers.base import (
    LABEL_PREFIX,
    Capabilities,
    Instance,
    InstanceStatus,
    NotFoundError,
    OfferQuery,
    ProviderDownError,
)
from bot.providers.http import HttpClient, RetryPolicy

if TYPE_CHECKING:
    from bot.providers.spec import CloudAccess, CloudSpec
    from bot.settings import Settings

ALIVE_STATUSES = frozenset(
    {
        InstanceStatus.provisioning,
        InstanceStatus.running,
        InstanceStatus.unknown,
        InstanceStatus.stopped,
        InstanceStatus.preempted,
        InstanceStatus.exited,
    }
)


def offer_matches(offer: Offer, query: OfferQuery) -> bool:
    """The client-side half of every search: filters a provider could not apply server-side."""
    if query.gpu is not None and offer.gpu != query.gpu:
        return False
    if offer.gpu_count != query.gpu_count:
        return False
    if query.min_gpu_memory_gb is not None and offer.gpu_memory_gb < query.min_gpu_memory_gb:
        return False
    if offer.reliability is not None and offer.reliability < query.min_reliability:
        return False  # only where reported: a missing reliability is not a bad one
    if (
        query.min_inet_down_mbps is not None
        and offer.inet_down_mbps is not None
        and offer.inet_down_mbps < query.min_inet_down_mbps
    ):
        return False
    if query.interruptible is not None and offer.interruptible != query.interruptible:
        return False
    return query.max_price_per_hour is None or offer.price_per_hour <= query.max_price_per_hour


def finish_search(offers: Iterable[Offer], query: OfferQuery) -> list[Offer]:
    kept = [o for o in offers if offer_matches(o, query)]
    kept.sort(key=lambda o: (o.price_per_hour, o.offer_id))
    return kept[: query.limit]


def map_status(raw: str | None, table: dict[str | None, InstanceStatus]) -> InstanceStatus:
    key = raw.lower() if isinstance(raw, str) else raw
    return table.get(key, InstanceStatus.unknown)


class CloudProvider:
    """Base of the HTTP clients: one ``HttpClient``, a poll interval and a terminate deadline."""

    name = "cloud"
    capabilities = Capabilities(interruptible=False, volumes=False, kind="vm")

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        poll_interval_s: float = 2.0,
        terminate_timeout_s: float = 180.0,
        min_interval_s: float = 0.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._sleep = sleep
        self._clock = clock
        self.poll_interval_s = poll_interval_s
        self.terminate_timeout_s = terminate_timeout_s
        self.http = HttpClient(
            provider=self.name,
            base_url=self.base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            deadline_s=timeout_s,
            retry=retry,
            transport=transport,
            sleep=sleep,
            rng=rng,
            error_mapper=self._map_error,
            min_interval_s=min_interval_s,
            clock=clock,
        )

    @classmethod
    def from_spec(cls, spec: CloudSpec, access: CloudAccess, settings: Settings, **kwargs: Any) -> Any:
        """Build the client from this cloud's spec (its documented rate limit) and its variables as the
        registry read them (key, URL, options; bot/providers/registry.py)."""
        options = {**access.options, **kwargs}
        options.setdefault("min_interval_s", spec.min_interval_s)
        return cls(
            api_key=access.api_key.get_secret_value() if access.api_key else None,
            base_url=access.api_url,
            timeout_s=settings.provider_timeout_s,
            **options,
        )

    def _map_error(self, response: httpx.Response) -> Any:  # ErrorMapper; per cloud
        return None

    def close(self) -> None:
        self.http.close()

    # -- shared operations ----------------------------------------------------------------------------
    def list_instances(self) -> list[Instance]:  # pragma: no cover - every cloud overrides
        raise NotImplementedError

    def status(self, instance_id: str) -> Instance:  # pragma: no cover
        raise NotImplementedError

    def _terminate_call(self, instance_id: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def find_by_label(self, label: str) -> list[Instance]:
        """Our live instances carrying this label (normally zero or one)."""
        return [
            i for i in self.list_instances() if i.label == label and i.status != InstanceStatus.terminated
        ]

    @staticmethod
    def _live(instances: Iterable[Instance]) -> list[Instance]:
        """Terminated instances linger in some listings for a while; they are gone, not ours to track."""
        return [i for i in instances if i.status != InstanceStatus.terminated]

    def _ours(self, label: str | None) -> bool:
        return bool(label) and str(label).startswith(LABEL_PREFIX)

    def terminate(self, instance_id: str) -> None:
        """Terminate, then poll until the provider confirms it is gone (NotFound or terminated)."""
        try:
            self._terminate_call(instance_id)
        except NotFoundError:
            return
        deadline = self._clock() + self.terminate_timeout_s
        while True:
            try:
                inst = self.status(instance_id)
            except NotFoundError:
                return
            if inst.status == InstanceStatus.terminated:
                return
            if self._clock() >= deadline:
                raise ProviderDownError(
                    f"{self.name}: instance {instance_id} still {inst.raw_status!r} "
                    f"{self.terminate_timeout_s:.0f}s after terminate",
                    provider=self.name,
                )
            self._sleep(self.poll_interval_s)
