"""One ASGI app (Starlette): POST /slack/events, POST /runner/events, GET /healthz.

Nothing is read or parsed before it is authenticated and known to be small (docs/slack-setup.md,
"Limits on what the bot reads"). Each POST first checks its authentication header (format, and for
runners the token's value) and Content-Length; a body over the cap (TUNEBOT_HTTP_MAX_BODY_KB) is 413
without being buffered, a chunked one included (the read stops at the cap). /slack/events then verifies
Slack's signature over the body (401 when wrong or older than 5 minutes) before bolt parses it;
/runner/events parses the RunnerEvent and hands it to ``Engine.record_runner_event``. Malformed or deeply
nested JSON is a 400, never a 500; the token never reaches a log, and what a client sent is logged only
quoted (``repr``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bot.engine.ids import is_job_id, shown

log = logging.getLogger(__name__)

RecordRunnerEvent = Callable[[str, str, dict[str, Any]], bool]
RunnerTokenJob = Callable[[str], "str | None"]  # the job a bearer token belongs to, None for none

MAX_BODY_BYTES = 1 << 20  # Slack's payloads are well under 1 MB; a RunnerEvent is a few KB
SLACK_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
SLACK_TIMESTAMP = re.compile(r"[0-9]{1,12}")
BEARER_TOKEN = re.compile(r"[A-Za-z0-9_\-.~+/]{16,512}={0,2}")  # secrets.token_urlsafe and the like


class BodyTooLarge(Exception):
    """The request body is over the cap (declared or actual)."""


class BadLength(Exception):
    """Content-Length is not a number."""


async def read_body(request: Request, cap: int) -> bytes:
    """The body, read in the server's chunks and never more than ``cap`` bytes of it: BodyTooLarge as soon
    as the declared length or the bytes received go over (the rest is never read)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise BadLength
        if int(declared) > cap:
            raise BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise BodyTooLarge
    return bytes(body)


def declared_too_large(request: Request, cap: int) -> bool:
    declared = request.headers.get("content-length", "").strip()
    return declared.isdigit() and int(declared) > cap


