"""The command line prints the cards Slack and the console show: one builder per fact, three renderers.

`tunebot jobs | launch | approve | stop | spend | volumes | estimate` render replies from bot/chat/cards.py
through bot/chat/terminal.py; these tests run the commands on an in-memory engine and compare what they
print with the same reply rendered for the terminal and for Slack.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

import bot.commands.engine_commands as engine_commands
from bot.chat import cards
from bot.chat.blockkit import to_message, violations
from bot.chat.escaping import unescape
from bot.chat.replies import Context, Reply, text_reply
from bot.chat.terminal import cli_console, render
from bot.cli import app
from bot.engine.api import JobView

from .fake_engine import FakeEngine

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HOSTILE = "[red]x[/red] [bold]boom[/bold] [link=https://evil.example]click[/link]"


class CliEngine(FakeEngine):
    """The FakeEngine as the CLI uses an Engine: teams on launch, ticks while following, closed after."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.ticks: list[JobView] = []  # what each tick turns the followed job into
        self.supervisor_alive = True  # `tunebot serve` runs on this database
        self.followed: list[list[str]] = []

    def supervised(self) -> bool:
        return self.supervisor_alive

    def follow(self, job_ids: list[str]) -> list[str]:
        self.followed.append(list(job_ids))
        return []

    def create_job(self, request, *, team=None, **kw):  # type: ignore[no-untyped-def, override]
        return super().create_job(request, **kw)

    def tick(self) -> None:
        if self.ticks:
            view = self.ticks.pop(0)
            self.jobs[view.job_id] = view

    def close(self) -> None:
        pass


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> CliEngine:
    eng = CliEngine()
    monkeypatch.setattr(engine_commands, "_engine", lambda: eng)
    monkeypatch.setattr(engine_commands.time, "sleep", lambda s: None)
    return eng


def full_job(**changes: Any) -> JobView:
    """A job with every fact the CLI used to print: stop reason, place, price, progress, cap, message."""
    view = JobView(
        job_id="j7",
        owner="alice",
        state="failed",
        stop_reason="budget",
        model="meta-llama/Llama-3.1-8B",
        method="qlora",
        provider="vast",
        gpu="rtx-4090",
        gpu_count=1,
        interruptible=True,
        price_per_hour=0.35,
        estimated_cost=1.5,
        max_cost=3.0,
        spend=2.9876,
        step=120,
        max_steps=400,
        loss=1.23456,
        preemptions=2,
        output_uri="s3://bucket/tunebot/j7/output",
        message="spend reached the cap of $3.00",
        created_at=NOW,
        updated_at=NOW,
    )
    return view.model_copy(update=changes)


def terminal(reply: Reply) -> str:
    """The reply as the CLI prints it when piped."""
    out = io.StringIO()
    render(reply, cli_console(out))
    return out.getvalue()


def card(view: JobView) -> Reply:
    return cards.job_card(view, with_buttons=False)


def slack_text(reply: Reply) -> str:
    """Every string of the reply's Block Kit message, unescaped to the characters people see."""
    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "text" and isinstance(value, str):
                    texts.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    message = to_message(reply)
    assert violations(message) == []
    walk(message)
    return unescape("\n".join(texts))


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


JOB_FACTS = (
    "failed (budget)",  # state and stop reason
    "alice",  # owner
    "meta-llama/Llama-3.1-8B",
    "qlora",
    "vast rtx-4090 x1",  # provider and GPU
    "$0.35/h",  # price locked at launch
    "120/400",  # step
    "1.2346",  # loss
    "$2.99 of max $3.00",  # spend against the cap
    "Preemptions",
    "spend reached the cap of $3.00",  # message
    "s3://bucket/tunebot/j7/output",
)


def test_jobs_id_prints_the_slack_job_card(engine: CliEngine) -> None:
    """One job: the CLI prints the card Slack edits in the job's thread, with every fact in both."""
    view = full_job()
    engine.jobs[view.job_id] = view
    out = cli("jobs", "j7")
    assert out == terminal(card(view))
    slack = slack_text(cards.job_card(view))
    for fact in JOB_FACTS:
        assert fact in out, fact
        assert fact in slack, fact
    assert "Stop job" not in out  # the button is Slack's; the CLI has `tunebot stop`


def test_jobs_list_is_the_jobs_table_with_every_fact(engine: CliEngine) -> None:
    view = full_job()
    engine.jobs = {"j7": view, "j8": full_job(job_id="j8", state="running", stop_reason=None, message=None)}
    out = cli("jobs")
    listed = cards.jobs_reply(list(engine.jobs.values()), title="Jobs", detailed=True, limit=None)
    assert out == terminal(listed)
    for fact in (*JOB_FACTS[:5], "$0.35", "120/400", "1.235", "$2.99 of $3.00", "preempt", JOB_FACTS[-2]):
        assert fact in out, fact
    row = next(line for line in out.splitlines() if "j7" in line and "failed" in line)
    assert row.split("│")[-2].strip() == "2"  # the preemptions column
    slack = slack_text(cards.jobs_reply([view], title="Your jobs"))
    for fact in ("failed (budget)", "vast rtx-4090 x1", "$2.99 of $3.00"):  # Slack's table gained them
        assert fact in slack, fact


