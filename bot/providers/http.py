"""The one HTTP request helper every cloud client uses.

Every call answers within its deadline (``deadline_s``, TUNEBOT_PROVIDER_TIMEOUT, 10 s by default),
retries included: each attempt's timeouts are at most what is left of it (``timeout_s`` per attempt, the
connection at most CONNECT_S), so an unreachable or hanging cloud API costs a command seconds, not minutes.
Idempotent calls are retried within that deadline on connection errors, timeouts, 429 and 5xx with
exponential backoff and full jitter (a 429's Retry-After is honoured when it fits the deadline; without one
we back off anyway). A call that gets no HTTP answer at all raises ProviderDownError with ``unreachable``
set. Create calls are never retried here: a create that timed out may have created something, and only the
caller can look for it by label first (see ``lifecycle.ensure_launched``).

Pacing: a client built with ``min_interval_s`` (a cloud's documented rate limit, bot/providers/spec.py)
keeps at least that gap between two requests, across threads. ``reads_once()`` makes identical idempotent
requests of one thread send once (a listing per GPU count reads endpoints that ignore the count).

Low-level httpx errors are translated once, here, into the typed errors of ``base``; every message
and log line goes through ``redact`` so an API key never leaks.
"""

from __future__ import annotations

import functools
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from bot.providers.base import (
    AuthError,
    InvalidRequestError,
    NotFoundError,
    ProviderDownError,
    ProviderError,
    RateLimitedError,
    redact,
)

try:  # several times faster on large search answers (5,000 Vast offers is ~2.5 MB of JSON)
    from orjson import OPT_SORT_KEYS
    from orjson import dumps as _odumps
    from orjson import loads as _loads

    def _canonical(value: Any) -> bytes:
        return _odumps(value, option=OPT_SORT_KEYS)
except ImportError:  # pragma: no cover - orjson is a dependency; plain json still works
    import json as _json
    from json import loads as _loads

    def _canonical(value: Any) -> bytes:
        return _json.dumps(value, sort_keys=True, default=str).encode()


log = logging.getLogger("tunebot.providers.http")

# A provider-specific translator sees every non-2xx response (and 2xx ones via ``check``) first.
ErrorMapper = Callable[[httpx.Response], ProviderError | None]


