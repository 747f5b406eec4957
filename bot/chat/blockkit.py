"""Render a neutral Reply as a Slack message (Block Kit + text fallback), inside Slack's limits.

Limits (docs/slack.md): 50 blocks per message (100 in App Home), section text 3000, 10 fields of
2000, header 150, button text 75 and value 2000, action_id/block_id 255, 25 elements per actions
block, 10 per context block, confirm title 100 / text 300 / buttons 30. Anything longer is cut
with an ellipsis, never split mid-way into an invalid block; ``violations()`` checks a payload.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from bot.chat.replies import (
    Button,
    Buttons,
    Confirm,
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
MAX_TABLE_ROWS = 100  # a table block: rows (the header row included), cells per row, column settings
MAX_TABLE_CELLS = 20
MAX_CELL_TEXT = 1000
ELLIPSIS = "…"
TABLE_SURFACES = ("message",)  # where a table block renders (one per message); elsewhere section fields

_MENTION = re.compile(r"<@([UW][A-Z0-9]{2,30})(?:\|[^>]*)?>")
_CELL_MARKUP = re.compile(r"<@([UW][A-Z0-9]{2,30})>|\*([^*\n]+)\*|`([^`\n]+)`")
_NUMERIC = re.compile(r"^[~≈]?[-+]?\$?\d[\d,.]*(?:[ /%x]|$)")

Names = Callable[[str], str]


def no_names(user: str) -> str:
    return user


def named(text: str, names: Names | None) -> str:
    """Mentions as ``@display name`` for plain text, where Slack shows ``<@U123>`` as typed (headers,
    buttons, confirm dialogs, modal labels)."""
    lookup = names or no_names
    return _MENTION.sub(lambda m: "@" + lookup(m.group(1)), text)


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


def _align(column: list[str]) -> str:
    """Right for a column of numbers and money ("$1.20", "12/30", "3.1 h"; "-" is no value), else left."""
    values = [c for c in column if c.strip() not in ("", "-")]
    return "right" if values and all(_NUMERIC.match(c) for c in values) else "left"


def _rich_text(text: str, style: dict[str, bool] | None = None) -> dict[str, Any]:
    element: dict[str, Any] = {"type": "text", "text": text}
    if style:
        element["style"] = style
    return element


def cell(text: str, *, bold: bool = False) -> dict[str, Any]:
    """One table cell: ``raw_text``, or ``rich_text`` when it holds our markup (a mention, *bold*, `code`),
    so a person shows as their name (a ``user`` element) and never as an id."""
    text = clip(str(text), MAX_CELL_TEXT) or " "
    if not bold and not _CELL_MARKUP.search(text):
        return {"type": "raw_text", "text": text}
    base = {"bold": True} if bold else None
    elements: list[dict[str, Any]] = []
    pos = 0
    for match in _CELL_MARKUP.finditer(text):
        if match.start() > pos:
            elements.append(_rich_text(text[pos : match.start()], base))
        user, strong, code = match.groups()
        if user:
            elements.append({"type": "user", "user_id": user})
        elif strong:
            elements.append(_rich_text(strong, {"bold": True}))
        else:
            elements.append(_rich_text(code, {**(base or {}), "code": True}))
        pos = match.end()
    if pos < len(text):
        elements.append(_rich_text(text[pos:], base))
    return {"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": elements}]}


def table_block(part: Table) -> list[dict[str, Any]]:
    """A Block Kit ``table``: a bold header row, at most 99 data rows of at most 20 cells; numbers right."""
    columns = list(part.columns)[:MAX_TABLE_CELLS]
    width = len(columns)
    rows = [([str(c) for c in row] + [""] * width)[:width] for row in part.rows]
    shown = rows[: MAX_TABLE_ROWS - 1]
    block: dict[str, Any] = {
        "type": "table",
        "rows": [[cell(c, bold=True) for c in columns]] + [[cell(c or "-") for c in row] for row in shown],
        "column_settings": [
            {"align": _align([row[i] for row in shown]), "is_wrapped": True} for i in range(width)
        ],
    }
    blocks: list[dict[str, Any]] = []
    if part.title:
        blocks.append({"type": "section", "text": _mrkdwn(f"*{part.title}*", MAX_SECTION_TEXT)})
    blocks.append(block)
    if len(rows) > len(shown):
        blocks.append(
            {"type": "context", "elements": [_mrkdwn(f"{len(rows) - len(shown)} more rows not shown", 200)]}
        )
    return blocks


def table_as_sections(part: Table) -> list[dict[str, Any]]:
    """A table where a ``table`` block cannot go (App Home, modals, a message's second table): two columns
    as a grid of section fields, wider ones as one line per row under a line naming the columns."""
    rows = [[str(c) or "-" for c in row] for row in part.rows]
    blocks: list[dict[str, Any]] = []
    if part.title:
        blocks.append({"type": "section", "text": _mrkdwn(f"*{part.title}*", MAX_SECTION_TEXT)})
    if len(part.columns) == 2:
        items = [f"*{part.columns[0]}*", f"*{part.columns[1]}*"] + [c for row in rows for c in row[:2]]
        for i in range(0, len(items), MAX_FIELDS):
            blocks.append(
                {"type": "section", "fields": [_mrkdwn(t, MAX_FIELD_TEXT) for t in items[i : i + MAX_FIELDS]]}
            )
        return blocks
    blocks.append({"type": "context", "elements": [_mrkdwn(" · ".join(part.columns), MAX_CONTEXT_TEXT)]})
    lines = [" · ".join(row) for row in rows] or ["-"]
    chunk: list[str] = []
    for line in lines:
        line = clip(line, MAX_SECTION_TEXT // 2)
        if chunk and len("\n".join([*chunk, line])) > MAX_SECTION_TEXT:
            blocks.append({"type": "section", "text": _mrkdwn("\n".join(chunk), MAX_SECTION_TEXT)})
            chunk = []
        chunk.append(line)
    blocks.append({"type": "section", "text": _mrkdwn("\n".join(chunk), MAX_SECTION_TEXT)})
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


def part_blocks(part: object, *, table: bool = True, names: Names | None = None) -> list[dict[str, Any]]:
    """The blocks of one part; ``table`` says whether a Table may be a ``table`` block here."""
    if isinstance(part, Header):
        return header_block(Header(named(part.text, names)))
    if isinstance(part, Text):
        return text_blocks(part)
    if isinstance(part, Fields):
        return fields_blocks(part)
    if isinstance(part, Table):
        return table_block(part) if table else table_as_sections(part)
    if isinstance(part, Context):
        return context_blocks(part)
    if isinstance(part, Buttons):
        return actions_blocks(Buttons([_named_button(b, names) for b in part.buttons]))
    if isinstance(part, Image):
        return image_blocks(part)
    if isinstance(part, Divider):
        return [{"type": "divider"}]
    return []


def _named_button(button: Button, names: Names | None) -> Button:
    confirm = button.confirm
    if confirm is not None:
        confirm = Confirm(named(confirm.title, names), named(confirm.text, names), confirm.ok, confirm.deny)
    return Button(named(button.label, names), button.action, button.value, button.style, confirm)


def to_blocks(
    reply: Reply, *, max_blocks: int = MAX_BLOCKS, surface: str = "message", names: Names | None = None
) -> list[dict[str, Any]]:
    """All blocks of a reply; past the cap, middle blocks give way (header and buttons are kept). The first
    table of a message is a ``table`` block (Slack takes one per message); others are section fields."""
    blocks: list[dict[str, Any]] = []
    tables = 1 if surface in TABLE_SURFACES else 0
    for part in reply.parts:
        as_table = isinstance(part, Table) and tables > 0
        tables -= as_table
        blocks.extend(part_blocks(part, table=as_table, names=names))
    if len(blocks) <= max_blocks:
        return blocks
    actions = [b for b in blocks if b["type"] == "actions"][: max_blocks // 2]
    others = [b for b in blocks if b["type"] != "actions"]
    room = max_blocks - len(actions) - 1
    dropped = len(others) - room
    note = {"type": "context", "elements": [_mrkdwn(f"{ELLIPSIS} {dropped} more blocks not shown", 200)]}
    return others[:room] + [note] + actions


def to_message(reply: Reply, *, names: Names | None = None) -> dict[str, Any]:
    """Keyword arguments for chat.postMessage / chat.update / respond(): ``text`` and ``blocks``."""
    return {"text": clip(reply.text(), MAX_FALLBACK), "blocks": to_blocks(reply, names=names)}


def to_home_view(reply: Reply, *, names: Names | None = None) -> dict[str, Any]:
    return {
        "type": "home",
        "blocks": to_blocks(reply, max_blocks=MAX_BLOCKS_VIEW, surface="home", names=names),
    }


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
    blocks = _blocks_of(payload)
    problems = _payload_problems(payload, blocks, max_blocks)
    for i, block in enumerate(blocks):
        problems.extend(f"block {i}: {p}" for p in _block_problems(block))
    return problems


def _blocks_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payload's blocks (chat.postMessage also takes them as a JSON string)."""
    blocks = payload.get("blocks") or []
    if isinstance(blocks, str):
        import json

        blocks = json.loads(blocks)
    return blocks  # type: ignore[no-any-return]


def _payload_problems(
    payload: dict[str, Any], blocks: list[dict[str, Any]], max_blocks: int | None
) -> list[str]:
    """The limits on the message or view as a whole: block count, modal titles, text fallback, tables."""
    problems: list[str] = []
    view = payload.get("type") in ("home", "modal")
    cap = max_blocks or (MAX_BLOCKS_VIEW if view else MAX_BLOCKS)
    if len(blocks) > cap:
        problems.append(f"{len(blocks)} blocks > {cap}")
    for key in ("title", "submit", "close"):
        if payload.get("type") == "modal" and _text_len(payload.get(key)) > MAX_MODAL_TITLE:
            problems.append(f"modal {key} > {MAX_MODAL_TITLE}")
    if blocks and not payload.get("text") and not view:
        problems.append("blocks without a text fallback")
    tables = [b for b in blocks if b.get("type") == "table"]
    if tables and view:
        problems.append(f"a table block in a {payload['type']} view")
    if len(tables) > 1:
        problems.append(f"{len(tables)} table blocks in one message")
    return problems


def _block_problems(block: dict[str, Any]) -> list[str]:
    """The limits one block breaks, by its type."""
    kind = block.get("type")
    problems: list[str] = []
    if kind == "table":
        problems.extend(table_problems(block))
    if len(block.get("block_id", "")) > MAX_ACTION_ID:
        problems.append("block_id too long")
    if kind == "header" and _text_len(block.get("text")) > MAX_HEADER:
        problems.append(f"header > {MAX_HEADER}")
    if kind == "section":
        problems.extend(_section_problems(block))
    if kind == "context" and len(block.get("elements") or []) > MAX_CONTEXT:
        problems.append(f"context > {MAX_CONTEXT} elements")
    if kind == "actions":
        problems.extend(_actions_problems(block))
    return problems


def _section_problems(block: dict[str, Any]) -> list[str]:
    """A section's text and fields: each within its length, at most MAX_FIELDS fields, one given."""
    problems: list[str] = []
    if _text_len(block.get("text")) > MAX_SECTION_TEXT:
        problems.append(f"section text > {MAX_SECTION_TEXT}")
    fields = block.get("fields") or []
    if len(fields) > MAX_FIELDS:
        problems.append(f"{len(fields)} fields > {MAX_FIELDS}")
    if any(_text_len(f) > MAX_FIELD_TEXT for f in fields):
        problems.append(f"field > {MAX_FIELD_TEXT}")
    if "text" not in block and not fields:
        problems.append("section without text or fields")
    return problems


def _actions_problems(block: dict[str, Any]) -> list[str]:
    """An actions block: how many elements, unique action ids, and each button's own limits."""
    elements = block.get("elements") or []
    problems: list[str] = []
    if len(elements) > MAX_ACTIONS:
        problems.append(f"actions > {MAX_ACTIONS}")
    ids = [e.get("action_id", "") for e in elements]
    if len(set(ids)) != len(ids):
        problems.append("duplicate action_id")
    for e in elements:
        problems.extend(_button_problems(e))
    return problems


def _button_problems(element: dict[str, Any]) -> list[str]:
    """A button's text, value and action id lengths, and those of its confirm dialog."""
    problems: list[str] = []
    if _text_len(element.get("text")) > MAX_BUTTON_TEXT:
        problems.append(f"button text > {MAX_BUTTON_TEXT}")
    if len(element.get("value", "")) > MAX_BUTTON_VALUE:
        problems.append(f"button value > {MAX_BUTTON_VALUE}")
    if len(element.get("action_id", "")) > MAX_ACTION_ID:
        problems.append(f"action_id > {MAX_ACTION_ID}")
    confirm = element.get("confirm")
    if confirm:
        if _text_len(confirm.get("title")) > MAX_CONFIRM_TITLE:
            problems.append(f"confirm title > {MAX_CONFIRM_TITLE}")
        if _text_len(confirm.get("text")) > MAX_CONFIRM_TEXT:
            problems.append(f"confirm text > {MAX_CONFIRM_TEXT}")
    return problems


def _cell_problem(cell: Any) -> str | None:
    kind = cell.get("type") if isinstance(cell, dict) else None
    if kind == "raw_text":
        text = cell.get("text")
        if not isinstance(text, str) or not text:
            return "raw_text cell without text"
        return f"cell text > {MAX_CELL_TEXT}" if len(text) > MAX_CELL_TEXT else None
    if kind == "raw_number":
        return None if isinstance(cell.get("number"), int | float) else "raw_number cell without number"
    if kind == "rich_text":
        sections = cell.get("elements") or []
        if not sections or any(not (s.get("elements") or []) for s in sections):
            return "empty rich_text cell"
        for section in sections:
            for element in section["elements"]:
                if element.get("type") == "user" and not element.get("user_id"):
                    return "user element without user_id"
                if element.get("type") == "text" and not element.get("text"):
                    return "empty text element"
        return None
    return f"cell of type {kind!r}"


def table_problems(block: dict[str, Any]) -> list[str]:
    """A table block's shape: 1-100 rows of 1-20 cells, all rows as wide, known cell types, <= 20 column
    settings (left/center/right)."""
    rows = block.get("rows") or []
    problems: list[str] = []
    if not rows:
        problems.append("table without rows")
    if len(rows) > MAX_TABLE_ROWS:
        problems.append(f"{len(rows)} table rows > {MAX_TABLE_ROWS}")
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        problems.append(f"table rows of different widths {sorted(widths)}")
    if any(w > MAX_TABLE_CELLS or w == 0 for w in widths):
        problems.append(f"table row with 0 or more than {MAX_TABLE_CELLS} cells")
    for row in rows:
        for c in row:
            problem = _cell_problem(c)
            if problem:
                problems.append(problem)
                break
    settings = block.get("column_settings") or []
    if len(settings) > MAX_TABLE_CELLS:
        problems.append(f"{len(settings)} column settings > {MAX_TABLE_CELLS}")
    if any(s and s.get("align") not in (None, "left", "center", "right") for s in settings):
        problems.append("column align not left/center/right")
    return problems
