"""Every method, with its defaults, launches at every door (issue 38, item 0).

On 9a0c9c1 a full fine-tune asked for with nothing but a model, a dataset and a cap was refused at every door
("precision: estimate-only options ..."): its default, mixed precision, is what the runner trains, while the
launch's check took bf16 for everyone's default. The matrix here: methods (lora, qlora, full) x doors (the
CLI's `tunebot launch`, `tunebot console`'s session, Slack's `/tune launch` and the Slack launch form) x
defaults (model, dataset, max_cost: nothing else), each on the local provider with the real runner.

The CLI's three jobs train to their end (real tiny training, side by side on one job database: the one
`--wait` ticks them all); the other doors' jobs are accepted and reach running on the local provider, then are
stopped (what they would train is what the CLI's trained: the same request, the same runner).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.worlds import engine_slack_world, ticked_until
from typer.testing import CliRunner

from bot.engine.record.jobstate import FINAL

METHODS = ("lora", "qlora", "full")
CAP = "1"  # dollars: the tiny jobs cost fractions of a cent on the local provider


def _cli(*args: str) -> Any:
    from bot.cli import app

    return CliRunner().invoke(app, list(args))


def _cli_jobs() -> dict[str, dict[str, Any]]:
    out = _cli("jobs", "--json")
    assert out.exit_code == 0, out.output
    return {j["method"]: j for j in json.loads(out.output)}


@pytest.mark.slow
def test_the_cli_launches_every_method_with_its_defaults_and_each_trains_to_its_end(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tunebot launch MODEL --dataset D --method M --max-cost 1` for each method; the last with --wait (the
    issue's command) follows them all to the end on this CPU."""
    monkeypatch.setenv("TUNEBOT_START_SUPERVISOR", "0")  # the --wait below supervises them all
    model, data = str(tiny_model / "model"), str(tiny_model / "data.jsonl")
    for method in METHODS:
        wait = ["--wait"] if method == METHODS[-1] else []
        out = _cli("launch", model, "--dataset", data, "--method", method, "--max-cost", CAP, *wait)
        assert out.exit_code == 0, f"{method}: {out.output}"
        assert "estimate-only" not in out.output and "local cpu" in out.output, out.output
    from bot.engine.service import Engine
    from bot.settings import get_settings

    engine = Engine(get_settings())
    try:  # the jobs launched before the waited one ended while it was followed, or end now
        assert ticked_until(engine, lambda: all(j.state in FINAL for j in engine.list_jobs()), 240)
    finally:
        engine.close()
    jobs = _cli_jobs()
    assert sorted(jobs) == sorted(METHODS)
    for method, job in jobs.items():
        assert job["state"] == "succeeded", (method, job["state"], job["message"])
        assert job["provider"] == "local" and job["step"] == job["max_steps"] > 0, job
        assert job["max_cost"] == 1.0 and job["output_uri"] and Path(job["output_uri"]).is_dir(), job


@pytest.mark.slow
def test_the_console_and_both_slack_doors_launch_every_method_with_its_defaults(
    tiny_model: Path, tmp_path: Path
) -> None:
    """`launch MODEL dataset=D method=M max_cost=1` in the console (then `yes`) and in Slack (then "Launch
    cheapest"), and the Slack launch form with model, dataset, method and cap: each job is accepted and runs
    on the local provider."""
    from bot.chat.console import ConsoleSession
    from bot.chat.handlers import ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.chat.terminal import cli_console
    from bot.engine.permissions import OPERATOR
    from bot.providers.local import LocalProvider

    from .test_launch_form import ALICE, _state, submission

    model, data = str(tiny_model / "model"), str(tiny_model / "data.jsonl")
    local = LocalProvider(workdir=tmp_path / "local")
    launched: dict[tuple[str, str], str] = {}  # (door, method) -> job id
    with engine_slack_world(
        tmp_path, {"local": local}, chat_data_dir=tiny_model, TUNEBOT_MAX_RUNNING_PER_USER="0"
    ) as stack:
        engine = stack.engine

        def newest(owner: str) -> str:
            return engine.list_jobs(user=owner)[0].job_id

        def settled(job_id: str) -> None:
            view = engine.get_job(job_id)
            assert view.state in ("running", "succeeded"), (view.state, view.message)
            assert view.provider == "local", view.provider
            if view.state == "running":  # what it would train, the CLI's job of this method trained
                engine.stop(job_id, user=view.owner)

        # the console: the operator's session, as `tunebot console` runs it (its ChatHandlers, its Actor)
        console = ConsoleSession(
            ChatHandlers(engine, Permissions.from_settings(engine.settings)), cli_console()
        )
        for method in METHODS:
            reply = console.execute(
                f"launch {model} dataset={data} method={method} max_cost={CAP}", iter(["yes"])
            )
            assert reply.kind == "success" and "Launching job" in reply.text(), reply.text()
            launched["console", method] = newest(OPERATOR)
            settled(launched["console", method])

        # Slack: /tune launch MODEL dataset=... method=... max_cost=..., then its "Launch cheapest"
        for method in METHODS:
            said = stack.launch(f"{model} dataset={data} method={method} max_cost={CAP}", user=ALICE)
            assert "Launching job" in said, said
            launched["slack", method] = newest(ALICE)
            settled(launched["slack", method])

        # the Slack launch form: /tune launch alone opens it; estimate, then launch the cheapest offer
        for opened, method in enumerate(METHODS, 1):
            before = len(stack.slack.of("views.update"))
            assert stack.command("launch", user=ALICE).status_code == 200
            view = stack.slack.wait_for("views.open", opened)[-1].body["view"]
            typed = {"model": model, "dataset": data, "method": method, "max_cost": CAP}
            assert stack.click(submission(view, **typed)).json()["response_action"] == "update"
            estimated = stack.slack.wait_for("views.update", before + 1, timeout=60)[before].body["view"]
            assert estimated["submit"]["text"] == "Launch", json.dumps(estimated)[:2000]
            assert _state(estimated)  # the form keeps what was typed
            stack.click(submission(estimated, **typed, offer="cheapest"))
            done = stack.slack.wait_for("views.update", before + 2, timeout=60)[before + 1].body["view"]
            assert done["title"]["text"] == "Launched", json.dumps(done)[:2000]
            launched["form", method] = newest(ALICE)
            settled(launched["form", method])

        assert len(set(launched.values())) == 9
        for (door, method), job_id in launched.items():
            view = engine.get_job(job_id)
            assert view.method == method and view.max_cost == 1.0, (door, method, view)
            assert view.state != "failed", (door, method, view.message)
        assert ticked_until(
            engine, lambda: all(engine.get_job(j).state in FINAL for j in launched.values()), 120
        )
    for inst in local.list_instances():
        local.terminate(inst.instance_id)
