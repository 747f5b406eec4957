"""Slow commands run on their own bounded pool: one person's estimates never hold up another's `/tune jobs`.

Before, every command's slow part ran on asyncio's default executor (min(32, cores + 4) threads): as many
slow estimates as threads (six on a 2-core host) made everyone else's commands wait until one finished.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from fakes.worlds import SlackStack

from bot.chat.replies import text_reply

DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor
SLOW_WORKERS = 4  # TUNEBOT_SLOW_WORKERS's default


def block_estimates(stack: SlackStack, release: threading.Event) -> list[str]:
    started: list[str] = []
    real = stack.engine.estimate

    def slow(request):  # type: ignore[no-untyped-def]
        started.append(request.model)
        release.wait(30)
        return real(request)

    stack.engine.estimate = slow  # type: ignore[method-assign]
    return started


def answered(stack: SlackStack, key: str, timeout: float) -> float | None:
    """Seconds until the response for ``key`` reached Slack (None: not within ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if any(c.path.endswith("/" + key) for c in stack.slack.of("response")):
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def command_as(stack: SlackStack, text: str, user: str, key: str) -> None:
    real = stack.slack.response_url
    stack.slack.response_url = lambda _=None: real(key)  # type: ignore[method-assign]
    try:
        assert stack.command(text, user=user).status_code == 200
    finally:
        stack.slack.response_url = real  # type: ignore[method-assign]


def test_slow_estimates_of_many_people_do_not_block_another_persons_jobs(slack_stack: SlackStack) -> None:
    release = threading.Event()  # set only once Bob is answered: the old code answered him only after it
    started = block_estimates(slack_stack, release)
    try:
        for i in range(DEFAULT_THREADS + 2):
            command_as(slack_stack, f"estimate Llama-3.1-8B tokens={i + 1}M", f"U_SLOW{i}", f"slow{i}")
        deadline = time.monotonic() + 30
        while len(started) < SLOW_WORKERS and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(started) >= SLOW_WORKERS  # the slow pool is full and more are queued
        command_as(slack_stack, "jobs", "U_BOB", "bob")
        waited = answered(slack_stack, "bob", timeout=60)  # while every slow estimate is still held
        assert waited is not None, "`jobs` waited behind the held estimates"
        assert not release.is_set() and not any(
            c.path.endswith("/slow0") for c in slack_stack.slack.of("response")
        )
    finally:
        release.set()
    slack_stack.responses(DEFAULT_THREADS + 3, timeout=30)  # every estimate still gets its answer


def test_one_person_runs_at_most_per_user_slow_commands_at_once_the_rest_wait(
    slack_stack: SlackStack,
) -> None:
    release = threading.Event()
    started = block_estimates(slack_stack, release)
    per_user = 2  # TUNEBOT_SLOW_PER_USER's default
    try:
        for i in range(per_user + 2):
            command_as(slack_stack, f"estimate Llama-3.1-8B tokens={i + 1}M", "U_ALICE", f"a{i}")
        command_as(slack_stack, "estimate Qwen2.5-7B", "U_BOB", "bob")
        pool = slack_stack.chat.slow

        def settled() -> bool:  # Bob's runs, and Alice's two beyond her share wait in the pool's queue
            with pool._lock:
                queued = len(pool._waiting.get("U_ALICE", ()))
            return len(started) >= per_user + 1 and queued == 2

        deadline = time.monotonic() + 30
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(started) == sorted(["Llama-3.1-8B"] * per_user + ["Qwen2.5-7B"]), started
        assert settled(), "Alice's extra estimates are not waiting in the queue"
    finally:
        release.set()
    answers = slack_stack.responses(per_user + 3, timeout=20)  # the waiting ones ran after, none refused
    assert sum("Llama-3.1-8B" in a["text"] for a in answers) == per_user + 2, [a["text"] for a in answers]


def test_the_deadline_answers_and_the_slot_is_given_back_only_when_the_work_ends() -> None:
    from bot.chat.slowwork import SlowWork

    pool = SlowWork(workers=1, per_user=1, deadline_s=0.3)
    done = threading.Event()

    def stuck() -> object:
        done.wait(5)
        return text_reply("late")

    async def scenario() -> None:
        reply = await pool.run(stuck, user="U1")
        assert "took longer than 0.3 s" in reply.fallback and "TUNEBOT_SLOW_DEADLINE" in reply.fallback
        assert pool.running("U1") == 1  # the work is still going: a second one for this person waits
        again = await pool.run(lambda: text_reply("second"), user="U1")
        assert "took longer than" in again.fallback  # it waited for the slot until the deadline: never ran
        pool.waiting_per_user = 0
        busy = await pool.run(lambda: text_reply("third"), user="U1")
        assert "already have 1 estimates or launches running" in busy.fallback
        pool.waiting_per_user = 8
        done.set()
        for _ in range(100):
            if pool.running("U1") == 0:
                break
            await asyncio.sleep(0.02)
        assert pool.running("U1") == 0
        fine = await pool.run(lambda: text_reply("ok"), user="U1")
        assert fine.fallback == "ok"

    asyncio.run(scenario())
    pool.shutdown()
