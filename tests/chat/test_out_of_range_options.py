"""An option out of range is told in the options' own words (issue 38): on 9a0c9c1 `tokens=999999T` answered
with pydantic's raw text ("Input should be less than or equal to 10000000000000") at the CLI, the console and
Slack alike. The CLI exits with status 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot.chat.grammar import ParseError, parse


@pytest.mark.parametrize(
    ("word", "told"),
    [
        ("tokens=999999T", "tokens: 999,999T is too large: at most 10T"),
        ("batch=0", "batch: 0 is too small: at least 1"),
        ("r=99999", "r: 99,999 is too large: at most 4096"),
    ],
)
def test_out_of_range_values_are_told_plainly_at_every_door(word: str, told: str) -> None:
    from bot.cli import app

    with pytest.raises(ParseError) as chat:  # Slack and the console: the one grammar
        parse(f"estimate llama-3.1-8b {word}")
    assert chat.value.message == told and "Input should" not in chat.value.message
    key, _, rest = told.partition(": ")
    cli = CliRunner().invoke(app, ["estimate", "llama-3.1-8b", word])
    assert cli.exit_code == 2 and f"{key} (--" in cli.output and rest in cli.output, cli.output
    assert "Input should" not in cli.output and "Traceback" not in cli.output
