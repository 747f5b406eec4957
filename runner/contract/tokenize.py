"""Turning normalised records into token ids and labels, with loss only where the model should learn.

- prompt + completion (alpaca, prompt_completion): loss on the completion and the EOS only.
- text: loss on every token.
- conversations: rendered with the tokenizer's chat template; loss on assistant turns only. The
  assistant spans are found by rendering the conversation incrementally (the text up to a turn with the
  generation prompt, then the text including the turn) and mapping those character spans onto the
  tokens of the full rendering through the fast tokenizer's offsets. Templates whose renderings are not
  prefixes of each other (some rewrite earlier turns) fall back to the template's own
  ``{% generation %}`` markers via ``return_assistant_tokens_mask``; if neither works the record is
  rejected rather than trained with a wrong mask.
"""

from __future__ import annotations

from typing import Any

from runner.contract.example import IGNORE_INDEX
from runner.contract.records import Conversation, DatasetError, PromptCompletion, Record, Text

Encoded = tuple[list[int], list[int]]


def encode_record(record: Record, tokenizer: Any) -> Encoded:
    """Token ids and labels of one record (EOS appended), before any truncation."""
    if isinstance(record, PromptCompletion):
        prompt = _bos(tokenizer) + _ids(tokenizer, record.prompt)
        completion = _ids(tokenizer, record.completion) + _eos(tokenizer)
        return prompt + completion, [IGNORE_INDEX] * len(prompt) + completion
    if isinstance(record, Text):
        ids = _bos(tokenizer) + _ids(tokenizer, record.text) + _eos(tokenizer)
        return ids, list(ids)
    if isinstance(record, Conversation):
        return encode_conversation(record.messages, tokenizer)
    raise TypeError(f"unknown record type {type(record).__name__}")


def encode_conversation(messages: list[dict[str, str]], tokenizer: Any) -> Encoded:
    """Render a conversation with the chat template; labels cover the assistant turns only."""
    if not getattr(tokenizer, "chat_template", None):
        raise DatasetError("the tokenizer has no chat template, so the messages format cannot be rendered")
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = _assistant_spans(tokenizer, messages, full)
    if spans is not None:
        encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        labels = [
            token if any(start <= begin < end for start, end in spans) and stop > begin else IGNORE_INDEX
            for token, (begin, stop) in zip(ids, encoded["offset_mapping"], strict=True)
        ]
    else:
        ids, labels = _generation_mask(tokenizer, messages)
    # Append EOS unless the template already closes the last turn with it (Llama-3 style templates do).
    eos = _eos(tokenizer)
    if eos and eos[0] not in ids[_last_turn_start(labels, messages) :]:
        ids = ids + eos
        labels = labels + (eos if messages[-1]["role"] == "assistant" else [IGNORE_INDEX])
    return ids, labels


def _last_turn_start(labels: list[int], messages: list[dict[str, str]]) -> int:
    """Index where the final assistant turn's trained tokens begin (the last token if it is not assistant)."""
    end = len(labels) - 1
    if messages[-1]["role"] != "assistant":
        return max(end, 0)
    while end >= 0 and labels[end] == IGNORE_INDEX:
        end -= 1
    while end > 0 and labels[end - 1] != IGNORE_INDEX:
        end -= 1
    return max(end, 0)


def _assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], full: str
) -> list[tuple[int, int]] | None:
    """Character spans of the assistant turns in ``full``, or None if the template is not prefix-stable."""
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        try:
            before = _render(tokenizer, messages[:index], generation_prompt=True) if index else ""
            through = _render(tokenizer, messages[: index + 1], generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template may refuse a partial conversation
            return None
        if index == 0:
            before = _common_prefix_before_content(through, message["content"])
        if not (full.startswith(through) and through.startswith(before)) or len(through) <= len(before):
            return None
        spans.append((len(before), len(through)))
    return spans


def _common_prefix_before_content(rendered: str, content: str) -> str:
    """For a conversation that opens with the assistant: everything before its content is prompt."""
    at = rendered.find(content) if content else -1
    return rendered[:at] if at >= 0 else rendered


def _generation_mask(tokenizer: Any, messages: list[dict[str, str]]) -> Encoded:
    try:
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"cannot find the assistant turns with this chat template ({exc})") from None
    ids = list(out["input_ids"])
    mask = list(out.get("assistant_masks") or [])
    if len(mask) != len(ids) or not any(mask):
        raise DatasetError(
            "cannot find the assistant turns with this chat template (its renderings are not prefixes of "
            "each other and it has no {% generation %} markers)"
        )
    return ids, [token if flag else IGNORE_INDEX for token, flag in zip(ids, mask, strict=True)]


def _render(tokenizer: Any, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    if not isinstance(text, str):
        raise TypeError("apply_chat_template did not return text")
    return text


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _bos(tokenizer: Any) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None else []


def _eos(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if eos is not None else []
