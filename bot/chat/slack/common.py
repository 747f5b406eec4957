"""Small helpers the listeners share: who acted, and how the slow part runs after the ack.

The app runs with ``process_before_response=True``: a listener's HTTP response goes out as soon as the
listener returns (no 10 ms ack polling), so each listener acks, hands its slow part to ``after_ack``
(an asyncio task that runs the synchronous chat handler in a thread and replies via respond() or the
Web API) and returns at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from logging import Logger
from typing import Any, TypeVar

from bot.chat.blockkit import Names, to_message
from bot.chat.handlers import GENERIC_ERROR, Actor, ChatHandlers
from bot.chat.replies import Reply, error_reply
from bot.chat.slowwork import SlowWork

T = TypeVar("T")
_background: set[asyncio.Task[Any]] = set()  # strong references until the tasks finish


def chat_of(context: Any) -> ChatHandlers:
    return context["chat"]  # type: ignore[no-any-return]


def actor_of(body: dict[str, Any]) -> Actor:
    """The acting user, channel and workspace of a slash command or an interactivity payload: only from the
    signed request itself, never from a button's value (team budgets are keyed by the workspace's id)."""
    user = body.get("user_id") or (body.get("user") or {}).get("id") or "unknown"
    channel = body.get("channel_id") or (body.get("channel") or {}).get("id")
    team = body.get("team_id") or (body.get("team") or {}).get("id")
    team = team or (body.get("user") or {}).get("team_id")
    return Actor(str(user), channel, team=str(team) if team else None)


AFTER_ACK_DELAY_S = 0.1  # bench/slack_ack.py: a burst's p99 ack drops by about a fifth with it


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Engine calls are synchronous: keep them off the event loop in a worker thread."""
    return await asyncio.to_thread(fn, *args)


async def send(
    respond: Any, reply: Reply, *, replace_original: bool = False, names: Names | None = None
) -> None:
    """The reply through the response_url; rendered in a thread when names are looked up (users.info)."""
    message = (
        await in_thread(functools.partial(to_message, names=names), reply) if names else to_message(reply)
    )
    await respond(
        **message,
        response_type="in_channel" if reply.public else "ephemeral",
        replace_original=replace_original,
    )


def spawn(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def drain_background(timeout: float = 10.0) -> None:
    """Wait for the work started after acks (shutdown, tests)."""
    if _background:
        await asyncio.wait(list(_background), timeout=timeout)


def dm_responder(client: Any, user: str, *, home: Any = None) -> Callable[..., Awaitable[None]]:
    """A respond()-like sender for clicks without a response_url (buttons in App Home): the outcome goes
    to the person by DM, and their Home is published again (it shows what changed)."""

    async def respond(**message: Any) -> None:
        message.pop("response_type", None)
        message.pop("replace_original", None)
        opened = await client.conversations_open(users=user)
        await client.chat_postMessage(channel=opened["channel"]["id"], unfurl_links=False, **message)
        if home is not None:
            await in_thread(home.publish, user)

    return respond


def after_ack(
    fn: Callable[..., Reply],
    *args: Any,
    respond: Any,
    logger: Logger,
    what: str,
    replace: Callable[[Reply], bool] | bool = False,
    names: Names | None = None,
    slow: SlowWork | None = None,
    user: str = "",
    after: Callable[[Reply], Awaitable[None]] | None = None,
) -> None:
    """Run ``fn(*args)`` in a thread after the ack and send its reply (people by ``names`` where mentions
    do not render); failures get a friendly line. Slow work (``slow``: estimates, launches) runs on that
    pool for ``user``, never on the shared executor. ``after``: what follows the reply (a chart's upload)."""

    async def run() -> None:
        try:
            # A burst of commands gets all its acks out before the first one's slow part starts.
            await asyncio.sleep(AFTER_ACK_DELAY_S)
            reply = await (slow.run(fn, *args, user=user) if slow is not None else in_thread(fn, *args))
            again = replace(reply) if callable(replace) else replace
            await send(respond, reply, replace_original=again, names=names)
            if after is not None:
                await after(reply)
        except Exception:  # noqa: BLE001 - the person gets a friendly line, the log the details
            logger.exception("%s failed after the ack", what)
            try:
                await send(respond, error_reply(GENERIC_ERROR))
            except Exception:  # noqa: BLE001
                logger.exception("could not tell the person that %s failed", what)

    spawn(run())
