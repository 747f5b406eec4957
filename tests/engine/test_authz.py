"""Issue 19, item 4, through the CLI and the console: the refusals Slack gets (tests/chat/test_authz_e2e.py),
because the engine decides them. The CLI runs against the fake Vast API on 127.0.0.1 (its key and URL in the
environment), so `tunebot ...` builds its engine exactly as in production.
"""

from __future__ import annotations

import time

import pytest
from fakes.clouds import FakeVast
from fakes.clouds.fixtures import use_fake_env
from typer.testing import CliRunner

from bot.cli import app


@pytest.fixture
def vast():  # type: ignore[no-untyped-def]
    fake = FakeVast().start()
    yield fake
    fake.stop()


@pytest.fixture
def cli_env(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("TUNEBOT_ADMINS", "root")
    from bot.settings import get_settings

    get_settings.cache_clear()
    yield tmp_path / "cli"
    get_settings.cache_clear()


def test_cli_refuses_to_delete_a_volume_tunebot_never_created(cli_env, vast, monkeypatch):
    """a9605e4: `tunebot volumes --delete` deleted any provider volume for anyone (no owner, no check)."""
    use_fake_env(monkeypatch, vast)
    vast.volumes["77"] = {
        "id": 77,
        "name": "company-prod-db",
        "size": 500,
        "storage_cost": 0.1,
        "instances": [],
        "idle_since": time.time(),
    }
    runner = CliRunner()
    for user in ("mallory", "root"):
        out = runner.invoke(app, ["volumes", "--delete", "77", "--provider", "vast", "--yes", "--user", user])
        assert out.exit_code == 2, out.output
        assert "did not create or attach this volume" in out.output and "Traceback" not in out.output
        out = runner.invoke(app, ["volumes", "--keep", "77", "--provider", "vast", "--user", user])
        assert out.exit_code == 2 and "did not create or attach" in out.output
    assert "77" in vast.volumes
    listed = runner.invoke(app, ["volumes"])
    assert listed.exit_code == 0 and "company-prod-db" in listed.output and "untracked" in listed.output


def console_session(engine):  # type: ignore[no-untyped-def]
    """`tunebot console` on a real engine: the operator's own door, answering like Slack."""
    import io

    from rich.console import Console

    from bot.chat.console import ConsoleNotifier, ConsoleSession
    from bot.chat.handlers import ChatHandlers

    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, color_system=None)
    ConsoleNotifier(engine, console).attach(engine.bus)
    return ConsoleSession(ChatHandlers(engine), console, user="me"), buf


def test_console_refuses_an_unbounded_max_cost_and_asks_approval_for_a_large_one(make_engine):
    from .conftest import TRAIN_JSONL
    from .fakes import FakeProvider

    cloud = FakeProvider("vast", price=0.40)
    eng = make_engine(providers={"vast": cloud})
    session, buf = console_session(eng)
    words = f"launch Llama-3.1-8B method=qlora dataset={TRAIN_JSONL}"
    session.run([f"{words} max_cost=$1000000", "cheapest", f"{words} max_cost=$900", "cheapest"])
    out = buf.getvalue()
    assert "above this bot's limit" in out and "may spend up to $900.00" in out, out
    (job,) = eng.list_jobs()
    assert job.state == "pending_approval" and cloud.creates == 0


def test_cli_launch_is_refused_by_a_spent_budget_with_who_can_raise_it(cli_env, tmp_path):
    """a9605e4: a user at 2,350% of their daily budget still launched (budgets only alerted)."""
    from bot.engine.record.spend import day_start
    from bot.engine.service import Engine
    from bot.settings import get_settings
    from store.models import SpendEntry

    from .conftest import TRAIN_JSONL

    eng = Engine(get_settings())
    eng.set_budget("user", "mallory", daily=1.0, monthly=None, user="root")
    with eng.session() as s:  # $23.50 already spent today: 2,350% of the budget
        now = eng.now()
        s.add(
            SpendEntry(
                source="instance:0",
                kind="compute",
                owner="mallory",
                team="local",
                provider="vast",
                period_start=day_start(now),
                seconds=3600,
                rate_per_hour=23.5,
                amount=23.5,
                updated_at=now,
            )
        )
        s.commit()
    eng.close()
    out = CliRunner().invoke(app, ["launch", "Llama-3.2-1B", "--dataset", TRAIN_JSONL, "--user", "mallory"])
    assert out.exit_code == 2, out.output
    assert "mallory's daily budget of $1.00 is spent ($23.50 today)" in " ".join(out.output.split())
    assert "an admin (root) can raise it" in " ".join(out.output.split()) and "Traceback" not in out.output
    eng = Engine(get_settings())
    assert eng.list_jobs() == []
    eng.close()


@pytest.mark.slow
def test_serve_warns_at_start_when_no_admin_is_configured(tmp_path):
    """a9605e4: with no TUNEBOT_ADMINS anyone but the owner approved, and `tunebot serve` said nothing."""
    import os
    import signal
    import subprocess
    import sys

    import httpx
    from fakes.slack_api import FakeSlack

    from .test_replicas import free_port

    def serve(**extra: str) -> str:
        port = free_port()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TUNEBOT_", "SLACK_", "DATABASE_URL"))
        }
        env.update(
            TUNEBOT_DATA_DIR=str(tmp_path / f"serve{port}"),
            SLACK_BOT_TOKEN="xoxb-warn-test",
            SLACK_SIGNING_SECRET="warn-secret",
            SLACK_API_URL=slack.api_url,
            **extra,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--http", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.time() + 60
            while time.time() < deadline and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        return " ".join(out.decode("utf-8", "replace").split())

    with FakeSlack() as slack:
        bare = serve()
        assert "TUNEBOT_ADMINS is not set: no member may approve a job in Slack" in bare, bare[-2000:]
        assert "TUNEBOT_ALLOWED_CHANNELS is not set" in bare
        configured = serve(TUNEBOT_ADMINS="U_BOSS", TUNEBOT_ALLOWED_CHANNELS="C_ML")
        assert "TUNEBOT_ADMINS is not set" not in configured and "Uvicorn running" in configured, configured[
            -2000:
        ]
