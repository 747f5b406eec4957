"""Fixtures for the provider tests: fake clouds on 127.0.0.1 and ready clients."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes.clouds import FAKES, FakeCloud
from fakes.clouds.fixtures import (  # noqa: F401 - fixtures re-exported for this area
    client_for,
    fake_clouds,
    fake_lambda,
    fake_runpod,
    fake_tensordock,
    fake_vast,
)

from bot.planner.offer import Offer
from bot.providers.base import LaunchRequest, OfferQuery
from bot.providers.local import LocalProvider
from bot.providers.registry import CLOUDS

ALL_PROVIDERS = (*CLOUDS, "local")  # every cloud in CLOUDS (against its fake), and local


@dataclass
class Harness:
    name: str
    provider: Any
    fake: FakeCloud | None

    def offer(self, **query: Any) -> Offer:
        offers = self.provider.search_offers(OfferQuery(interruptible=False, **query))
        assert offers, f"{self.name}: the fake offers nothing for {query}"
        return offers[0]

    def request(self, job_id: str, **kwargs: Any) -> LaunchRequest:
        kwargs.setdefault("offer", self.offer())
        kwargs.setdefault("image", "ghcr.io/tunebot/runner:test")
        return LaunchRequest(job_id=job_id, **kwargs)


def make_harness(name: str, tmp_path: Path, **client_options: Any) -> Harness:
    if name == "local":
        provider = LocalProvider(workdir=tmp_path / "local", runner_command=["sleep", "30"])
        return Harness(name, provider, None)
    fake = FAKES[name]().start()
    return Harness(name, client_for(fake, **client_options), fake)


@pytest.fixture(params=ALL_PROVIDERS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h = make_harness(request.param, tmp_path)
    try:
        yield h
    finally:
        if h.fake is not None:
            h.fake.stop()
        else:
            for inst in h.provider.list_instances():
                h.provider.terminate(inst.instance_id)
