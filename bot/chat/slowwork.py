"""The slow chat commands' own pool, so one person's estimates never hold up another's `/tune jobs`.

Estimates and launches read datasets, fetch Hub configs and Slack uploads, ask every cloud: seconds each.
Run on asyncio's default executor (``min(32, cores + 4)`` threads: 6 on a 2-core host), six slow estimates
took every thread and everyone else's commands waited behind them. Slow commands run here instead: a
bounded pool (TUNEBOT_SLOW_WORKERS), at most TUNEBOT_SLOW_PER_USER of them per person at once (more wait
their turn on the event loop, holding no thread: a double-clicked launch still answers "already
launched"), and an answer after TUNEBOT_SLOW_DEADLINE whatever the work is doing (the reads themselves
stop at their own limits: runner/contract/reading.py, planner/models.py). Fast commands keep the
default executor.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from bot.chat.replies import Reply, error_reply

T = TypeVar("T")


class SlowWork:
    def __init__(
        self, *, workers: int = 4, per_user: int = 2, deadline_s: float = 120.0, waiting_per_user: int = 8
    ) -> None:
        self.workers = workers
        self.per_user = per_user
        self.deadline_s = deadline_s
        self.waiting_per_user = waiting_per_user
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tunebot-slow")
        self._running: Counter[str] = Counter()
        self._waiting: dict[str, deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> SlowWork:
        return cls(
            workers=settings.slow_workers,
            per_user=settings.slow_per_user,
            deadline_s=settings.slow_deadline_s,
        )

    def running(self, user: str) -> int:
        with self._lock:
            return self._running[user]

    async def _slot(self, user: str) -> None:
        """Wait (on the event loop, holding no thread) until ``user`` has fewer than ``per_user`` running."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._running[user] < self.per_user:
                    self._running[user] += 1
                    return
                queue = self._waiting.setdefault(user, deque())
                if len(queue) >= self.waiting_per_user:
                    raise _TooMany
                waiter: asyncio.Future[None] = loop.create_future()
                queue.append((loop, waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                with self._lock:
                    if (loop, waiter) in queue:
                        queue.remove((loop, waiter))
                    self._wake_one(user)  # a wake-up this waiter may have been given goes to the next
                raise

    def _wake_one(self, user: str) -> None:
        """Wake the next waiter of ``user`` (lock held); it checks the count again itself."""
        queue = self._waiting.get(user)
        while queue:
            loop, waiter = queue.popleft()
            if waiter.done():
                continue
            try:
                loop.call_soon_threadsafe(_resolve, waiter)
                return
            except RuntimeError:  # its loop is closed
                continue
        self._waiting.pop(user, None)

    def _release(self, user: str) -> None:
        with self._lock:
            self._running[user] -= 1
            if self._running[user] <= 0:
                del self._running[user]
            self._wake_one(user)

    async def call(self, fn: Callable[..., T], *args: Any, user: str) -> T:
        """``fn(*args)`` on the pool for ``user``, once they have fewer than ``per_user`` running (later ones
        wait their turn without a thread); SlowWorkRefused when they have too many waiting or after the
        deadline, counted from the request (their slot is given back only when the work really ends)."""

        async def turn() -> T:
            await self._slot(user)
            try:
                future = self._executor.submit(fn, *args)
            except RuntimeError:  # shutting down
                self._release(user)
                raise
            future.add_done_callback(lambda _: self._release(user))
            return await asyncio.wrap_future(future)

        try:
            return await asyncio.wait_for(turn(), self.deadline_s)
        except _TooMany:
            raise SlowWorkRefused(
                f"You already have {self.per_user} estimates or launches running and "
                f"{self.waiting_per_user} waiting; try again when they have answered (TUNEBOT_SLOW_PER_USER)."
            ) from None
        except TimeoutError:
            raise SlowWorkRefused(
                f"This took longer than {self.deadline_s:g} s and was given up (TUNEBOT_SLOW_DEADLINE). "
                "A large dataset or a slow store: give tokens= instead of the dataset, or try again later."
            ) from None

    async def run(self, fn: Callable[..., Reply], *args: Any, user: str) -> Reply:
        """``call`` for a chat handler: a refusal becomes the person's reply."""
        try:
            return await self.call(fn, *args, user=user)
        except SlowWorkRefused as exc:
            return error_reply(str(exc))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class SlowWorkRefused(Exception):
    """Not run, or given up: the person's message says why and which setting governs it."""


class _TooMany(Exception):
    """This person already has ``per_user`` running and ``waiting_per_user`` waiting."""


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
