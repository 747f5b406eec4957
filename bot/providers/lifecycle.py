"""Launch and terminate safely on any provider: the engine's only way to create or destroy instances.

- ``ensure_launched`` never retries a create blindly: it first looks for an instance with the
  job's label and adopts it (a running / provisioning one; a dead one - exited, preempted,
  stopped - is terminated first, so read its exit code before relaunching); after an error
  that may have created something (timeout, 5xx, connection reset) it lists by label again and
  adopts what it finds, and it terminates extras so a job never has two instances.
- ``ensure_terminated`` keeps terminating through outages until the provider confirms the instance
  is gone or the deadline passes (then the caller keeps it on its books and the reconciler retries); an
  API that does not answer at all (``unreachable``) ends the attempt at once: the next tick retries.
- ``check_price`` re-quotes the live price right before a launch (dstack #1886).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from bot.planner.offer import Offer
from bot.providers.base import (
    CapacityError,
    Instance,
    InstanceStatus,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
    PriceChangedError,
    Provider,
    ProviderDownError,
    ProviderError,
    RateLimitedError,
)

log = logging.getLogger("tunebot.providers.lifecycle")

_RANK = {
    InstanceStatus.running: 0,
    InstanceStatus.provisioning: 1,
    InstanceStatus.unknown: 2,
    InstanceStatus.stopped: 3,
    InstanceStatus.preempted: 4,
    InstanceStatus.exited: 5,
}


# Instances worth adopting; a stopped / preempted / exited one is terminated before relaunching.
ADOPTABLE = frozenset({InstanceStatus.running, InstanceStatus.provisioning, InstanceStatus.unknown})


def instances_with_label(provider: Provider, label: str) -> list[Instance]:
    """Live (not terminated) instances carrying this label, best first (running before the rest)."""
    found = [
        i for i in provider.list_instances() if i.label == label and i.status != InstanceStatus.terminated
    ]
    return sorted(found, key=lambda i: (_RANK.get(i.status, 9), i.instance_id))


def _keep_one(provider: Provider, found: list[Instance], sleep: Callable[[float], None]) -> Instance:
    keep, extras = found[0], found[1:]
    for extra in extras:
        log.warning(
            "%s: job label %s has a second instance %s; terminating it",
            provider.name,
            extra.label,
            extra.instance_id,
        )
        ensure_terminated(provider, extra.instance_id, deadline_s=60.0, sleep=sleep)
    return keep


def ensure_launched(
    provider: Provider,
    request: LaunchRequest,
    *,
    attempts: int = 4,
    backoff_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> Instance:
    """One instance for this job at this provider: adopted if it exists, else created exactly once.

    Raises the provider's typed error when it cannot (CapacityError, AuthError, InvalidRequestError
    at once; ProviderDownError / RateLimitedError after ``attempts`` tries, each preceded by a
    label lookup so nothing is ever created twice).
    """
    rng = rng or random.Random()
    last: ProviderError | None = None
    for attempt in range(attempts):
        if attempt:
            delay = last.retry_after if last is not None and last.retry_after is not None else 0.0
            sleep(max(delay, rng.uniform(0.0, backoff_s * 2 ** (attempt - 1))))
        try:
            found = instances_with_label(provider, request.label)
        except (ProviderDownError, RateLimitedError) as exc:
            if getattr(exc, "unreachable", False):
                raise  # its API does not answer at all (already retried to its deadline): say so now
            last = exc  # cannot know whether one exists: do not create, try again later
            continue
        alive = [i for i in found if i.status in ADOPTABLE]
        if alive:
            return _keep_one(provider, alive, sleep)
        dead = [i for i in found if i not in alive]
        if dead and not all(
            ensure_terminated(provider, i.instance_id, deadline_s=60.0, sleep=sleep) for i in dead
        ):
            last = ProviderDownError(
                f"{provider.name}: a previous instance of {request.label} is not gone yet",
                provider=provider.name,
            )
            continue
        try:
            return provider.launch(request)
        except (ProviderDownError, RateLimitedError) as exc:
            # A timeout / 5xx / reset may have created it anyway: the next round lists by label first.
            last = exc
    assert last is not None
    raise last


def ensure_terminated(
    provider: Provider,
    instance_id: str,
    *,
    deadline_s: float = 300.0,
    backoff_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    sent: list[float] | None = None,
    wall: Callable[[], float] = time.time,
) -> bool:
    """True once the provider confirms the instance is gone; False if the deadline passed first. ``sent``
    gets the ``wall`` time of each terminate call (the last one is the call the provider confirmed: it bills
    until then, not until the confirmation came back)."""
    rng = rng or random.Random()
    deadline = clock() + deadline_s
    attempt = 0
    while True:
        if sent is not None:
            sent.append(wall())
        try:
            provider.terminate(instance_id)  # returns only once the provider confirms it is gone
            return True
        except NotFoundError:
            return True
        except (ProviderDownError, RateLimitedError) as exc:
            log.info("%s: terminate %s not confirmed yet: %s", provider.name, instance_id, exc)
            if getattr(exc, "unreachable", False):
                return False  # no answer at all within the call's deadline: the next tick tries again
        if clock() >= deadline:
            log.warning("%s: terminate %s not confirmed within %.0fs", provider.name, instance_id, deadline_s)
            return False
        sleep(min(rng.uniform(0.0, backoff_s * 2**attempt), max(0.0, deadline - clock())))
        attempt += 1


def live_quote(provider: Provider, offer: Offer) -> Offer:
    """The live version of an offer: the same ask if it is still sold, else the cheapest equivalent.

    A snapshot offer (``source="snapshot"``, ids like ``rtx-4090x1``) has no live twin by id; it is
    quoted as the cheapest live offer of the same GPU, count and class. Marketplace asks vanish all
    the time, so a live offer that is gone is quoted the same way. CapacityError when none is sold.
    """
    quote = getattr(provider, "quote", None)
    if offer.source == "live" and callable(quote):
        try:
            return quote(offer)
        except CapacityError:
            pass  # that very ask is gone: an equivalent one will do
    query = OfferQuery(gpu=offer.gpu, gpu_count=offer.gpu_count, interruptible=offer.interruptible, limit=50)
    matches = provider.search_offers(query)
    same = [o for o in matches if o.offer_id == offer.offer_id]
    if same or matches:
        return (same or matches)[0]
    kind = "interruptible" if offer.interruptible else "on-demand"
    raise CapacityError(
        f"{provider.name}: no {offer.gpu} x{offer.gpu_count} ({kind}) is available now",
        provider=provider.name,
    )


def check_price(provider: Provider, offer: Offer, accepted_price_per_hour: float, tolerance: float) -> Offer:
    """The live offer to launch, if its price is within ``accepted * (1 + tolerance)``.

    Raises PriceChangedError (both prices in the message) when the live price rose more than that,
    CapacityError when nothing equivalent is sold any more.
    """
    live = live_quote(provider, offer)
    limit = accepted_price_per_hour * (1.0 + tolerance)
    if live.price_per_hour > limit + 1e-9:
        rise = (
            (live.price_per_hour / accepted_price_per_hour - 1.0) * 100 if accepted_price_per_hour else 100.0
        )
        raise PriceChangedError(
            f"{provider.name} {offer.gpu} x{offer.gpu_count}: "
            f"the live price is ${live.price_per_hour:.3f}/h, "
            f"{rise:.0f}% above the accepted ${accepted_price_per_hour:.3f}/h (tolerance {tolerance:.0%}); "
            "launch stopped — re-run the estimate to accept the new price",
            provider=provider.name,
        )
    return live
