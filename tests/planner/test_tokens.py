"""Counting dataset tokens: with the model's local tokenizer, else characters/4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.planner.errors import BadRequestError
from bot.planner.tokens import TEMPLATE_TOKENS, count_tokens


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    ("row", "fmt", "chars"),
    [
        ({"instruction": "a" * 40, "input": "", "output": "b" * 40}, "alpaca", 80),
        (
            {"messages": [{"role": "user", "content": "x" * 20}, {"role": "assistant", "content": "y" * 20}]},
            "messages",
            40,
        ),
        ({"prompt": "p" * 60, "completion": "c" * 20}, "prompt_completion", 80),
        ({"text": "t" * 400}, "text", 400),
    ],
)
def test_chars_per_token_approximation_by_format(tmp_path: Path, row: dict, fmt: str, chars: int) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [row] * 10)
    tokens, examples, source = count_tokens(str(data), "meta-llama/Llama-3.1-8B")
    per_example = chars / 4 + TEMPLATE_TOKENS[fmt] * (len(row["messages"]) if fmt == "messages" else 1)
    assert (tokens, examples, source) == (round(10 * per_example), 10, "chars/4 approximation")


def test_local_tokenizer_is_used_when_the_model_folder_has_one(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "hello world hello"}, {"text": "world"}])
    tokens, examples, source = count_tokens(str(data), str(folder))
    assert (tokens, examples, source) == (3 + 1 + 2 * TEMPLATE_TOKENS["text"], 2, "tokenizer")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no examples"),
        ("{broken\n", "not valid JSON"),
        ('{"foo": 1}\n', "unrecognised"),
        ("[1]\n", "object"),
    ],
)
def test_bad_datasets_are_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(BadRequestError, match=message):
        count_tokens(str(path), "x")
    with pytest.raises(BadRequestError, match="does not exist"):
        count_tokens(str(tmp_path / "missing.jsonl"), "x")