CONNECT_S = 5.0  # a cloud API that does not accept the connection in this long is not answering
MIN_ATTEMPT_S = 0.05  # an attempt's least timeout


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # total tries for an idempotent call
    base_s: float = 0.5
    max_s: float = 20.0
    max_retry_after_s: float = 60.0  # a longer Retry-After is raised to the caller instead of slept


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or garbled."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One verified TLS context for every client (building one per client costs ~100 ms)."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class HttpClient:
    """A bearer-authenticated JSON client for one provider, with bounded retries."""

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        api_key: str | None,
        timeout_s: float = 10.0,
        deadline_s: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        error_mapper: ErrorMapper | None = None,
        extra_secrets: tuple[str, ...] = (),
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self.min_interval_s = max(0.0, float(min_interval_s))
        self._clock = clock
        self._pace_lock = threading.Lock()
        self._next_slot = float("-inf")
        self._local = threading.local()
        self.base_url = base_url.rstrip("/")
        self.timeout_s = max(MIN_ATTEMPT_S, float(timeout_s))  # one attempt
        self.deadline_s = max(0.1, float(deadline_s))  # a whole call, retries included
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._error_mapper = error_mapper
        self._secrets = (api_key, *extra_secrets)
        headers = {"Accept": "application/json", "User-Agent": "tunebot"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=self._timeout(self.deadline_s),  # each request passes its own (``_request``)
            transport=transport,
            verify=_tls_context() if transport is None else True,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._client.close()

    # -- helpers -----------------------------------------------------------------------------------
    def _timeout(self, left_s: float) -> httpx.Timeout:
        """One attempt's timeouts: ``timeout_s``, at most what is left of the call's deadline (the connection
        at most CONNECT_S)."""
        left_s = max(MIN_ATTEMPT_S, min(left_s, self.timeout_s))
        return httpx.Timeout(left_s, connect=min(CONNECT_S, left_s))

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def backoff_s(self, attempt: int, retry_after: float | None = None) -> float:
        """Full jitter: uniform(0, min(max, base * 2**attempt)); never less than a given Retry-After."""
        jitter = self._rng.uniform(0.0, min(self.retry.max_s, self.retry.base_s * (2**attempt)))
        if retry_after is not None:
            return max(retry_after, jitter)
        return jitter

    def _error(
        self, cls: type[ProviderError], message: str, *, retry_after: float | None = None
    ) -> ProviderError:
        return cls(
            self.redact(f"{self.provider}: {message}"), provider=self.provider, retry_after=retry_after
        )

    def _unreachable(self, message: str) -> ProviderDownError:
        return ProviderDownError(
            self.redact(f"{self.provider}: {message}"), provider=self.provider, unreachable=True
        )

    def scrubbed(self, response: httpx.Response) -> httpx.Response:
        """The response with every secret taken out of its body, before anyone cuts the body short (a value
        cut in half by a 200-character excerpt would no longer be recognised, and half a key is a leak)."""
        text = response.text
        clean = self.redact(text)
        if clean == text:
            return response
        dropped = ("content-encoding", "content-length")  # the new body is plain and of another length
        headers = {k: v for k, v in response.headers.items() if k.lower() not in dropped}
        return httpx.Response(
            response.status_code, headers=headers, content=clean.encode(), request=response.request
        )

    def error_from_response(self, response: httpx.Response) -> ProviderError:
        """The typed error for a failed response: the provider's mapper first, then the status code."""
        response = self.scrubbed(response)
        if self._error_mapper is not None:
            mapped = self._error_mapper(response)
            if mapped is not None:
                mapped.args = (self.redact(str(mapped)),)
                mapped.provider = mapped.provider or self.provider
                return mapped
        code = response.status_code
        detail = _short(response.text)
        where = f"{response.request.method} {response.request.url.path}"
        if code in (401, 403):
            return self._error(AuthError, f"the API key was rejected (HTTP {code})")
        if code in (404, 410):
            return self._error(NotFoundError, f"{where}: not found (HTTP {code})")
        if code == 429:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            return self._error(
                RateLimitedError, f"rate limited (HTTP 429): {detail}", retry_after=retry_after
            )
        if code >= 500:
            return self._error(ProviderDownError, f"{where}: server error HTTP {code}: {detail}")
        return self._error(InvalidRequestError, f"{where}: rejected (HTTP {code}): {detail}")

    # -- pacing and shared reads ----------------------------------------------------------------------
    def _pace(self) -> None:
        """Wait for this client's next request slot: ``min_interval_s`` after the previous one's."""
        if self.min_interval_s <= 0:
            return
        with self._pace_lock:
            now = self._clock()
            slot = max(now, self._next_slot)
            self._next_slot = slot + self.min_interval_s
        if slot > now:
            self._sleep(slot - now)

    @contextmanager
    def reads_once(self) -> Iterator[None]:
        """Inside the block, this thread's identical idempotent requests (method, path, params, body) are
        sent once and the answer reused; nested blocks share the outer one's answers."""
        outer = getattr(self._local, "memo", None)
        self._local.memo = {} if outer is None else outer
        try:
            yield
        finally:
            self._local.memo = outer

    # -- the one request path ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> httpx.Response:
        """Send one request (retrying idempotent ones) and return a 2xx response or raise a typed error.

        ``ok_statuses`` lists extra codes the caller wants to inspect itself (e.g. 404 = already gone).
        """
        memo = getattr(self._local, "memo", None) if idempotent else None
        if memo is None:
            return self._request(method, path, idempotent, json, params, ok_statuses)
        key = (method, path, _canonical(sorted((params or {}).items())), _canonical(json), ok_statuses)
        if key not in memo:
            memo[key] = self._request(method, path, idempotent, json, params, ok_statuses)
        return memo[key]

    def _request(
        self,
        method: str,
        path: str,
        idempotent: bool,
        json: Any,
        params: Mapping[str, Any] | None,
        ok_statuses: tuple[int, ...],
    ) -> httpx.Response:
        attempts = self.retry.attempts if idempotent else 1
        last: ProviderError | None = None
        started = self._clock()
        for attempt in range(attempts):
            retry_after: float | None = None
            self._pace()
            left = self.deadline_s - (self._clock() - started)
            try:
                response = self._client.request(
                    method, path, json=json, params=params, timeout=self._timeout(left)
                )
            except httpx.TimeoutException as exc:
                last = self._unreachable(f"{method} {path}: timed out, no answer ({type(exc).__name__})")
                cause: BaseException = exc
            except httpx.TransportError as exc:  # connect errors, resets, protocol errors
                last = self._unreachable(
                    f"{method} {path}: connection failed ({type(exc).__name__}: {_short(str(exc), 120)})"
                )
                cause = exc
            except httpx.HTTPError as exc:  # anything else httpx raises (e.g. bad URL): not retryable
                raise self._error(InvalidRequestError, f"{method} {path}: {type(exc).__name__}") from exc
            else:
                if response.is_success or response.status_code in ok_statuses:
                    return response
                error = self.error_from_response(response)
                retryable = response.status_code == 429 or response.status_code >= 500
                if not (retryable and isinstance(error, RateLimitedError | ProviderDownError)):
                    raise error
                last = error
                retry_after = error.retry_after
                cause = httpx.HTTPStatusError(
                    f"HTTP {response.status_code}", request=response.request, response=response
                )
                if retry_after is not None and retry_after > self.retry.max_retry_after_s:
                    raise error from cause
            if attempt + 1 >= attempts:
                raise last from cause
            delay = self.backoff_s(attempt, retry_after)
            # The call answers within its deadline: no attempt is started with less than an attempt's least
            # timeout left (it would run past the deadline by the difference; seen in CI: 0.023 s left, 0.05 s
            # given).
            if self._clock() - started + delay + MIN_ATTEMPT_S > self.deadline_s:
                raise last from cause
            log.info(
                "%s",
                self.redact(f"{self.provider}: {last}; retry {attempt + 1}/{attempts - 1} in {delay:.2f}s"),
            )
            self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def json(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> Any:
        """Like ``request`` but decoded; a non-JSON 2xx body is a provider fault, not a crash."""
        response = self.request(
            method, path, idempotent=idempotent, json=json, params=params, ok_statuses=ok_statuses
        )
        return self.decode(response)

    def decode(self, response: httpx.Response) -> Any:
        if not response.content:
            return None
        try:
            return _loads(response.content)
        except ValueError as exc:
            raise self._error(
                ProviderDownError,
                f"HTTP {response.status_code}: the body is not JSON: {_short(response.text, 120)}",
            ) from exc
