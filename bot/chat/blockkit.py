"""Render a neutral Reply as a Slack message (Block Kit + text fallback), inside Slack's limits.

Limits (docs/slack.md): 50 blocks per message (100 in App Home), section text 3000, 10 fields of
2000, header 150, button text 75 and value 2000, action_id/block_id 255, 25 elements per actions
block, 10 per context block, confirm title 100 / text 300 / buttons 30. Anything longer is cut
with an ellipsis, never split mid-way into an invalid block; ``violations()`` checks a payload.
"""

from __future__ import annotations

from typing import Any

from bot.chat.replies import (
    Button,
    Buttons,
    Context,
    Divider,
    Fields,
    Header,
    Image,
    Reply,
    Table,
    Text,
)

MAX_BLOCKS = 50
MAX_BLOCKS_VIEW = 100
MAX_SECTION_TEXT = 3000
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_HEADER = 150
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_ACTION_ID = 255
MAX_ACTIONS = 25
MAX_CONTEXT = 10
MAX_CONTEXT_TEXT = 2000
MAX_CONFIRM_TITLE = 100
MAX_CONFIRM_TEXT = 300
MAX_CONFIRM_BUTTON = 30
MAX_FALLBACK = 3000
ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """Cut text to at most ``limit`` characters, marking the cut."""
    text = str(text)
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": clip(text, limit) or " ", "emoji": True}


def _mrkdwn(text: str, limit: int) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": clip(text, limit) or " "}


def header_block(part: Header) -> list[dict[str, Any]]:
    return [{"type": "header", "text": _plain(part.text, MAX_HEADER)}]


def text_blocks(part: Text) -> list[dict[str, Any]]:
    text = part.text or " "
    chunks: list[str] = []
    while text:
        if len(text) <= MAX_SECTION_TEXT:
            chunks.append(text)
            break
        cut = text.rfind("\n", 0, MAX_SECTION_TEXT)
        if cut <= 0:
            cut = MAX_SECTION_TEXT
        chunks.append(text[:cut])
        text = text[cut:].lstrip("\n")
    return [{"type": "section", "text": _mrkdwn(c, MAX_SECTION_TEXT)} for c in chunks]


def fields_blocks(part: Fields) -> list[dict[str, Any]]:
    blocks = []
    items = [f"*{label}*\n{value}" for label, value in part.items]
    for i in range(0, len(items), MAX_FIELDS):
        group = items[i : i + MAX_FIELDS]
        blocks.append({"type": "section", "fields": [_mrkdwn(t, MAX_FIELD_TEXT) for t in group]})
    return blocks


def table_lines(part: Table) -> list[str]:
    """Fixed-width rows (header first): monospace is the only table Slack messages have."""
    rows = [[str(c) for c in row] for row in part.rows]
    widths = [len(c) for c in part.columns]
    for row in rows:
        for i, cell in enumerate(row[: len(widths)]):
            widths[i] = min(max(widths[i], len(cell)), 40)

    def line(cells: list[str]) -> str:
        return "  ".join(
            clip(c, widths[i]).ljust(widths[i]) for i, c in enumerate(cells[: len(widths)])
        ).rstrip()

    return [line(list(part.columns))] + [line(r) for r in rows]


def table_blocks(part: Table) -> list[dict[str, Any]]:
    lines = table_lines(part)
    head, body = lines[0], lines[1:]
    budget = MAX_SECTION_TEXT - 10 - len(head)
    blocks: list[dict[str, Any]] = []
    if part.title:
        blocks.append({"type": "section", "text": _mrkdwn(f"*{part.title}*", MAX_SECTION_TEXT)})
    chunk: list[str] = []
    size = 0
    for row in body or [""]:
        row = clip(row, budget)
        if chunk and size + len(row) + 1 > budget:
            blocks.append(
                {"type": "section", "text": _mrkdwn("```" + "\n".join([head, *chunk]) + "```", 3000)}
            )
            chunk, size = [], 0
        chunk.append(row)
        size += len(row) + 1
    blocks.append({"type": "section", "text": _mrkdwn("```" + "\n".join([head, *chunk]) + "```", 3000)})
    return blocks


