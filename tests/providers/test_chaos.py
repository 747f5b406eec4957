"""Seeded chaos: 200 launch/terminate cycles per provider with injected faults, then a reconcile sweep.

What must hold (the issue's acceptance): no job ever has two instances, and after a label-based
sweep like the reconciler's, zero instances are left that the system does not know about (and
once the system terminates what it knows, nothing is left at all).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakes.clouds import FAKES
from fakes.clouds.fixtures import client_for

from bot.providers.base import (
    LABEL_PREFIX,
    LaunchRequest,
    OfferQuery,
    ProviderDownError,
    ProviderError,
    RateLimitedError,
)
from bot.providers.lifecycle import ensure_launched, ensure_terminated
from bot.providers.local import LocalProvider

CYCLES = 200
SEED = 20261202
CHAOS_RATE = 0.06
CRASH_RATE = 0.03  # the bot dies between the provider's create and its own commit


def no_sleep(seconds: float) -> None:
    return None


@dataclass
class Books:
    """What "the system" (the engine's database) knows."""

    known: dict[str, str] = field(default_factory=dict)  # label -> instance id (launched, not yet gone)
    failed: set[str] = field(default_factory=set)  # launches that raised: an instance may exist anyway
    launched: int = 0
    terminated: int = 0
    orphans_swept: int = 0


def run_cycles(provider: Any, offers: list, *, seed: int, cycles: int = CYCLES) -> Books:
    rng = random.Random(seed)
    books = Books()
    active: list[str] = []
    for c in range(cycles):
        request = LaunchRequest(job_id=f"chaos-{seed}-{c}", offer=rng.choice(offers), image="img")
        try:
            inst = ensure_launched(provider, request, attempts=4, sleep=no_sleep, rng=rng)
        except ProviderError:
            books.failed.add(request.label)
        else:
            assert inst.label == request.label
            if rng.random() < CRASH_RATE:
                books.failed.add(request.label)  # crashed before recording it: an orphan for the sweep
                continue
            books.known[request.label] = inst.instance_id
            books.launched += 1
            active.append(request.label)
        while len(active) > rng.randint(0, 3):
            label = active.pop(rng.randrange(len(active)))
            if ensure_terminated(provider, books.known[label], deadline_s=2.0, sleep=no_sleep, rng=rng):
                del books.known[label]
                books.terminated += 1
            # else: it stays on the books; the sweep retries it
    return books


def sweep(provider: Any, books: Books) -> None:
    """The reconciler: anything of ours the books do not know is terminated; unconfirmed ones retried."""
    for inst in provider.list_instances():
        assert inst.label and inst.label.startswith(LABEL_PREFIX)
        if books.known.get(inst.label) != inst.instance_id:
            assert inst.label in books.failed or inst.label in books.known, f"unexplained {inst}"
            assert ensure_terminated(provider, inst.instance_id, deadline_s=5.0, sleep=no_sleep)
            books.orphans_swept += 1


@pytest.mark.slow
@pytest.mark.parametrize("cloud", list(FAKES))
def test_chaos_cycles_leave_no_unknown_instances_and_no_job_with_two(cloud: str) -> None:
    seed = SEED + list(FAKES).index(cloud)
    fake = FAKES[cloud](seed=seed, timeout_sleep_s=0.12, boot_polls=0).start()
    try:
        provider = client_for(fake, timeout_s=0.1, terminate_timeout_s=2.0)
        offers = provider.search_offers(OfferQuery())[:5]
        fake.chaos(CHAOS_RATE, seed=seed, create_fault_rate=0.08)
        books = run_cycles(provider, offers, seed=seed)
        fake.clear_faults()
        sweep(provider, books)

        live = {fake.label_of(i) for i in fake.live_instances()}
        assert live <= set(books.known), (
            f"instances the system does not know about: {live - set(books.known)}"
        )
        for iid in list(books.known.values()):
            assert ensure_terminated(provider, iid, deadline_s=5.0, sleep=no_sleep)
        assert fake.live_instances() == [], "something is still billing"
        assert max(fake.max_live_per_label.values()) == 1, "a job had two instances at once"
        fired = fake.faults_fired
        print(f"{cloud}: {books}, created={fake.created_total}, requests={len(fake.requests)}")
        print(f"{cloud}: faults {dict(fired)}")
        assert books.launched >= CYCLES * 0.6 and books.orphans_swept >= 1, books
        assert fired["create_fails_500"] + fired["create_fails_timeout"] + fired["create_fails_reset"] >= 5
        assert fired["timeout"] >= 1 and fired["429"] + fired["429_retry_after"] >= 2 and fired["reset"] >= 1
    finally:
        fake.stop()


class FlakyLocal:
    """LocalProvider with injected faults, including a create that fails after creating."""

    def __init__(self, inner: LocalProvider, rng: random.Random, rate: float) -> None:
        self.inner, self.rng, self.rate = inner, rng, rate
        self.name, self.capabilities = inner.name, inner.capabilities
        self.enabled = True
        self.max_live_per_label = 0

    def _maybe_fail(self) -> None:
        if self.enabled and self.rng.random() < self.rate:
            raise self.rng.choice(
                [RateLimitedError("local: 429", retry_after=0.0), ProviderDownError("local: 503")]
            )

    def launch(self, request: LaunchRequest):
        self._maybe_fail()
        inst = self.inner.launch(request)
        n = len([i for i in self.inner.list_instances() if i.label == request.label])
        self.max_live_per_label = max(self.max_live_per_label, n)
        if self.enabled and self.rng.random() < self.rate:
            raise ProviderDownError("local: reset after create")
        return inst

    def list_instances(self):
        self._maybe_fail()
        return self.inner.list_instances()

    def status(self, instance_id: str):
        self._maybe_fail()
        return self.inner.status(instance_id)

    def terminate(self, instance_id: str) -> None:
        self._maybe_fail()
        self.inner.terminate(instance_id, grace_s=1.0)


@pytest.mark.slow
def test_chaos_cycles_on_the_local_provider(tmp_path: Path) -> None:
    inner = LocalProvider(workdir=tmp_path, runner_command=["sleep", "30"])
    flaky = FlakyLocal(inner, random.Random(SEED), rate=0.05)
    books = run_cycles(flaky, [inner.offer()], seed=SEED)
    flaky.enabled = False
    sweep(flaky, books)
    live = {i.label for i in inner.list_instances()}
    assert live <= set(books.known)
    for iid in books.known.values():
        assert ensure_terminated(flaky, iid, deadline_s=5.0, sleep=no_sleep)
    assert inner.list_instances() == [] and flaky.max_live_per_label == 1
    assert books.launched >= CYCLES * 0.7 and books.orphans_swept >= 1
