"""The shared request helper: error translation, retries with backoff, Retry-After, no key leaks."""

from __future__ import annotations

import logging
import random

import httpx
import pytest

from bot.providers.base import (
    AuthError,
    InvalidRequestError,
    NotFoundError,
    ProviderDownError,
    ProviderError,
    RateLimitedError,
)
from bot.providers.http import HttpClient, RetryPolicy, parse_retry_after

KEY = "sk-live-SECRET-0123456789abcdef"


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


# Every low-level error httpx can raise while sending a request.
LOW_LEVEL_ERRORS = sorted(
    {c for c in _all_subclasses(httpx.RequestError) if c.__module__.startswith("httpx")},
    key=lambda c: c.__name__,
)


class Recorder:
    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def make_client(handler, *, attempts: int = 4, **kwargs) -> tuple[HttpClient, Recorder]:
    sleep = Recorder()
    client = HttpClient(
        provider="testcloud",
        base_url="https://api.example.test/v1",
        api_key=KEY,
        timeout_s=1.0,
        retry=RetryPolicy(attempts=attempts, base_s=0.5, max_s=8.0, max_retry_after_s=30.0),
        transport=httpx.MockTransport(handler),
        sleep=sleep,
        rng=random.Random(1),
        **kwargs,
    )
    return client, sleep


def test_the_low_level_error_list_is_not_empty() -> None:
    names = {c.__name__ for c in LOW_LEVEL_ERRORS}
    assert {"ConnectError", "ReadTimeout", "ConnectTimeout", "RemoteProtocolError", "ReadError"} <= names


@pytest.mark.parametrize("error_cls", LOW_LEVEL_ERRORS, ids=lambda c: c.__name__)
def test_every_low_level_httpx_error_maps_to_a_typed_error_without_the_key(
    error_cls: type[httpx.RequestError], caplog: pytest.LogCaptureFixture
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        # The worst case: the low-level message itself carries the key (e.g. a URL with ?api_key=).
        raise error_cls(f"failed talking to {request.url}?api_key={KEY}", request=request)

    client, sleep = make_client(handler)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderError) as err:
        client.request("GET", "/instances", idempotent=True)
    assert isinstance(err.value.__cause__, httpx.HTTPError), "translated with `raise ... from exc`"
    if issubclass(error_cls, httpx.TransportError):
        assert isinstance(err.value, ProviderDownError)
        assert len(sleep.sleeps) == 3  # retried: idempotent
    assert KEY not in str(err.value)
    assert err.value.provider == "testcloud"
    for record in caplog.records:
        assert KEY not in record.getMessage()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, InvalidRequestError),
        (401, AuthError),
        (403, AuthError),
        (404, NotFoundError),
        (410, NotFoundError),
        (422, InvalidRequestError),
        (429, RateLimitedError),
        (500, ProviderDownError),
        (502, ProviderDownError),
        (503, ProviderDownError),
    ],
)
def test_status_codes_map_to_typed_errors_and_echoed_keys_are_redacted(status: int, expected: type) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=f"bad request from key {KEY}")

    client, _ = make_client(handler, attempts=1)
    with pytest.raises(expected) as err:
        client.request("GET", "/x", idempotent=True)
    assert KEY not in str(err.value)
    if status in (400, 422, 429, 500, 502, 503):  # the body is quoted, scrubbed
        assert "***" in str(err.value)


def test_the_key_travels_only_in_the_authorization_header() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    client, _ = make_client(handler)
    assert client.json("GET", "/ping", idempotent=True) == {"ok": True}
    assert seen[0].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in str(seen[0].url)


def test_429_honours_retry_after_then_succeeds() -> None:
    answers = [
        httpx.Response(429, headers={"Retry-After": "3"}, text="slow down"),
        httpx.Response(200, json=[1]),
    ]
    client, sleep = make_client(lambda r: answers.pop(0))
    assert client.json("GET", "/x", idempotent=True) == [1]
    assert len(sleep.sleeps) == 1 and sleep.sleeps[0] >= 3.0


def test_429_without_retry_after_still_backs_off_with_growing_jittered_waits() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(429, text="API requests too frequent: endpoint threshold=4.5")

    client, sleep = make_client(handler, attempts=5)
    with pytest.raises(RateLimitedError) as err:
        client.request("GET", "/x", idempotent=True)
    assert len(calls) == 5 and len(sleep.sleeps) == 4
    caps = [min(8.0, 0.5 * 2**n) for n in range(4)]
    assert all(0.0 <= s <= cap for s, cap in zip(sleep.sleeps, caps, strict=True))
    assert err.value.retry_after is None


def test_a_long_retry_after_is_raised_to_the_caller_not_slept() -> None:
    client, sleep = make_client(lambda r: httpx.Response(429, headers={"Retry-After": "120"}))
    with pytest.raises(RateLimitedError) as err:
        client.request("GET", "/x", idempotent=True)
    assert err.value.retry_after == 120 and sleep.sleeps == []


def test_5xx_is_retried_for_idempotent_calls_only() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return httpx.Response(502) if len(calls) < 3 else httpx.Response(200, json={"ok": 1})

    client, sleep = make_client(handler)
    assert client.json("GET", "/x", idempotent=True) == {"ok": 1}
    assert len(calls) == 3 and len(sleep.sleeps) == 2

    calls.clear()
    with pytest.raises(ProviderDownError):
        client.request("POST", "/create", json={}, idempotent=False)
    assert calls == ["POST"], "a create is never retried blindly"


def test_timeouts_on_a_create_are_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("timed out", request=request)

    client, sleep = make_client(handler)
    with pytest.raises(ProviderDownError, match="timed out"):
        client.request("POST", "/create", json={}, idempotent=False)
    assert calls == [1] and sleep.sleeps == []


def test_4xx_is_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(404, json={"error": "nope"})

    client, sleep = make_client(handler)
    with pytest.raises(NotFoundError):
        client.request("GET", "/x", idempotent=True)
    assert calls == [1] and sleep.sleeps == []


def test_ok_statuses_are_returned_to_the_caller() -> None:
    client, _ = make_client(lambda r: httpx.Response(404, json={"error": "no_such_instance"}))
    assert client.request("DELETE", "/x", idempotent=True, ok_statuses=(404,)).status_code == 404


def test_a_provider_error_mapper_runs_first_and_is_redacted() -> None:
    def mapper(response: httpx.Response) -> ProviderError | None:
        return AuthError(f"mapped: {response.text}")

    client, _ = make_client(lambda r: httpx.Response(400, text=f"key {KEY} invalid"), error_mapper=mapper)
    with pytest.raises(AuthError) as err:
        client.request("GET", "/x", idempotent=True)
    assert KEY not in str(err.value) and err.value.provider == "testcloud"


def test_non_json_success_is_a_provider_fault() -> None:
    client, _ = make_client(lambda r: httpx.Response(200, text="<html>maintenance</html>"))
    with pytest.raises(ProviderDownError, match="not JSON"):
        client.json("GET", "/x", idempotent=True)


def test_parse_retry_after() -> None:
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 02 Dec 2026 10:00:10 GMT", now=1796205600.0) == pytest.approx(10.0)


def test_full_jitter_backoff_stays_within_bounds() -> None:
    client, _ = make_client(lambda r: httpx.Response(200))
    for attempt in range(8):
        for _ in range(50):
            assert 0.0 <= client.backoff_s(attempt) <= min(8.0, 0.5 * 2**attempt)
    assert client.backoff_s(0, retry_after=4.0) >= 4.0