def context_blocks(part: Context) -> list[dict[str, Any]]:
    items = [i for i in part.items if i] or [" "]
    blocks = []
    for i in range(0, len(items), MAX_CONTEXT):
        blocks.append(
            {
                "type": "context",
                "elements": [_mrkdwn(t, MAX_CONTEXT_TEXT) for t in items[i : i + MAX_CONTEXT]],
            }
        )
    return blocks


def button_element(button: Button) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "button",
        "text": _plain(button.label, MAX_BUTTON_TEXT),
        "action_id": clip(button.action, MAX_ACTION_ID),
    }
    if button.value:
        element["value"] = clip(button.value, MAX_BUTTON_VALUE)
    if button.style:
        element["style"] = button.style
    if button.confirm:
        c = button.confirm
        element["confirm"] = {
            "title": _plain(c.title, MAX_CONFIRM_TITLE),
            "text": _plain(c.text, MAX_CONFIRM_TEXT),
            "confirm": _plain(c.ok, MAX_CONFIRM_BUTTON),
            "deny": _plain(c.deny, MAX_CONFIRM_BUTTON),
        }
    return element


def actions_blocks(part: Buttons) -> list[dict[str, Any]]:
    blocks = []
    seen: set[str] = set()
    buttons = []
    for b in part.buttons:  # action ids must be unique within a message
        if b.action not in seen:
            seen.add(b.action)
            buttons.append(b)
    for i in range(0, len(buttons), MAX_ACTIONS):
        blocks.append(
            {"type": "actions", "elements": [button_element(b) for b in buttons[i : i + MAX_ACTIONS]]}
        )
    return blocks


def image_blocks(part: Image) -> list[dict[str, Any]]:
    if not part.url:  # local files are uploaded with files_upload_v2 by the notifier
        return []
    block: dict[str, Any] = {"type": "image", "image_url": part.url, "alt_text": clip(part.alt, 2000)}
    if part.title:
        block["title"] = _plain(part.title, 2000)
    return [block]


def part_blocks(part: object) -> list[dict[str, Any]]:
    if isinstance(part, Header):
        return header_block(part)
    if isinstance(part, Text):
        return text_blocks(part)
    if isinstance(part, Fields):
        return fields_blocks(part)
    if isinstance(part, Table):
        return table_blocks(part)
    if isinstance(part, Context):
        return context_blocks(part)
    if isinstance(part, Buttons):
        return actions_blocks(part)
    if isinstance(part, Image):
        return image_blocks(part)
    if isinstance(part, Divider):
        return [{"type": "divider"}]
    return []


