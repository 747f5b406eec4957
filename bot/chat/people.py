"""People by name: a Slack user id -> the display name people know, for where a mention does not render.

``<@U123>`` renders as the member's current name in message text, App Home text and table cells (a
``user`` element), but not in plain text (headers, buttons, modal labels) nor in a PNG chart. There the
renderer asks ``People``: ``users.info`` (scope ``users:read``, Tier 4) gives ``profile.display_name`` or
``real_name``. Names are cached (an hour; a failed lookup for a minute) so a table of twenty jobs costs
at most one call per person. Anything that is not a Slack user id (console names) is its own name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from bot.chat.escaping import USER_ID

log = logging.getLogger(__name__)

Lookup = Callable[[str], dict[str, Any] | None]  # user id -> users.info's "user" object (None: unknown)


def display_name(user: dict[str, Any]) -> str | None:
    """What Slack shows for a member: the display name, else the real name, else the handle."""
    profile = user.get("profile") or {}
    for value in (
        profile.get("display_name"),
        profile.get("real_name"),
        user.get("real_name"),
        user.get("name"),
    ):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


class People:
    """Display names by user id, cached; thread-safe (the notifier and the listeners' threads share it)."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        ttl_s: float = 3600.0,
        miss_ttl_s: float = 60.0,
        max_items: int = 5000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lookup = lookup
        self.ttl_s = ttl_s
        self.miss_ttl_s = miss_ttl_s
        self.max_items = max_items
        self.clock = clock
        self.calls = 0  # lookups made (tests, logs)
        self._cache: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def slack(cls, client: Any) -> People:
        """Names from Slack's users.info through a (synchronous) WebClient."""
        from slack_sdk.errors import SlackApiError

        def lookup(user_id: str) -> dict[str, Any] | None:
            try:
                return client.users_info(user=user_id).get("user")  # type: ignore[no-any-return]
            except SlackApiError as exc:
                log.info("users.info %s: %s", user_id, (exc.response or {}).get("error"))
                return None

        return cls(lookup)

    def __call__(self, user: str) -> str:
        return self.name(user)

    def name(self, user: str) -> str:
        """The person's display name; the id itself when Slack does not know it (or it is no Slack id)."""
        if not USER_ID.match(user or ""):
            return user
        now = self.clock()
        with self._lock:
            hit = self._cache.get(user)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            self.calls += 1
            found = self.lookup(user)
        except Exception:  # noqa: BLE001 - a name is a nicety: the id will do
            log.warning("could not look up %s", user, exc_info=True)
            found = None
        name = display_name(found) if found else None
        with self._lock:
            self._cache[user] = (now + (self.ttl_s if name else self.miss_ttl_s), name or user)
            self._cache.move_to_end(user)
            while len(self._cache) > self.max_items:
                self._cache.popitem(last=False)
        return name or user
