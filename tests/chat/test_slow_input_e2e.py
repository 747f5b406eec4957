"""Issue 28, item 6: slow input costs its sender, not the team. Played as a member with a dataset server of
their own (a real socket on 127.0.0.1 that sends a byte every quarter second), through the real Slack HTTP
app and engine.

On eac3cff the dataset read checked TUNEBOT_DATASET_READ_SECONDS only between reads of 64 KB: each such
estimate held a slow-work thread for as long as the server kept sending.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.slow_http import slow_server

from . import test_members_e2e as members
from .test_members_e2e import ALICE, LAUNCH, MALLORY

make_stack, shared = members.make_stack, members.shared  # the Slack stack's fixtures

ROWS = "\n".join(json.dumps({"instruction": "Hi?", "output": "Hi there! " * 20}) for _ in range(100)) + "\n"


def _wait(predicate, what: str, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout:g} s for {what}")


@pytest.fixture
def read_seconds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """TUNEBOT_DATASET_READ_SECONDS as the planner reads it (the process's settings)."""
    from bot.settings import get_settings

    def use(seconds: str) -> None:
        monkeypatch.setenv("TUNEBOT_DATASET_READ_SECONDS", seconds)
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()


def test_a_dataset_server_sending_a_byte_at_a_time_gets_a_refusal_and_frees_its_thread(
    make_stack, read_seconds
) -> None:
    read_seconds("2")
    with slow_server(ROWS.encode(), every_s=0.25) as server:
        stack = make_stack(
            TUNEBOT_CHAT_STORAGE_PREFIXES=f"http://127.0.0.1:{server.port}/",
            TUNEBOT_DATASET_READ_SECONDS="2",
        )
        before = len(stack.slack.of("response"))
        assert stack.command(f"estimate {LAUNCH} dataset={server.url()}", user=MALLORY).status_code == 200
        _wait(lambda: len(stack.slack.of("response")) > before, "the answer to the slow estimate")
        answer = json.dumps(stack.slack.of("response")[before].body)
        assert "took longer than 2 s" in answer and "TUNEBOT_DATASET_READ_SECONDS" in answer, answer
        _wait(lambda: stack.chat.slow.running(MALLORY) == 0, "the slow-work thread to be given back", 30)
        _wait(lambda: server.open_connections == 0, "the connection to the server to be closed", 30)


def test_one_member_flooding_slow_estimates_does_not_stop_anothers(
    make_stack, shared: Path, read_seconds
) -> None:
    """Four slow requests from one member (the pool has four threads) hold at most TUNEBOT_SLOW_PER_USER of
    them; another member's estimate is answered meanwhile, and so is a clone (it estimates too)."""
    read_seconds("600")  # her reads block for as long as her server keeps sending
    with slow_server(ROWS.encode(), every_s=0.25, give_up_s=60) as server:
        stack = make_stack(
            TUNEBOT_CHAT_STORAGE_PREFIXES=f"http://127.0.0.1:{server.port}/",
            TUNEBOT_SLOW_WORKERS="4",
            TUNEBOT_SLOW_PER_USER="2",
        )
        for _ in range(4):
            assert stack.command(f"estimate {LAUNCH} dataset={server.url()}", user=MALLORY).status_code == 200
        _wait(lambda: server.requests >= 2, "her first two reads to start")
        assert stack.chat.slow.running(MALLORY) == 2  # the other two wait their turn, holding no thread
        assert "Launching job" in stack.launch(f"{LAUNCH} dataset=alice-private.jsonl", user=ALICE)
        (job,) = stack.engine.list_jobs()
        before = len(stack.slack.of("response"))
        assert stack.command(f"clone {job.job_id} lr=1e-4", user=ALICE).status_code == 200
        _wait(
            lambda: any("launch_cheapest" in json.dumps(c.body) for c in stack.slack.of("response")[before:]),
            "Alice's clone to be estimated while Mallory's four wait",
            60,
        )
        assert stack.chat.slow.running(MALLORY) == 2  # still hers alone: two threads, two waiting
