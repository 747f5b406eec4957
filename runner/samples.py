"""Side-by-side answers: the same prompts to the base model (before the first step) and to the result.

Prompts come from ``prompts=FILE`` (runner/contract/prompts.py) or from the first held-out eval examples
(their prompt part: the tokens before the first one that carries loss; a text example's first half).
Generation is greedy (deterministic whatever the seed), one prompt at a time, at most ``max_new_tokens`` new
tokens, stopping at EOS; prompts longer than ``Defaults.sample_prompt_tokens`` keep their last tokens. It runs
the model's plain forward (the loss hook of runner/loss.py is idle outside a loss computation) with its KV
cache: one forward over the prompt, then one per new token, on every process alike (FSDP needs every rank in
each forward), which is what bot/planner/length.py prices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from runner.contract.example import IGNORE_INDEX, Example
from runner.contract.records import Conversation, PromptCompletion, Record
from runner.contract.spec import MAX_SAMPLE_TEXT, Defaults


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str  # as shown beside the answers
    expected: str | None = None  # a held-out example's own answer


def _clip_ids(ids: list[int], limit: int, bos: int | None) -> list[int]:
    if len(ids) <= limit:
        return ids
    tail = ids[-(limit - 1) :] if bos is not None else ids[-limit:]
    return ([bos] if bos is not None else []) + tail


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=True)).strip()[:MAX_SAMPLE_TEXT]


def from_examples(examples: Sequence[Example], tokenizer: Any, count: int) -> list[Prompt]:
    """The prompts of the first ``count`` held-out examples that have one (and their expected answers)."""
    limit = Defaults.sample_prompt_tokens
    bos = getattr(tokenizer, "bos_token_id", None)
    out: list[Prompt] = []
    for example in examples:
        if len(out) >= count:
            break
        ids, labels = example.input_ids, example.labels
        first = next((i for i, label in enumerate(labels) if i > 0 and label != IGNORE_INDEX), None)
        if first is None:
            continue
        if first < 2:  # every token carries loss (text): the first half is the prompt
            first = max(1, len(ids) // 2)
        end = first
        while end < len(ids) and labels[end] != IGNORE_INDEX:
            end += 1
        prompt = _clip_ids(list(ids[:first]), limit, bos)
        out.append(Prompt(prompt, _decode(tokenizer, ids[:first]), _decode(tokenizer, ids[first:end])))
    return out


def from_records(records: Sequence[Record], tokenizer: Any) -> list[Prompt]:
    """Prompts of a prompts file, templated as the training data is (alpaca's template, the chat template
    with its generation prompt)."""
    limit = Defaults.sample_prompt_tokens
    bos = getattr(tokenizer, "bos_token_id", None)
    out: list[Prompt] = []
    for record in records:
        if isinstance(record, Conversation):
            rendered = tokenizer.apply_chat_template(
                record.messages, tokenize=False, add_generation_prompt=True
            )
            ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
            shown = record.messages[-1]["content"]
        else:
            text = record.prompt if isinstance(record, PromptCompletion) else record.text  # type: ignore[union-attr]
            ids = ([bos] if bos is not None else []) + list(
                tokenizer(text, add_special_tokens=False)["input_ids"]
            )
            shown = text
        out.append(Prompt(_clip_ids(ids, limit, bos), shown.strip()[:MAX_SAMPLE_TEXT]))
    return out


@torch.no_grad()
def answer(
    model: Any,
    prompts: Sequence[Prompt],
    tokenizer: Any,
    *,
    device: torch.device,
    max_new_tokens: int,
    precision: Callable[[], AbstractContextManager[Any]],
    progress: Callable[[], object] | None = None,
) -> list[str]:
    """Greedy answers of ``model`` to each prompt (decoded, special tokens skipped). ``progress``: called
    after each token generated (the runner's heartbeat: a long generation is progress, not idleness)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    was_training = model.training
    model.eval()
    answers: list[str] = []
    try:
        for prompt in prompts:
            ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
            past: dict[str, Any] = {}  # the cache, under the name this transformers calls it
            new: list[int] = []
            for _ in range(max_new_tokens):
                with precision():
                    out = model(input_ids=ids, use_cache=True, **past)
                past = _cache_of(out)
                token = int(out.logits[0, -1].float().argmax())
                if progress is not None:
                    progress()
                if eos is not None and token == eos:
                    break
                new.append(token)
                ids = torch.tensor([[token]], dtype=torch.long, device=device)  # the cache holds the rest
            answers.append(_decode(tokenizer, new))
            del past
    finally:
        if was_training:
            model.train()
    return answers


def _cache_of(out: Any) -> dict[str, Any]:
    """The KV cache a forward returned, as the keyword the next forward takes: ``cache`` (transformers 5.x),
    else ``past_key_values``."""
    cache = getattr(out, "cache", None)
    if cache is not None:
        return {"cache": cache}
    return {"past_key_values": out.past_key_values}
