"""The prompts of the side-by-side answers (``prompts=FILE``): one JSON object per line, read bounded.

A line is ``{"prompt": ...}``, ``{"messages": [...]}`` (a trailing assistant turn is dropped: the models
answer the last user turn), alpaca's ``{"instruction": ..., "input": ...}`` (the training template) or
``{"text": ...}``. At most ``Defaults.max_samples`` prompts are read, each at most ``MAX_PROMPT_CHARS`` (a
conversation at most ``MAX_PROMPT_MESSAGES`` turns), all of them together at most ``MAX_PROMPTS_BYTES`` as the
spec carries them; only the keys a prompt is made of travel (``prompt_line``): whatever else a line holds
stays in the file, so a prompts file cannot grow the spec past what a host's environment takes (issue 38).

Pure (json + fsspec through runner/contract/reading.py, never torch): the bot checks a prompts file with these
rules before anything is rented, and the runner reads it with them.
"""

from __future__ import annotations

import json
from typing import Any

from runner.contract.reading import DatasetError, LineReader, ReadLimits
from runner.contract.records import (
    ALPACA_PROMPT,
    ALPACA_PROMPT_WITH_INPUT,
    Conversation,
    PromptCompletion,
    Record,
    parse_record,
)
from runner.contract.spec import DatasetFormat, Defaults

MAX_PROMPT_CHARS = 2000  # eight prompts stay within 16 KB of a JobSpec
MAX_PROMPT_MESSAGES = 64  # turns of one conversation prompt
# The prompts as the spec carries them (canonical JSON, UTF-8): well under what one environment string may
# hold (bot/engine/launching/staging.py MAX_ENV_STRING), whatever characters they are made of.
MAX_PROMPTS_BYTES = 32 * 1024
PROMPT_LIMITS = ReadLimits(max_line_bytes=64 * 1024, max_ratio=100.0, seconds=30.0)


def parse_prompt(text: str, *, uri: str = "<prompts>", line: int | None = None) -> Record:
    """One prompts line -> a PromptCompletion with an empty completion, or a Conversation ending with a
    user turn; DatasetError naming the line otherwise."""

    def fail(message: str) -> DatasetError:
        return DatasetError(message, uri=uri, line=line)

    try:
        obj: Any = json.loads(text)
    except (ValueError, RecursionError):
        raise fail("invalid JSON: a prompts file has one JSON object per line") from None
    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        if isinstance(obj["messages"], list) and len(obj["messages"]) > MAX_PROMPT_MESSAGES:
            raise fail(f"the prompt has {len(obj['messages']):,} messages; at most {MAX_PROMPT_MESSAGES}")
        record = parse_record(text, DatasetFormat.messages, uri=uri, line=line)
        assert isinstance(record, Conversation)
        messages = list(record.messages)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages or messages[-1]["role"] != "user":
            raise fail("the messages must end with a user turn (the models answer it)")
        _check_length(sum(len(m["content"]) for m in messages), fail)
        return Conversation(messages)
    if "instruction" in obj:
        instruction, extra = obj.get("instruction"), obj.get("input") or ""
        if not isinstance(instruction, str) or not isinstance(extra, str) or not instruction.strip():
            raise fail("'instruction' (and 'input') must be text")
        prompt = (
            ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=extra)
            if extra.strip()
            else ALPACA_PROMPT.format(instruction=instruction)
        )
        _check_length(len(prompt), fail)
        return PromptCompletion(prompt, "")
    for key in ("prompt", "text"):
        if key in obj:
            value = obj[key]
            if not isinstance(value, str) or not value.strip():
                raise fail(f"{key!r} must be non-empty text")
            _check_length(len(value), fail)
            return PromptCompletion(value, "")
    raise fail("a prompt line needs 'prompt', 'messages', 'instruction' or 'text'")


def _check_length(chars: int, fail: Any) -> None:
    if chars > MAX_PROMPT_CHARS:
        raise fail(f"the prompt has {chars:,} characters; at most {MAX_PROMPT_CHARS:,}")


def prompt_line(text: str) -> dict[str, Any]:
    """A checked prompts line as the spec carries it: only the keys ``parse_prompt`` reads (the first of
    messages, instruction and input, prompt, text), each message only its role and content."""
    obj = json.loads(text)
    if "messages" in obj:
        return {"messages": [{"role": m["role"], "content": m["content"]} for m in obj["messages"]]}
    if "instruction" in obj:
        return {"instruction": obj["instruction"], "input": obj.get("input") or ""}
    key = "prompt" if "prompt" in obj else "text"
    return {key: obj[key]}


def spec_bytes(lines: list[dict[str, Any]]) -> int:
    """What prompt lines take in a spec: their compact JSON in UTF-8 (as the spec is serialized)."""
    return len(json.dumps(lines, ensure_ascii=False, separators=(",", ":")).encode())


def read_prompt_lines(uri: str, *, limit: int = Defaults.max_samples) -> list[dict[str, Any]]:
    """The first ``limit`` prompt lines of a jsonl file or fsspec URI, each checked with ``parse_prompt`` and
    kept as ``prompt_line`` makes it; DatasetError when one is malformed, there is none, or together they are
    more than MAX_PROMPTS_BYTES."""
    out: list[dict[str, Any]] = []
    for line, text in LineReader(uri, PROMPT_LIMITS.with_records(limit)):
        parse_prompt(text, uri=uri, line=line)
        out.append(prompt_line(text))
    if not out:
        raise DatasetError("no prompts in the file", uri=uri)
    size = spec_bytes(out)
    if size > MAX_PROMPTS_BYTES:
        raise DatasetError(
            f"the prompts take {size:,} bytes as the job carries them; at most {MAX_PROMPTS_BYTES:,} "
            "(fewer or shorter prompts)",
            uri=uri,
        )
    return out


def read_prompts(uri: str, *, limit: int = Defaults.max_samples) -> list[Record]:
    """The first ``limit`` prompts of a jsonl file or fsspec URI; DatasetError when one is malformed or
    there is none."""
    return prompts_of(read_prompt_lines(uri, limit=limit))


def prompts_of(lines: list[dict[str, Any]], *, where: str = "prompts") -> list[Record]:
    """Prompt records of JSON objects (a spec's inline prompts), checked again (the runner trusts none)."""
    return [parse_prompt(json.dumps(obj), uri=where, line=i) for i, obj in enumerate(lines, 1)]