def to_blocks(reply: Reply, *, max_blocks: int = MAX_BLOCKS) -> list[dict[str, Any]]:
    """All blocks of a reply; past the cap, middle blocks give way (header and buttons are kept)."""
    blocks = [b for p in reply.parts for b in part_blocks(p)]
    if len(blocks) <= max_blocks:
        return blocks
    actions = [b for b in blocks if b["type"] == "actions"][: max_blocks // 2]
    others = [b for b in blocks if b["type"] != "actions"]
    room = max_blocks - len(actions) - 1
    dropped = len(others) - room
    note = {"type": "context", "elements": [_mrkdwn(f"{ELLIPSIS} {dropped} more blocks not shown", 200)]}
    return others[:room] + [note] + actions


def to_message(reply: Reply) -> dict[str, Any]:
    """Keyword arguments for chat.postMessage / chat.update / respond(): ``text`` and ``blocks``."""
    return {"text": clip(reply.text(), MAX_FALLBACK), "blocks": to_blocks(reply)}


def to_home_view(reply: Reply) -> dict[str, Any]:
    return {"type": "home", "blocks": to_blocks(reply, max_blocks=MAX_BLOCKS_VIEW)}


MAX_MODAL_TITLE = 24
BUDGET_MODAL = "budget_modal"


def _input(block_id: str, label: str, placeholder: str, *, optional: bool) -> dict[str, Any]:
    return {
        "type": "input",
        "block_id": block_id,
        "optional": optional,
        "label": _plain(label, 2000),
        "element": {
            "type": "plain_text_input",
            "action_id": "value",
            "placeholder": _plain(placeholder, 150),
        },
    }


def budget_modal() -> dict[str, Any]:
    """The "Set a budget" modal opened from App Home (admins): scope, name, daily and monthly dollars."""
    options = [{"text": _plain(v, 75), "value": v} for v in ("user", "team")]
    return {
        "type": "modal",
        "callback_id": BUDGET_MODAL,
        "title": _plain("Set a budget", MAX_MODAL_TITLE),
        "submit": _plain("Save", MAX_MODAL_TITLE),
        "close": _plain("Cancel", MAX_MODAL_TITLE),
        "blocks": [
            {
                "type": "input",
                "block_id": "scope",
                "label": _plain("Scope", 2000),
                "element": {
                    "type": "static_select",
                    "action_id": "value",
                    "options": options,
                    "initial_option": options[0],
                },
            },
            _input("name", "User id or team name", "U0123ABCD or ml-team", optional=False),
            _input("daily", "Daily budget ($)", "e.g. 20", optional=True),
            _input("monthly", "Monthly budget ($)", "e.g. 400", optional=True),
        ],
    }


def _text_len(obj: Any) -> int:
    return len(obj.get("text", "")) if isinstance(obj, dict) else 0


def violations(payload: dict[str, Any], *, max_blocks: int | None = None) -> list[str]:
    """Every Block Kit limit a message (or view) payload breaks; empty when it is valid."""
    problems: list[str] = []
    blocks = payload.get("blocks") or []
    if isinstance(blocks, str):
        import json

        blocks = json.loads(blocks)
    cap = max_blocks or (MAX_BLOCKS_VIEW if payload.get("type") in ("home", "modal") else MAX_BLOCKS)
    if len(blocks) > cap:
        problems.append(f"{len(blocks)} blocks > {cap}")
    for key in ("title", "submit", "close"):
        if payload.get("type") == "modal" and _text_len(payload.get(key)) > MAX_MODAL_TITLE:
            problems.append(f"modal {key} > {MAX_MODAL_TITLE}")
    if blocks and not payload.get("text") and payload.get("type") not in ("home", "modal"):
        problems.append("blocks without a text fallback")
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if len(block.get("block_id", "")) > MAX_ACTION_ID:
            problems.append(f"block {i}: block_id too long")
        if kind == "header" and _text_len(block.get("text")) > MAX_HEADER:
            problems.append(f"block {i}: header > {MAX_HEADER}")
        if kind == "section":
            if _text_len(block.get("text")) > MAX_SECTION_TEXT:
                problems.append(f"block {i}: section text > {MAX_SECTION_TEXT}")
            fields = block.get("fields") or []
            if len(fields) > MAX_FIELDS:
                problems.append(f"block {i}: {len(fields)} fields > {MAX_FIELDS}")
            if any(_text_len(f) > MAX_FIELD_TEXT for f in fields):
                problems.append(f"block {i}: field > {MAX_FIELD_TEXT}")
            if "text" not in block and not fields:
                problems.append(f"block {i}: section without text or fields")
        if kind == "context" and len(block.get("elements") or []) > MAX_CONTEXT:
            problems.append(f"block {i}: context > {MAX_CONTEXT} elements")
        if kind == "actions":
            elements = block.get("elements") or []
            if len(elements) > MAX_ACTIONS:
                problems.append(f"block {i}: actions > {MAX_ACTIONS}")
            ids = [e.get("action_id", "") for e in elements]
            if len(set(ids)) != len(ids):
                problems.append(f"block {i}: duplicate action_id")
            for e in elements:
                if _text_len(e.get("text")) > MAX_BUTTON_TEXT:
                    problems.append(f"block {i}: button text > {MAX_BUTTON_TEXT}")
                if len(e.get("value", "")) > MAX_BUTTON_VALUE:
                    problems.append(f"block {i}: button value > {MAX_BUTTON_VALUE}")
                if len(e.get("action_id", "")) > MAX_ACTION_ID:
                    problems.append(f"block {i}: action_id > {MAX_ACTION_ID}")
                confirm = e.get("confirm")
                if confirm:
                    if _text_len(confirm.get("title")) > MAX_CONFIRM_TITLE:
                        problems.append(f"block {i}: confirm title > {MAX_CONFIRM_TITLE}")
                    if _text_len(confirm.get("text")) > MAX_CONFIRM_TEXT:
                        problems.append(f"block {i}: confirm text > {MAX_CONFIRM_TEXT}")
    return problems
