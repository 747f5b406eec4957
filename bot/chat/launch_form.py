"""The launch form: a Slack modal for model, dataset, method, length and cap; it shows the estimate and the
offers, updated in place, and launches the one picked. Pure: values in, view dicts and requests out.

Opened by `/tune launch` with no arguments, the global shortcut, a message shortcut on an uploaded JSONL
(its dataset filled in) and App Home's button. Its fields are options of the one options table
(bot/planner/options.py): what the form sends is parsed exactly as `key=value` words in `/tune launch`.

Submitting it estimates (the submit button reads "Estimate"); the modal then shows the estimate and the
launchable offers as choices, and submitting again with one chosen launches it ("Launch"). Editing a field
after the estimate makes the next submission estimate again (the form's values are fingerprinted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import ValidationError

from bot.chat.blockkit import MAX_MODAL_TITLE, clip
from bot.chat.cards import cost_span, hours, labelled, shown_offers
from bot.chat.escaping import esc
from bot.money import money
from bot.planner import options
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate

LAUNCH_FORM = "launch_form"  # the modal's callback_id
MODEL = "model"
CHANNEL = "channel"
OFFER = "offer"
# The form's option fields: (option key of options.OPTIONS, label, placeholder, optional)
FIELDS: tuple[tuple[str, str, str, bool], ...] = (
    ("dataset", "Dataset", "s3://team-bucket/train.jsonl, hf://datasets/..., or slack:F0123ABCD", False),
    ("method", "Method", "", False),
    ("seq", "Sequence length", "", False),
    ("max_cost", "Spend cap ($)", "e.g. $25 (optional)", True),
)
LENGTHS = ("512", "1k", "2k", "4k", "8k", "16k", "32k")
METHODS = tuple(get_args(EstimateRequest.model_fields["method"].annotation))
CHOICES = ("cheapest", "safest", "fastest")


def _plain(text: str, limit: int = 75) -> dict[str, Any]:
    return {"type": "plain_text", "text": clip(text, limit) or " ", "emoji": True}


def _option(text: str, value: str, description: str | None = None) -> dict[str, Any]:
    option: dict[str, Any] = {"text": _plain(text), "value": value}
    if description:
        option["description"] = _plain(description)
    return option


@dataclass(frozen=True)
class FormState:
    """What the modal carries between submissions (its private_metadata)."""

    channel: str | None = None  # where the job's thread goes (the command's or the shortcut's channel)
    estimate_id: str | None = None  # the estimate shown, in the chat's estimate store
    fingerprint: str | None = None  # of the values that estimate was made from

    def dumps(self) -> str:
        return json.dumps({"c": self.channel, "e": self.estimate_id, "f": self.fingerprint})

    @classmethod
    def loads(cls, text: str | None) -> FormState:
        try:
            data = json.loads(text or "{}")
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(*(str(data[k]) if data.get(k) else None for k in ("c", "e", "f")))


def fingerprint(values: dict[str, str]) -> str:
    text = json.dumps(
        {k: (values.get(k) or "").strip() for k in (MODEL, *(f[0] for f in FIELDS))}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _text_input(block_id: str, label: str, placeholder: str, initial: str | None, *, optional: bool) -> dict:
    element: dict[str, Any] = {"type": "plain_text_input", "action_id": "value"}
    if placeholder:
        element["placeholder"] = _plain(placeholder, 150)
    if initial:
        element["initial_value"] = clip(initial, 3000)
    return {
        "type": "input",
        "block_id": block_id,
        "optional": optional,
        "label": _plain(label),
        "element": element,
    }


def _select(block_id: str, label: str, choices: tuple[str, ...], initial: str) -> dict[str, Any]:
    opts = [_option(c, c) for c in choices]
    chosen = next((o for o in opts if o["value"] == initial), opts[0])
    return {
        "type": "input",
        "block_id": block_id,
        "label": _plain(label),
        "element": {"type": "static_select", "action_id": "value", "options": opts, "initial_option": chosen},
    }


def form_view(
    values: dict[str, str] | None = None,
    *,
    state: FormState | None = None,
    ask_channel: bool = False,
    status: str | None = None,
    estimate: Estimate | None = None,
) -> dict[str, Any]:
    """The modal: the fields (with ``values``), then a status line, the estimate and its launchable offers."""
    values = values or {}
    state = state or FormState()
    blocks: list[dict[str, Any]] = [
        _text_input(MODEL, "Model", "Llama-3.1-8B, Qwen/Qwen2.5-7B, ...", values.get(MODEL), optional=False),
        _text_input("dataset", "Dataset", FIELDS[0][2], values.get("dataset"), optional=False),
        _select("method", "Method", METHODS, values.get("method") or "qlora"),
        _select("seq", "Sequence length", LENGTHS, values.get("seq") or "2k"),
        _text_input("max_cost", "Spend cap ($)", FIELDS[3][2], values.get("max_cost"), optional=True),
    ]
    if ask_channel:
        blocks.append(
            {
                "type": "input",
                "block_id": CHANNEL,
                "optional": True,
                "label": _plain("Post the job's thread in"),
                "element": {
                    "type": "conversations_select",
                    "action_id": "value",
                    "default_to_current_conversation": True,
                    "filter": {"include": ["public", "private"], "exclude_bot_users": True},
                },
                "hint": _plain("Empty: your DM with tunebot", 150),
            }
        )
    if status:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": clip(status, 2000)}]})
    launchable = launch_choices(estimate) if estimate is not None else []
    if estimate is not None:
        blocks.extend(estimate_blocks(estimate))
        if launchable:
            choices = [_option(text, value, note) for value, text, note in launchable]
            blocks.append(
                {
                    "type": "input",
                    "block_id": OFFER,
                    "label": _plain("Launch on"),
                    "element": {
                        "type": "radio_buttons",
                        "action_id": "value",
                        "options": choices,
                        "initial_option": choices[0],
                    },
                }
            )
    return {
        "type": "modal",
        "callback_id": LAUNCH_FORM,
        "title": _plain("Launch a fine-tune", MAX_MODAL_TITLE),
        "submit": _plain("Launch" if launchable else "Estimate", MAX_MODAL_TITLE),
        "close": _plain("Cancel", MAX_MODAL_TITLE),
        "private_metadata": state.dumps(),
        "blocks": blocks[:100],
    }


def message_view(title: str, text: str) -> dict[str, Any]:
    """A modal that only says something (launching, launched, refused)."""
    return {
        "type": "modal",
        "callback_id": LAUNCH_FORM + "_done",
        "title": _plain(title, MAX_MODAL_TITLE),
        "close": _plain("Close", MAX_MODAL_TITLE),
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": clip(text, 3000) or " "}}],
    }


def launch_choices(estimate: Estimate) -> list[tuple[str, str, str]]:
    """(choice, label, details) of each launchable offer, once per offer: 'Cheapest: vast rtx-4090 x1'."""
    out: list[tuple[str, str, str]] = []
    seen: list[object] = []
    for choice in CHOICES:
        offer = labelled(estimate, choice)
        if offer is None or any(offer is o for o in seen):
            continue
        seen.append(offer)
        kind = "spot" if offer.interruptible else "on-demand"
        label = f"{choice.capitalize()}: {offer.provider} {offer.gpu} x{offer.gpu_count} ({kind})"
        details = f"{money(offer.price_per_hour)}/h, about {hours(offer.hours)}, {cost_span(offer)} in total"
        out.append((choice, label, details))
    return out


def estimate_blocks(estimate: Estimate) -> list[dict[str, Any]]:
    """The estimate in a modal: what it needs, how long, and the ranked offers (lines: no table blocks)."""
    m, mem, t = estimate.model, estimate.memory, estimate.time
    lines = [
        f"*{esc(m.name)}* · {estimate.method} · {mem.per_gpu_gb:.1f} GB per GPU · "
        f"{hours(t.hours)} of compute · {t.steps:,} steps"
    ]
    offers = shown_offers(estimate)[:10]
    for i, o in enumerate(offers, 1):
        note = ", ".join(o.labels) if o.labels else ("" if o.fits else f"no: {o.reason}")
        lines.append(
            f"{i}. {esc(o.provider)} {esc(o.gpu)} x{o.gpu_count} {'spot' if o.interruptible else 'on-demand'}"
            f" · {money(o.price_per_hour)}/h · {hours(o.hours)} · "
            f"*{cost_span(o)}*" + (f" · {esc(note)}" if note else "")
        )
    fitting = sum(1 for o in estimate.offers if o.fits)
    blocks: list[dict[str, Any]] = [{"type": "divider"}]
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip("\n".join(lines), 3000)}})
    blocks.append(
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": f"{fitting} offers fit; prices {esc(estimate.prices_source)}"}
            ],
        }
    )
    return blocks


def read_values(view: dict[str, Any]) -> dict[str, str]:
    """The form's values from a view's state (view_submission or block_actions)."""
    state = ((view or {}).get("state") or {}).get("values") or {}
    out: dict[str, str] = {}
    for block_id, actions in state.items():
        element = (actions or {}).get("value") or {}
        kind = element.get("type")
        if kind in ("static_select", "radio_buttons"):
            value = (element.get("selected_option") or {}).get("value")
        elif kind == "conversations_select":
            value = element.get("selected_conversation")
        else:
            value = element.get("value")
        if isinstance(value, str) and value.strip():
            out[block_id] = value.strip()
    return out


def parse_form(values: dict[str, str]) -> tuple[EstimateRequest | None, dict[str, str]]:
    """The form's values through the options table, as `/tune launch MODEL key=value ...` would read them:
    the request, or the errors by field (a modal shows them under each field)."""
    model = values.get(MODEL, "").strip()
    if not model:
        return None, {MODEL: "a model name or Hub id"}
    if len(model) > 300:
        return None, {MODEL: "the model name is too long"}
    pairs = [(key, values[key]) for key, *_ in FIELDS if values.get(key)]
    try:
        parsed = options.parse_values(pairs)
    except options.OptionError as exc:
        return None, {_block_of(exc.key): exc.message}
    try:
        return EstimateRequest(model=model, **parsed), {}
    except ValidationError as exc:
        key, message = options.validation_problems(exc)[0]
        return None, {_block_of(key): message}


def _block_of(key: str) -> str:
    """The form block showing an option key (an error on another key shows under the model)."""
    option = options.option_named(key)
    return option.key if option is not None and option.key in {f[0] for f in FIELDS} else MODEL