def test_rich_markup_in_job_text_is_printed_literally(engine: CliEngine) -> None:
    view = full_job(model=HOSTILE, message=HOSTILE + " \\", output_uri=None)
    engine.jobs[view.job_id] = view
    for out in (cli("jobs", "j7"), cli("jobs")):
        assert HOSTILE in out
        assert "[/red]" in out and "evil.example" in out


def test_launch_prints_the_card_then_progress_lines_then_the_final_card(engine: CliEngine) -> None:
    first = full_job(job_id="j1", state="launching", stop_reason=None, step=0, loss=None, message=None)
    running = first.model_copy(update={"state": "running", "step": 50, "loss": 2.5})
    same = running.model_copy()  # nothing new: no line
    done = first.model_copy(update={"state": "succeeded", "step": 400, "loss": 0.9, "message": "all done"})
    engine.ticks = [running, same, done]
    engine.create_job = lambda request, **kw: first  # type: ignore[method-assign]
    engine.jobs["j1"] = first
    out = cli("launch", "llama-3.1-8b", "--dataset", "data.jsonl", "--tokens", "1000", "--wait")
    from bot.commands.supervisor import supervision_line

    who = supervision_line(engine, first, wait=True)  # one line: who supervises the job (this command)
    assert who is not None and who[0].startswith("Supervisor: this command, until the job ends (--wait)")
    expected = (
        terminal(card(first))
        + terminal(text_reply(who[0]))
        + terminal(text_reply(cards.job_line(running)))
        + terminal(card(done))
    )
    assert out == expected
    assert "running · meta-llama/Llama-3.1-8B qlora · step 50/400 · loss 2.500" in out
    assert "Job j1: succeeded" in out and "all done" in out


def test_launch_above_the_approval_amount_says_who_must_approve(engine: CliEngine) -> None:
    out = cli("launch", "expensive", "--dataset", "data.jsonl", "--tokens", "1000")
    assert "Job j1: pending_approval" in out
    assert "needs approval: an admin approves it in Slack, or you, the operator of this machine: " in out
    assert "tunebot approve j1" in out and "--user" not in out


