"""The launch form from anywhere (global shortcut) or from a message with an uploaded JSONL (message
shortcut: the file is the dataset, the message's channel gets the job's thread). Trigger ids expire in
3 seconds: the form opens right after the ack."""

from __future__ import annotations

from logging import Logger
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.views.launch_form import open_launch_form

LAUNCH_SHORTCUT = "launch_form"  # manifest.yml: features.shortcuts (global)
LAUNCH_FROM_FILE = "launch_from_file"  # manifest.yml: features.shortcuts (message)
DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz")


def dataset_file(message: dict[str, Any]) -> dict[str, Any] | None:
    """The first uploaded JSONL (or JSON) file of a message."""
    for file in message.get("files") or []:
        name = str(file.get("name") or "").lower()
        if file.get("id") and (name.endswith(DATA_SUFFIXES) or file.get("filetype") in ("jsonl", "json")):
            return file  # type: ignore[no-any-return]
    return None


async def launch_shortcut_callback(
    ack: AsyncAck, shortcut: dict[str, Any], client: AsyncWebClient, logger: Logger
) -> None:
    await ack()
    try:
        await open_launch_form(client, shortcut["trigger_id"], channel=None)
    except Exception:  # noqa: BLE001
        logger.exception("could not open the launch form")


async def launch_from_file_callback(
    ack: AsyncAck, shortcut: dict[str, Any], client: AsyncWebClient, respond: AsyncRespond, logger: Logger
) -> None:
    await ack()
    file = dataset_file(shortcut.get("message") or {})
    if file is None:
        await respond(
            text=":warning: That message has no JSONL file. Upload the dataset (a .jsonl file) to the "
            "channel, "
            "then use *Fine-tune on this file* on that message.",
            response_type="ephemeral",
        )
        return
    channel = (shortcut.get("channel") or {}).get("id")
    name = str(file.get("name") or file["id"])[:80]
    try:
        await open_launch_form(
            client,
            shortcut["trigger_id"],
            channel=channel,
            values={"dataset": f"slack:{file['id']}"},
            status=f"Dataset: the file *{name}* from that message.",
        )
    except Exception:  # noqa: BLE001
        logger.exception("could not open the launch form")
