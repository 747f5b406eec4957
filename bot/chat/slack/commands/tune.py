"""`/tune ...`: ack at once (errors and help in the ack itself), then the slow answer via respond()."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.blockkit import to_message
from bot.chat.grammar import LaunchFormCmd, ParseError, parse
from bot.chat.replies import Image, Reply, error_reply
from bot.chat.slack.common import actor_of, after_ack, chat_of
from bot.chat.slack.views.launch_form import open_launch_form


async def tune_callback(
    ack: AsyncAck,
    command: dict[str, Any],
    respond: AsyncRespond,
    context: Any,
    logger: Logger,
    client: AsyncWebClient,
) -> None:
    chat = chat_of(context)
    actor = actor_of(command)
    try:
        parsed = parse(command.get("text") or "")
    except ParseError as exc:
        await ack(**to_message(error_reply(exc.message, exc.usage)))
        return
    if isinstance(parsed, LaunchFormCmd):  # `/tune launch` alone: the launch form
        await ack()
        await open_launch_form(client, command["trigger_id"], channel=command.get("channel_id"))
        return
    quick = chat.quick_ack(parsed)
    if quick is None:  # fast, engine-free commands answer in the ack
        await ack(**to_message(chat.handle(parsed, actor)))
        return
    await ack(text=quick, response_type="ephemeral")
    slow = chat.slow if chat.is_slow(parsed) else None  # estimates on their own pool: never block others
    after_ack(
        chat.handle,
        parsed,
        actor,
        respond=respond,
        logger=logger,
        what="/tune",
        replace=True,
        names=chat.names,
        slow=slow,
        user=actor.user,
        after=_uploader(client, actor.channel, logger),
    )


def _uploader(client: AsyncWebClient, channel: str | None, logger: Logger):  # type: ignore[no-untyped-def]
    """After a reply with local charts (`compare`): each one uploaded where the command was typed (a file
    cannot be ephemeral; the table above it was)."""

    async def upload(reply: Reply) -> None:
        for part in reply.parts:
            if isinstance(part, Image) and part.path is not None and channel:
                try:
                    await client.files_upload_v2(
                        file=str(part.path),
                        filename=part.path.name,
                        channel=channel,
                        title=part.title or part.alt[:200],
                        alt_txt=part.alt[:1000],
                    )
                except Exception:  # noqa: BLE001 - the table was answered; a chart that fails is logged
                    logger.exception("could not upload %s", part.path.name)

    return upload
