"""One ASGI app (Starlette): POST /slack/events, POST /runner/events, GET /healthz.

/slack/events goes to bolt's AsyncSlackRequestHandler (signature checked there: 401 when wrong or
older than 5 minutes). /runner/events takes a runner's RunnerEvent with the job's bearer token and
hands it to ``Engine.record_runner_event``; a bad token is 401, and the token never reaches a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)

RecordRunnerEvent = Callable[[str, str, dict[str, Any]], bool]


def create_app(
    *, bolt_app: Any | None = None, record_runner_event: RecordRunnerEvent | None = None
) -> Starlette:
    handler = None
    if bolt_app is not None:
        from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler

        handler = AsyncSlackRequestHandler(bolt_app)

    async def slack_events(request: Request) -> Response:
        if handler is None:
            return JSONResponse({"error": "Slack is not configured"}, status_code=404)
        return await handler.handle(request)

    async def runner_events(request: Request) -> Response:
        if record_runner_event is None:
            return JSONResponse({"error": "no engine"}, status_code=503)
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return JSONResponse({"error": "missing bearer token"}, status_code=401)
        try:
            payload = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "body is not JSON"}, status_code=400)
        if not isinstance(payload, dict) or not isinstance(payload.get("job_id"), str):
            return JSONResponse({"error": "expected a RunnerEvent object with job_id"}, status_code=400)
        try:
            ok = await asyncio.to_thread(record_runner_event, payload["job_id"], token.strip(), payload)
        except ValueError as exc:  # a malformed event: the runner should not retry it
            return JSONResponse({"error": f"invalid event: {type(exc).__name__}"}, status_code=400)
        except Exception:  # noqa: BLE001 - the runner retries; the log says why
            log.exception("could not record a runner event for job %s", payload.get("job_id"))
            return JSONResponse({"error": "could not record the event"}, status_code=500)
        if not ok:
            return JSONResponse({"error": "invalid token"}, status_code=401)
        return JSONResponse({"ok": True})

    async def healthz(request: Request) -> Response:
        return JSONResponse(
            {"ok": True, "slack": handler is not None, "engine": record_runner_event is not None}
        )

    return Starlette(
        routes=[
            Route("/slack/events", slack_events, methods=["POST"]),
            Route("/runner/events", runner_events, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
