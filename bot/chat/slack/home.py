"""App Home kept current: published when a person opens it and again when what it shows changes.

A job changing state (created, started, preempted, finished, ...) changes its owner's Home and every
admin's (they see all running jobs). ``changed`` marks those people dirty; a worker thread publishes
each dirty Home at most once every ``min_interval_s`` per person and ``spacing_s`` apart overall, so a
burst of events becomes one ``views.publish`` per person (views.publish is Tier 4, about 100 a minute).
Only people who opened their Home since this process started are refreshed: Slack shows the last
published view, and an open always publishes a fresh one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from bot.chat.blockkit import to_home_view

log = logging.getLogger(__name__)


class HomePublisher:
    def __init__(
        self,
        chat: Any,  # ChatHandlers: .home(user) -> Reply, .names
        client: Any,  # a synchronous slack_sdk WebClient (429s retried by its handler)
        *,
        admins: Iterable[str] = (),
        min_interval_s: float = 10.0,
        spacing_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.chat = chat
        self.client = client
        self.admins = set(admins)
        self.min_interval_s = min_interval_s
        self.spacing_s = spacing_s
        self.clock = clock
        self.published = 0
        self._seen: set[str] = set()
        self._dirty: set[str] = set()
        self._last: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- what happened ----------------------------------------------------------------------------
    def opened(self, user: str) -> None:
        """The person opened their Home (the listener publishes it at once): refresh it from now on."""
        with self._cond:
            self._seen.add(user)
            self._last[user] = self.clock()
            self._dirty.discard(user)

    def changed(self, owner: str | None) -> None:
        """A job of ``owner`` changed state: its owner's Home and the admins' are out of date."""
        with self._cond:
            self._dirty |= ({owner} | self.admins) & self._seen if owner else self.admins & self._seen
            if self._dirty:
                self._cond.notify_all()

    # ---- the worker -------------------------------------------------------------------------------
    def start(self) -> HomePublisher:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="slack-home", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def due(self) -> tuple[str | None, float]:
        """The next dirty person whose interval has passed, or None and how long to wait."""
        now = self.clock()
        wait = 3600.0
        for user in sorted(self._dirty):
            left = self._last.get(user, -1e9) + self.min_interval_s - now
            if left <= 0:
                return user, 0.0
            wait = min(wait, left)
        return None, wait

    def _run(self) -> None:
        while True:
            with self._cond:
                user, wait = self.due()
                while user is None and not self._stop:
                    self._cond.wait(wait if self._dirty else None)
                    user, wait = self.due()
                if self._stop:
                    return
                self._dirty.discard(user)  # type: ignore[arg-type]
                self._last[user] = self.clock()  # type: ignore[index]
            self.publish(user)  # type: ignore[arg-type]
            time.sleep(self.spacing_s)

    def publish(self, user: str) -> None:
        try:
            view = to_home_view(self.chat.home(user), names=self.chat.names)
            self.client.views_publish(user_id=user, view=view)
            self.published += 1
        except Exception:  # noqa: BLE001 - the next change or open publishes again
            log.exception("could not refresh the App Home of %s", user)