def parse_json(text: bytes | str) -> Any:
    """JSON, or ValueError for anything that is not (nested too deeply included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def slack_body_ok(body: bytes, content_type: str) -> bool:
    """Whether bolt can parse the body: JSON, or a form whose ``payload`` (if any) is JSON."""
    try:
        text = body.decode("utf-8")
        if content_type.startswith("application/json"):
            parse_json(text)
        else:
            payload = parse_qs(text, keep_blank_values=True).get("payload")
            if payload:
                parse_json(payload[0])
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return True


def _error(status: int, message: str) -> JSONResponse:
    # Connection: close for refusals before the body was read: the rest of it is never wanted.
    headers = {"Connection": "close"} if status in (401, 413) else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _Refused(Exception):
    """A request turned away: the status and the message the client gets (``_error``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(
    *,
    bolt_app: Any | None = None,
    record_runner_event: RecordRunnerEvent | None = None,
    runner_token_job: RunnerTokenJob | None = None,
    signing_secret: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The app. ``signing_secret`` defaults to the bolt app's own (HTTP mode needs one: ValueError without);
    ``runner_token_job`` lets /runner/events refuse an unknown token before reading the body."""
    verifier = _slack_verifier(bolt_app, signing_secret) if bolt_app is not None else None

    async def slack_events(request: Request) -> Response:
        if bolt_app is None or verifier is None:
            return _error(404, "Slack is not configured")
        from slack_bolt.adapter.starlette.async_handler import to_async_bolt_request, to_starlette_response

        try:
            body = await _verified_slack_body(request, verifier, max_body_bytes)
        except _Refused as refused:
            return _error(refused.status, refused.message)
        bolt_response = await bolt_app.async_dispatch(to_async_bolt_request(request, body))
        return to_starlette_response(bolt_response)

    async def runner_events(request: Request) -> Response:
        if record_runner_event is None:
            return _error(503, "no engine")
        try:
            token, payload, job_id = await _runner_event(request, runner_token_job, max_body_bytes)
            await _record(record_runner_event, job_id, token, payload)
        except _Refused as refused:
            return _error(refused.status, refused.message)
        return JSONResponse({"ok": True})

    async def healthz(request: Request) -> Response:
        return JSONResponse(
            {"ok": True, "slack": bolt_app is not None, "engine": record_runner_event is not None}
        )

    return Starlette(
        routes=[
            Route("/slack/events", slack_events, methods=["POST"]),
            Route("/runner/events", runner_events, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def _slack_verifier(bolt_app: Any, signing_secret: str | None) -> Any:
    """The SignatureVerifier for the secret bolt verifies with: the same one is checked here, before bolt
    parses anything (ValueError without a secret: no request could be verified)."""
    from slack_sdk.signature import SignatureVerifier

    secret = signing_secret or getattr(bolt_app, "_signing_secret", "") or ""
    if not secret.strip():
        raise ValueError("HTTP mode needs SLACK_SIGNING_SECRET: without it no request can be verified")
    return SignatureVerifier(secret)


async def _verified_slack_body(request: Request, verifier: Any, cap: int) -> bytes:
    """The body of a Slack request, once its signature headers are well formed and recent, the body is
    within the cap, its signature is Slack's and bolt can parse it; ``_Refused`` otherwise."""
    timestamp = request.headers.get("x-slack-request-timestamp", "")
    signature = request.headers.get("x-slack-signature", "")
    if not (SLACK_TIMESTAMP.fullmatch(timestamp) and SLACK_SIGNATURE.fullmatch(signature)):
        raise _Refused(401, "missing or malformed Slack signature")
    if abs(verifier.clock.now() - int(timestamp)) > 60 * 5:
        raise _Refused(401, "stale Slack request")
    body = await _capped_body(request, cap)
    if not verifier.is_valid(body=body, timestamp=timestamp, signature=signature):
        raise _Refused(401, "invalid Slack signature")
    if not slack_body_ok(body, request.headers.get("content-type", "")):
        raise _Refused(400, "body is not a Slack payload")
    return body


async def _capped_body(request: Request, cap: int) -> bytes:
    """``read_body``, its refusals as the client sees them (413 over the cap, 400 a bad length)."""
    try:
        return await read_body(request, cap)
    except BodyTooLarge:
        raise _Refused(413, f"body over {cap:,} bytes") from None
    except BadLength:
        raise _Refused(400, "bad Content-Length") from None


async def _runner_event(
    request: Request, runner_token_job: RunnerTokenJob | None, cap: int
) -> tuple[str, dict[str, Any], str]:
    """(token, event, job id) of a runner's POST, in the order that reads least before it trusts: the
    bearer token's form, the declared length, the token's job, the body, its JSON, its job id; ``_Refused``
    at the first that fails."""
    token = _bearer_token(request)
    if declared_too_large(request, cap):
        raise _Refused(413, f"body over {cap:,} bytes")
    owner = None
    if runner_token_job is not None:
        owner = await asyncio.to_thread(runner_token_job, token)
        if owner is None:
            raise _Refused(401, "invalid token")
    raw = await _capped_body(request, cap)
    try:
        payload = parse_json(raw)
    except ValueError:
        raise _Refused(400, "body is not JSON") from None
    job_id = _event_job_id(payload)
    if owner is not None and job_id != owner:
        raise _Refused(401, "invalid token")
    return token, payload, job_id


def _bearer_token(request: Request) -> str:
    """The token of an ``Authorization: Bearer`` header of the expected form."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not BEARER_TOKEN.fullmatch(token):
        raise _Refused(401, "missing or malformed bearer token")
    return token


def _event_job_id(payload: Any) -> str:
    """The event's job id, checked to be one before any lookup: no NUL to the database, no newline to a
    log."""
    job_id = payload.get("job_id") if isinstance(payload, dict) else None
    if not isinstance(job_id, str):
        raise _Refused(400, "expected a RunnerEvent object with job_id")
    if not is_job_id(job_id):
        raise _Refused(400, "job_id is not a job id")
    return job_id


async def _record(record_runner_event: RecordRunnerEvent, job_id: str, token: str, payload: Any) -> None:
    """Hand the event to the engine: a malformed one is 400 (the runner should not retry it), a failure to
    record it 500 (the runner retries; the log says why), one the engine refuses 401."""
    try:
        ok = await asyncio.to_thread(record_runner_event, job_id, token, payload)
    except (ValueError, RecursionError) as exc:
        raise _Refused(400, f"invalid event: {type(exc).__name__}") from None
    except Exception:  # noqa: BLE001 - the runner retries; the log says why
        log.exception("could not record a runner event for job %s", shown(job_id))
        raise _Refused(500, "could not record the event") from None
    if not ok:
        raise _Refused(401, "invalid token")
