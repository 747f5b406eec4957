"""How many tokens a dataset has: counted with the model's own tokenizer when it is on disk, else
estimated from characters.

Formats are the runner's: alpaca {instruction, input?, output}, messages {"messages": [{role,
content}]}, prompt_completion {prompt, completion}, text {text}. The tokenizer is used only from a
local model folder (tokenizer.json, read with the `tokenizers` library) - never downloaded. Without
it: 4 characters per token (the usual figure for English with Llama/Qwen/Mistral tokenizers), plus
the tokens a prompt template adds per example (TEMPLATE_TOKENS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.planner.errors import BadRequestError

if TYPE_CHECKING:
    from runner.contract.reading import ReadLimits

CHARS_PER_TOKEN = 4.0
TEMPLATE_TOKENS = {"alpaca": 30, "messages": 6, "prompt_completion": 2, "text": 1}  # per example / message


def detect_format(row: dict[str, Any]) -> str:
    """The runner's own rule (runner/contract/records.py), as a planning error when no format's keys are
    there."""
    from runner.contract.records import detect_format as by_keys

    fmt = by_keys(row)
    if fmt is not None:
        return fmt.value
    raise BadRequestError(
        # never the row's own keys or values: the file may not be a dataset at all (credentials, configs)
        f"unrecognised dataset: its first record has {len(row)} key(s), none of a known format; expected "
        "alpaca (instruction/output), "
        "messages, prompt/completion or text"
    )


def _texts(row: dict[str, Any], fmt: str) -> tuple[list[str], int]:
    """The strings of one example and the template tokens it adds."""
    if fmt == "messages":
        msgs = row.get("messages") or []
        return [str(m.get("content", "")) for m in msgs if isinstance(m, dict)], TEMPLATE_TOKENS[fmt] * len(
            msgs
        )
    if fmt == "alpaca":
        return [str(row.get(k) or "") for k in ("instruction", "input", "output")], TEMPLATE_TOKENS[fmt]
    if fmt == "prompt_completion":
        return [str(row.get("prompt", "")), str(row.get("completion", ""))], TEMPLATE_TOKENS[fmt]
    return [str(row.get("text", ""))], TEMPLATE_TOKENS[fmt]


def local_tokenizer(model: str) -> Any | None:
    """The `tokenizers.Tokenizer` of a local model folder, or None (never downloads)."""
    folder = Path(model).expanduser()
    if folder.is_file():
        folder = folder.parent
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # a corrupt or unsupported tokenizer file: fall back to the approximation
        return None


def dataset_limits() -> ReadLimits:
    """The bot's bounds on reading a dataset (TUNEBOT_DATASET_*: bot/settings.py)."""
    from bot.settings import get_settings

    return get_settings().dataset_limits()


def count_tokens(path: str, model: str, limits: ReadLimits | None = None) -> tuple[int, int, str]:
    """(tokens, examples, source) for a jsonl dataset (a local file or any fsspec URI such as s3://, gzip
    and the other compressions inferred from the name); source says how the tokens were counted.

    The read is bounded (``limits``, default the settings'): past the sample's records or bytes the counts
    are scaled up by the share of the file read, and the source says so."""
    from runner.contract.reading import DatasetError, LineReader

    remote = "://" in path and not path.startswith("file://")
    file = Path(path.removeprefix("file://")).expanduser()
    if not remote and not file.is_file():
        raise BadRequestError(f"dataset file {path} does not exist")
    tok = local_tokenizer(model)
    total = 0.0
    examples = 0
    fmt: str | None = None
    reader = LineReader(path if remote else str(file), limits or dataset_limits())
    try:
        for lineno, line in reader:
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise BadRequestError(f"{path}:{lineno} is not valid JSON") from None
            if not isinstance(row, dict):
                raise BadRequestError(f"{path}:{lineno} is not a JSON object")
            fmt = fmt or detect_format(row)
            texts, extra = _texts(row, fmt)
            if tok is not None:
                total += sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts) + extra
            else:
                total += sum(len(t) for t in texts) / CHARS_PER_TOKEN + extra
            examples += 1
    except DatasetError as exc:  # unreadable, not UTF-8, missing, or over a limit (the message names it)
        raise BadRequestError(f"cannot read dataset: {exc}") from None
    if examples == 0:
        raise BadRequestError(f"dataset {path} has no examples")
    source = "tokenizer" if tok is not None else "chars/4 approximation"
    if reader.stopped is not None:
        share = reader.fraction_read()
        if not share:
            raise BadRequestError(
                f"dataset {path}: its size is unknown, so the first {examples:,} records cannot be scaled "
                "up; give tokens= instead"
            )
        total, examples = total / share, max(examples, round(examples / share))
        source += f", from the first {reader.records:,} records ({share:.0%} of the file), scaled up"
    return max(1, int(round(total))), examples, source
