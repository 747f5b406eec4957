"""The model card gives one cost for one job (issue 38): the runner writes its reckoning on the cost line and
on the eval line ("... (-34%) for $0.0056"); at the job's end the bot writes what the ledger billed on both
(bot/engine/outcome/billed_card.py), so the card never says "$0.0059 as billed" and "for $0.0056" at once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bot.engine.outcome.billed_card import record_billed_cost
from bot.money import money
from runner.contract import publish
from runner.contract.publish import RECKONING

CARD = "\n".join(
    [
        "## Results",
        "",
        "- status: finished, 20 of 20 optimizer steps, 40,960 tokens trained",
        "- eval loss: 1.9800",
        f"- cost: $0.0056 {RECKONING} on local cpu x1 at $0.10/h (estimated $0.0040)",
        "- eval loss on 40 held-out examples: 3.0000 (base model) -> 1.9800 (-34%) for $0.0056",
        "- result: the weights of step 20 (the last step)",
        "",
    ]
)


def test_the_card_and_the_summary_say_the_billed_cost_once(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(CARD)
    (tmp_path / "training_summary.json").write_text(json.dumps({"cost": 0.0056, "steps": 20}))
    assert record_billed_cost(str(tmp_path), 0.0059)
    card = (tmp_path / "README.md").read_text()
    assert "- cost: $0.0059 as billed" in card
    assert "(-34%) for $0.0059" in card and "$0.0056" not in card, card
    spent = set(re.findall(r"(?:cost: |for )(\$[0-9.,]+)", card))
    assert spent == {"$0.0059"}, card  # the price per hour and the estimate are other figures, said as such
    summary = json.loads((tmp_path / "training_summary.json").read_text())
    assert summary["cost"] == 0.0059 and summary["cost_source"] == "ledger"
    # writing it again (a second finish, a resumed job's end) keeps one cost, the newest
    assert record_billed_cost(str(tmp_path), 0.0061)
    again = (tmp_path / "README.md").read_text()
    assert set(re.findall(r"(?:cost: |for )(\$[0-9.,]+)", again)) == {"$0.0061"}, again


@pytest.mark.parametrize("amount", [0.0, 0.000021, 0.0006, 0.002, 0.0072, 0.0099, 0.01, 4.1, 1234.5])
def test_the_card_writes_amounts_as_the_bot_does(amount: float) -> None:
    """The runner's contract has its own copy of bot/money.py (it imports nothing of the bot): the same."""
    assert publish.money(amount) == money(amount)
