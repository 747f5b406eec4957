"""The dataset contract: which records each format accepts, how a format is recognised, and reading them.

Every format is normalised to one of three shapes the tokenizer understands: a prompt with a
completion (alpaca, prompt_completion), a conversation (messages), or plain text (text). Problems are
reported as DatasetError naming the file and the 1-based line, because users fix datasets in editors.

Pure (json + fsspec, never torch): the bot imports this module too, so that a dataset is checked on the
bot's side with exactly the rules the runner applies, before any GPU is rented.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from runner.contract.reading import DatasetError, LineReader, ReadLimits
from runner.contract.spec import DatasetFormat

CHAT_ROLES = frozenset({"system", "user", "assistant"})

# The prompt Stanford Alpaca trained with; users of alpaca-format data expect it.
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request."
    "\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request."
    "\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)


@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Text:
    text: str


Record = PromptCompletion | Conversation | Text


def read_records(uri: str, fmt: DatasetFormat) -> Iterator[tuple[int, Record]]:
    """Yield (line number, normalised record) for each non-blank line of a jsonl file or fsspec URI."""
    try:
        with fsspec.open(uri, "rt", encoding="utf-8", compression="infer") as stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                yield number, parse_record(line, fmt, uri=uri, line=number)
    except DatasetError:
        raise
    except FileNotFoundError as exc:
        raise DatasetError("dataset not found", uri=uri) from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(f"not UTF-8 text ({exc.reason})", uri=uri) from exc
    except OSError as exc:
        raise DatasetError(f"cannot read dataset ({type(exc).__name__}: {exc})", uri=uri) from exc


def parse_record(text: str, fmt: DatasetFormat, *, uri: str = "<record>", line: int | None = None) -> Record:
    """Parse one jsonl line of the given format; raise DatasetError naming the line if it is malformed."""

    def fail(message: str) -> DatasetError:
        return DatasetError(message, uri=uri, line=line)

    try:
        fmt = DatasetFormat(fmt)
    except ValueError:
        raise fail(f"unknown dataset format {fmt!r}") from None

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise fail("invalid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")

    def field(key: str, *, required: bool = True) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                raise fail(f"{fmt.value} record is missing the key {key!r}")
            return None
        if not isinstance(value, str):
            raise fail(f"{key!r} must be a string, got {type(value).__name__}")
        return value

    if fmt is DatasetFormat.alpaca:
        instruction, output = field("instruction"), field("output")
        extra = field("input", required=False)
        assert instruction is not None and output is not None
        if extra and extra.strip():
            prompt = ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=extra)
        else:
            prompt = ALPACA_PROMPT.format(instruction=instruction)
        return PromptCompletion(prompt, output)
    if fmt is DatasetFormat.prompt_completion:
        prompt, completion = field("prompt"), field("completion")
        assert prompt is not None and completion is not None
        return PromptCompletion(prompt, completion)
    if fmt is DatasetFormat.text:
        body = field("text")
        assert body is not None
        if not body:
            raise fail("'text' is empty")
        return Text(body)
    if fmt is DatasetFormat.messages:
        return Conversation(_messages(obj, fail))
    raise fail(f"unknown dataset format {fmt!r}")


def _messages(obj: dict[str, Any], fail: Any) -> list[dict[str, str]]:
    messages = obj.get("messages")
    if messages is None:
        raise fail("messages record is missing the key 'messages'")
    if not isinstance(messages, list) or not messages:
        raise fail("'messages' must be a non-empty list")
    out: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise fail(f"messages[{index}] must be an object with 'role' and 'content'")
        role, content = message.get("role"), message.get("content")
        if role is None or content is None:
            missing = "role" if role is None else "content"
            raise fail(f"messages[{index}] is missing the key {missing!r}")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise fail(f"messages[{index}] has an unknown role; expected one of {sorted(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise fail(f"messages[{index}].content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise fail("conversation has no assistant turn, so nothing would be trained")
    return out


# Which keys make a record of which format, in the order they are tried (a record with "messages" is a
# conversation even if it also has "text").
FORMAT_KEYS: tuple[tuple[DatasetFormat, tuple[str, ...]], ...] = (
    (DatasetFormat.messages, ("messages",)),
    (DatasetFormat.alpaca, ("instruction", "output")),
    (DatasetFormat.prompt_completion, ("prompt", "completion")),
    (DatasetFormat.text, ("text",)),
)
# Other names people use for the formats (Axolotl / TRL spellings).
FORMAT_ALIASES: dict[str, DatasetFormat] = {
    "chat": DatasetFormat.messages,
    "conversation": DatasetFormat.messages,
    "sharegpt": DatasetFormat.messages,
    "instruction": DatasetFormat.alpaca,
    "completion": DatasetFormat.prompt_completion,
    "prompt-completion": DatasetFormat.prompt_completion,
    "completion_only": DatasetFormat.prompt_completion,
    "pretrain": DatasetFormat.text,
    "raw": DatasetFormat.text,
}


def format_named(name: str) -> DatasetFormat:
    """A format from what a person typed (case-insensitive, with the usual aliases)."""
    key = name.strip().lower().replace(" ", "_")
    if key in FORMAT_ALIASES:
        return FORMAT_ALIASES[key]
    try:
        return DatasetFormat(key)
    except ValueError:
        known = ", ".join([f.value for f in DatasetFormat] + sorted(FORMAT_ALIASES))
        raise ValueError(f"`{name}` is not a dataset format (one of {known})") from None


def detect_format(obj: Any) -> DatasetFormat | None:
    """The format a record's keys say it is, or None when no format's keys are all there."""
    if not isinstance(obj, dict):
        return None
    for fmt, keys in FORMAT_KEYS:
        if all(key in obj for key in keys):
            return fmt
    return None


@dataclass(frozen=True)
class DatasetCheck:
    """What reading a dataset found: its format and how many records were checked."""

    uri: str
    format: DatasetFormat
    records: int
    complete: bool  # every record was checked (False: stopped at ``limit``)


def check_dataset(
    uri: str,
    fmt: DatasetFormat | str | None = None,
    *,
    limit: int | None = None,
    limits: ReadLimits | None = None,
) -> DatasetCheck:
    """Read a jsonl dataset (any fsspec URI), find its format from the first record when ``fmt`` is None,
    and check every record (up to ``limit``, within ``limits``: runner/contract/reading.py) with the rules of
    ``parse_record``; DatasetError names the first bad line (or the limit that was hit)."""
    chosen = format_named(fmt) if isinstance(fmt, str) else fmt
    bounds = (limits or ReadLimits()).with_records(limit)
    reader = LineReader(uri, bounds)
    for number, line in reader:
        if chosen is None:
            chosen = format_of_first(line, uri=uri, line=number)
        parse_record(line, chosen, uri=uri, line=number)
    if reader.records == 0 or chosen is None:
        raise DatasetError("dataset is empty: no records to train on", uri=uri)
    return DatasetCheck(uri=uri, format=chosen, records=reader.records, complete=reader.stopped is None)


def format_of_first(text: str, *, uri: str, line: int) -> DatasetFormat:
    """The format of a dataset from its first record's keys (never quoting them: a file that is no
    dataset keeps its secrets)."""
    try:
        first = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"invalid JSON ({exc.msg} at column {exc.colno})", uri=uri, line=line) from None
    except RecursionError:
        raise DatasetError("invalid JSON (nested too deeply)", uri=uri, line=line) from None
    chosen = detect_format(first)
    if chosen is None:
        what = f"{len(first)} key(s)" if isinstance(first, dict) else type(first).__name__
        raise DatasetError(
            f"cannot tell the format from the first record ({what}): expected alpaca (instruction, output), "
            "messages, prompt_completion (prompt, completion) or text",
            uri=uri,
            line=line,
        )
    return chosen
