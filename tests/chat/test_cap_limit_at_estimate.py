"""A cap above the bot's limit is refused at its estimate, not after a "Launch cheapest" button (issue 38):
on 9a0c9c1 `max_cost=$99999999` got an estimate card with launch buttons at every door, and the refusal
(TUNEBOT_MAX_COST_LIMIT) came only from the click. Slack's `/tune estimate` and `/tune launch`, the launch
form, the console and `tunebot estimate` now answer with the refusal and offer nothing to launch."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bot.chat.replies import Buttons

REFUSAL = "is above this bot's limit of $100.00 per job (TUNEBOT_MAX_COST_LIMIT)"


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    record = {"instruction": "Say hi.", "input": "", "output": "Hi there! " * 20}
    data.write_text("\n".join(json.dumps(record) for _ in range(100)) + "\n")
    return data


def test_slack_and_the_form_refuse_the_cap_at_its_estimate(tmp_path: Path) -> None:
    from engine.fakes import FakeProvider
    from fakes.worlds import engine_slack_world

    from .test_launch_form import ALICE, submission

    data = _data(tmp_path)
    cloud = FakeProvider("vast", price=0.40)
    with engine_slack_world(tmp_path, {"vast": cloud}, TUNEBOT_MAX_COST_LIMIT="100") as stack:
        for verb in ("estimate", "launch"):
            before = len(stack.slack.of("response"))
            assert stack.command(f"{verb} Llama-3.1-8B dataset={data} max_cost=$99999999").status_code == 200
            answer = stack.responses(before + 1)[before]
            assert "max_cost $99,999,999.00 " + REFUSAL in answer["text"], answer["text"]
            assert "actions" not in json.dumps(answer.get("blocks", [])), answer  # no Launch button
        assert stack.command("launch", user=ALICE).status_code == 200
        view = stack.slack.wait_for("views.open")[0].body["view"]
        typed = {"model": "Llama-3.1-8B", "dataset": str(data), "method": "lora", "max_cost": "$99999999"}
        assert stack.click(submission(view, **typed)).json()["response_action"] == "update"
        shown = stack.slack.wait_for("views.update", timeout=30)[0].body["view"]
        assert REFUSAL in json.dumps(shown) and shown["submit"]["text"] == "Estimate", shown
        assert not any(b.get("block_id") == "offer" for b in shown["blocks"])  # nothing to pick and launch
        assert stack.engine.list_jobs() == [] and cloud.creates == 0


def test_the_console_and_the_cli_refuse_the_cap_at_its_estimate(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from bot.chat.handlers import Actor, ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.cli import app
    from bot.engine.service import Engine
    from bot.settings import Settings, get_settings

    data = _data(tmp_path)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), TUNEBOT_MAX_COST_LIMIT=100)
    engine = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={})
    try:
        chat = ChatHandlers(engine, Permissions.from_settings(settings))
        for verb in ("estimate", "launch"):
            console = Actor("operator", None, operator=True)  # the console's person (local paths)
            reply = chat.handle_text(f"{verb} llama-3.2-1b dataset={data} max_cost=99999999", console)
            assert reply.kind == "error" and REFUSAL in reply.text(), reply.text()
            assert not [p for p in reply.parts if isinstance(p, Buttons)]
    finally:
        engine.close()
    monkeypatch.setenv("TUNEBOT_MAX_COST_LIMIT", "100")
    get_settings.cache_clear()
    out = CliRunner().invoke(app, ["estimate", "llama-3.2-1b", f"dataset={data}", "max_cost=$99999999"])
    assert out.exit_code == 2 and REFUSAL in out.output, out.output
    fits = CliRunner().invoke(
        app, ["estimate", "llama-3.2-1b", f"dataset={data}", "max_cost=$99", "--offline"]
    )
    assert fits.exit_code == 0, fits.output
