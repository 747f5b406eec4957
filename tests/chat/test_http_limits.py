"""bot.web under real uvicorn: nothing is read or parsed before it is authenticated and known to be small.

Bodies are sent over a plain socket (fakes.serve_process.raw_post) so a test sees how much of a body the
server took before it answered: an over-cap body is refused with 413 after a few socket buffers, not
after 64 MB; an unauthenticated one with 401 the same way; malformed or deeply nested JSON is a 400.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest
from fakes.serve_process import raw_post, zeros
from fakes.worlds import RUNNER_TOKEN, SlackStack, serve_web, sign

from bot.web import create_app

BIG = 64 << 20  # the old server read (and held) every byte of it before looking at anything
TOOK_AT_MOST = 16 << 20  # socket buffers on loopback, not the body
NESTED = "[" * 50_000 + "]" * 50_000


def trickle(total: int, piece: int = 100) -> Iterator[bytes]:
    for _ in range(0, total, piece):
        time.sleep(0.05)
        yield b"0" * piece


def port_of(stack: SlackStack) -> int:
    return int(stack.url.rsplit(":", 1)[1])


def slack_headers(body: bytes = b"not the body sent", **extra: str) -> dict[str, str]:
    return {"Content-Type": "application/json", **sign(body.decode()), **extra}


RUNNER = {"Authorization": f"Bearer {RUNNER_TOKEN}", "Content-Type": "application/json"}


@pytest.mark.parametrize("path", ["/slack/events", "/runner/events"])
def test_an_over_cap_body_is_413_before_it_is_read(slack_stack: SlackStack, path: str) -> None:
    headers = slack_headers() if path == "/slack/events" else RUNNER
    declared = raw_post(
        port_of(slack_stack), path, {**headers, "Content-Length": str(BIG)}, zeros(BIG), timeout=20
    )
    assert declared["status"] == 413, declared
    assert declared["sent"] <= TOOK_AT_MOST, declared  # answered after a few socket buffers of 64 MB
    chunked = raw_post(port_of(slack_stack), path, headers, zeros(BIG, 1 << 16), chunked=True, timeout=20)
    assert chunked["status"] == 413, chunked  # no Content-Length: the read stops at the cap
    assert chunked["sent"] <= TOOK_AT_MOST, chunked


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/runner/events", {}),
        ("/runner/events", {"Authorization": "Bearer"}),
        ("/runner/events", {"Authorization": "Basic dXNlcjpwYXNz"}),
        ("/runner/events", {"Authorization": "Bearer short"}),
        ("/runner/events", {"Authorization": "Bearer " + "A" * 40 + "!"}),
        ("/slack/events", {}),
        ("/slack/events", {"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=zz"}),
        ("/slack/events", sign("x", timestamp=int(time.time()) - 600)),  # stale: a replay
    ],
)
def test_a_bad_or_missing_credential_is_401_before_the_body(
    slack_stack: SlackStack, path: str, headers: dict[str, str]
) -> None:
    result = raw_post(
        port_of(slack_stack), path, {**headers, "Content-Length": str(BIG)}, zeros(BIG), timeout=20
    )
    assert result["status"] == 401, result
    assert result["sent"] <= TOOK_AT_MOST, result


def test_malformed_or_deeply_nested_json_is_400_never_500(
    slack_stack: SlackStack, caplog: pytest.LogCaptureFixture
) -> None:
    http, url = slack_stack.http, slack_stack.url
    with caplog.at_level(logging.ERROR):
        for body in (NESTED, '{"job_id": ' + NESTED + "}", "{", b"\xff\xfe", "[1, 2]", '{"job_id": 7}'):
            resp = http.post(url + "/runner/events", content=body, headers=RUNNER)
            assert resp.status_code == 400, (body[:20], resp.status_code, resp.text)
        # Slack: unsigned garbage is refused before any parse; signed garbage (only Slack can send it): 400
        assert http.post(url + "/slack/events", content=NESTED, headers=slack_headers()).status_code == 401
        signed = http.post(url + "/slack/events", content=NESTED, headers=slack_headers(NESTED.encode()))
        assert signed.status_code == 400, signed.text
        form = urlencode({"payload": NESTED})
        signed_form = http.post(
            url + "/slack/events",
            content=form,
            headers={"Content-Type": "application/x-www-form-urlencoded", **sign(form)},
        )
        assert signed_form.status_code == 400, signed_form.text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert slack_stack.command("help").status_code == 200  # the real thing still works


def test_the_runner_token_is_checked_before_the_body_and_must_be_the_events_job() -> None:
    seen: list[str] = []
    recorded: list[str] = []

    def owner(token: str) -> str | None:
        seen.append(token)
        return "j1" if token == RUNNER_TOKEN else None

    def record(job_id: str, token: str, payload: dict) -> bool:
        recorded.append(job_id)
        return True

    with serve_web(record_runner_event=record, runner_token_job=owner, max_body_bytes=4096) as server:
        port = int(server.url.rsplit(":", 1)[1])
        unknown = {"Authorization": "Bearer " + "B" * 43, "Content-Length": "4000"}
        result = raw_post(port, "/runner/events", unknown, trickle(4000), timeout=20)
        assert result["status"] == 401 and result["sent"] < 4000, result  # answered before the body came
        assert seen == ["B" * 43]
        event = {"job_id": "j1", "seq": 1, "kind": "progress", "step": 1}
        ok = httpx.post(server.url + "/runner/events", json=event, headers=RUNNER)
        assert ok.status_code == 200 and recorded == ["j1"]
        other = httpx.post(server.url + "/runner/events", json={**event, "job_id": "j2"}, headers=RUNNER)
        assert other.status_code == 401 and recorded == ["j1"]  # a job's token speaks only for that job
        big = httpx.post(
            server.url + "/runner/events", content=json.dumps({**event, "pad": "x" * 5000}), headers=RUNNER
        )
        assert big.status_code == 413  # the cap is the app's setting (TUNEBOT_HTTP_MAX_BODY_KB)


def test_http_mode_without_a_signing_secret_cannot_be_built() -> None:
    class Bolt:
        _signing_secret = "  "

    with pytest.raises(ValueError, match="SLACK_SIGNING_SECRET"):
        create_app(bolt_app=Bolt())
