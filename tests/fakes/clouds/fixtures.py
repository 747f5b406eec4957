"""Pytest fixtures and helpers for the fake clouds; import them into any area's conftest.py::

    from fakes.clouds.fixtures import fake_clouds, fake_vast, client_for, use_fake_env  # noqa: F401

``client_for(fake)`` builds the real tunebot client pointed at a fake, with tiny timeouts and
backoffs and a no-op sleep (tests never sleep for real backoff). ``use_fake_env(monkeypatch, fake)``
sets the cloud's key and URL variables (its spec's ``key_env`` / ``url_env``, e.g. VAST_API_KEY /
VAST_API_URL) so code that reads settings talks to the fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bot.providers.http import RetryPolicy

from .base import FakeCloud
from .lambda_cloud import FakeLambda
from .runpod import FakeRunPod
from .tensordock import FakeTensorDock
from .vast import FakeVast

FAST_RETRY = RetryPolicy(attempts=5, base_s=0.001, max_s=0.005, max_retry_after_s=1.0)


def _no_sleep(seconds: float) -> None:
    return None


def client_for(fake: FakeCloud, *, timeout_s: float = 2.0, api_key: str | None = None, **kwargs: Any) -> Any:
    """The real provider client for this fake (fast retries, no real sleeping)."""
    from bot.providers.registry import cloud_spec

    options: dict[str, Any] = {
        "timeout_s": timeout_s,
        "retry": FAST_RETRY,
        "sleep": _no_sleep,
        "poll_interval_s": 0.0,
        "terminate_timeout_s": 5.0,
    }
    options.update(kwargs)
    return cloud_spec(fake.provider).client(api_key=api_key or fake.api_key, base_url=fake.url, **options)


def use_fake_env(monkeypatch: pytest.MonkeyPatch, fake: FakeCloud) -> None:
    from bot.providers.registry import cloud_spec

    spec = cloud_spec(fake.provider)
    monkeypatch.setenv(spec.key_env, fake.api_key)
    monkeypatch.setenv(spec.url_env, fake.url)
    from bot.settings import get_settings

    get_settings.cache_clear()


def _serve(cls: type[FakeCloud]) -> Iterator[FakeCloud]:
    fake = cls().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def fake_vast() -> Iterator[FakeCloud]:
    yield from _serve(FakeVast)


@pytest.fixture
def fake_runpod() -> Iterator[FakeCloud]:
    yield from _serve(FakeRunPod)


@pytest.fixture
def fake_lambda() -> Iterator[FakeCloud]:
    yield from _serve(FakeLambda)


@pytest.fixture
def fake_tensordock() -> Iterator[FakeCloud]:
    yield from _serve(FakeTensorDock)


@pytest.fixture
def fake_clouds() -> Iterator[dict[str, FakeCloud]]:
    """A fake for every cloud in ``CLOUDS``, started, by cloud name ({"lambda": ..., ..., "vast": ...})."""
    from bot.providers.registry import CLOUDS

    from . import FAKES

    missing = [name for name in CLOUDS if name not in FAKES]
    assert not missing, f"no fake server in tests/fakes/clouds for {missing}"
    fakes = {name: FAKES[name]().start() for name in CLOUDS}
    try:
        yield fakes
    finally:
        for fake in fakes.values():
            fake.stop()