def test_launch_with_no_supervisor_alive_says_so_and_how_to_start_one(
    engine: CliEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEBOT_START_SUPERVISOR", "0")  # not to start one: only say so
    from bot.settings import get_settings

    get_settings.cache_clear()
    engine.supervisor_alive = False
    out = " ".join(cli("launch", "llama-3.1-8b", "--dataset", "data.jsonl", "--tokens", "1000").split())
    assert "Job j1: launching" in out
    assert "No tunebot supervisor is running on this job database" in out
    assert "Run tunebot serve (the way to run tunebot: docs/deploy.md)" in out and "--wait" in out
    engine.supervisor_alive = True
    out = " ".join(cli("launch", "llama-3.1-8b", "--dataset", "data.jsonl", "--tokens", "1000").split())
    assert "No tunebot supervisor" not in out
    assert "Supervisor: the tunebot serve alive on this job database watches the job." in out


def test_launch_with_no_supervisor_alive_starts_one_and_says_so(
    engine: CliEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    import bot.commands.supervisor as supervisor
    from bot.settings import get_settings

    monkeypatch.setenv("TUNEBOT_START_SUPERVISOR", "1")
    get_settings.cache_clear()
    started: list[str] = []

    def start(settings):  # type: ignore[no-untyped-def]
        started.append(str(settings.data_dir))
        engine.supervisor_alive = True  # it takes the lease
        return supervisor.Started(4242, Path(settings.data_dir) / "supervisor.log")

    monkeypatch.setattr(supervisor, "start_background", start)
    engine.supervisor_alive = False
    out = " ".join(cli("launch", "llama-3.1-8b", "--dataset", "data.jsonl", "--tokens", "1000").split())
    assert len(started) == 1 and "No tunebot supervisor" not in out
    assert "Supervisor: none was alive on this job database, so one was started in the background" in out
    assert "(tunebot serve --auto, pid 4242, log " in out and "supervisor.log" in out


def test_approve_and_stop_print_the_job_card(engine: CliEngine) -> None:
    engine.jobs["j7"] = full_job(state="pending_approval", stop_reason=None)
    out = cli("approve", "j7")
    who = terminal(text_reply("Supervisor: the `tunebot serve` alive on this job database watches the job."))
    assert out == terminal(card(engine.jobs["j7"])) + who and "Job j7: approved" in out
    out = cli("stop", "j7", "--user", "alice")
    assert out == terminal(card(engine.jobs["j7"])) and "stopped (user)" in out


def test_spend_prints_the_spend_card(engine: CliEngine) -> None:
    out = cli("spend", "week")
    report = engine.spend("week")
    assert out.splitlines()[0] == "Spend week: $12.50"
    assert out.splitlines()[2:] == terminal(cards.spend_reply(report)).splitlines()[2:]  # the clock moved
    for fact in ("U_ALICE", "$10.00", "$20.00", "50%", "vast", "j1"):
        assert fact in out, fact


def test_volumes_show_ids_usable_with_delete(engine: CliEngine) -> None:
    out = cli("volumes")
    (volume,) = engine.volumes()
    assert out == terminal(cards.volumes_reply([volume]).add(Context([engine_commands.VOLUME_HINT])))
    row = next(line for line in out.splitlines() if "llama-ckpts" in line)
    provider, volume_id = (cell.strip() for cell in row.split("│")[1:3])
    assert (provider, volume_id) == ("runpod", "vol-1")
    assert "vol-1" in slack_text(cards.volumes_reply([volume]))  # Slack's list shows the id too
    deleted = CliRunner().invoke(app, ["volumes", "--delete", volume_id, "--provider", provider, "--yes"])
    assert deleted.exit_code == 0 and engine.deleted == ["vol-1"]


def test_bad_input_stays_an_error_line_and_exit_2(engine: CliEngine) -> None:
    for args in (["jobs", "nope"], ["stop", "nope"], ["approve", "nope"], ["spend", "decade"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output


def test_json_output_is_unchanged(engine: CliEngine) -> None:
    view = full_job()
    engine.jobs[view.job_id] = view
    dumped = json.dumps([view.model_dump(mode="json", exclude={"losses"})], indent=1) + "\n"
    assert cli("jobs", "--json") == dumped
    assert cli("spend", "today", "--json").startswith('{\n "period": "today",')


def _estimate_request():  # type: ignore[no-untyped-def]
    from bot.commands.request_cli import build_request

    return build_request("qwen2.5-7b", [("method", "qlora"), ("tokens", "5000000"), ("gpu", "rtx-4090")])


def test_estimate_prints_the_detailed_estimate_card(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tunebot estimate` is the estimate card in its detailed form, and the details render in Slack too."""
    from fakes.snapshot_plan import snapshot_plan

    from bot.settings import get_settings

    monkeypatch.setenv("TUNEBOT_LOCAL_PROVIDER", "0")  # nothing to launch here: the snapshot's own labels
    monkeypatch.setenv("TUNEBOT_RUNNER_IMAGE", "ghcr.io/acme/runner:1")  # prebuilt: no install to price
    get_settings.cache_clear()

    est = snapshot_plan(_estimate_request())
    out = cli(
        "estimate",
        "qwen2.5-7b",
        "--method",
        "qlora",
        "--tokens",
        "5000000",
        "--gpu",
        "rtx-4090",
        "--physics-only",
    )
    detailed = cards.estimate_reply(est, estimate_id=None, detailed=True)
    assert out == terminal(detailed)
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()]
    for component, gb in est.memory.breakdown_gb.items():  # the memory breakdown: a table row per component
        assert not gb or [component, f"{gb:.2f}"] in rows, component
    assert f"{est.model.parameters:,} parameters" in out
    assert f"{est.speed.step_seconds:.2f} s per optimizer step" in out
    for assumption in est.assumptions:  # whole lines when piped, however long
        assert assumption in out.splitlines()
    slack = slack_text(detailed)
    assert "Peak memory per GPU" in slack and "s per optimizer step" in slack and "Offers that fit" in slack


def test_estimate_card_for_slack_is_unchanged_by_the_detailed_form() -> None:
    from fakes.snapshot_plan import snapshot_plan

    est = snapshot_plan(_estimate_request())
    short = terminal(cards.estimate_reply(est, estimate_id="e1"))
    assert "Memory breakdown:" in short and "s per optimizer step" not in short
    assert "Offers ranked by expected total cost" in short and "Launch cheapest" in short


def test_resume_on_the_command_line_says_how_to_follow_the_job(engine: CliEngine) -> None:
    """Issue 27: `tunebot resume` printed "Progress goes to its thread": the CLI has no thread."""
    from bot.chat.permissions import Permissions

    engine.permissions = Permissions()  # type: ignore[attr-defined]
    engine.jobs["j7"] = full_job(state="stopped", stop_reason="user")
    out = " ".join(cli("resume", "j7", "--user", "alice").split())
    assert "Resuming job j7" in out and "its thread" not in out
    assert "Follow it with tunebot jobs j7 (or --wait)." in out
