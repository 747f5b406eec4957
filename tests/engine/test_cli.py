"""`tunebot launch | jobs | spend | reconcile | volumes`: clear messages, exit code 2 on bad input."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from bot.cli import app

from .conftest import estimate_for, request
from .fakes import FakeProvider


@pytest.fixture
def cli_env(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    from bot.settings import get_settings

    get_settings.cache_clear()
    return tmp_path / "cli"


def test_bad_input_is_exit_2_without_traceback(cli_env):
    runner = CliRunner()
    for args in (
        ["spend", "decade"],
        ["volumes", "--delete", "v1"],
        ["launch", "m", "--dataset", "d", "--seq-len", "1"],
        ["jobs", "nope"],
        ["launch", "m", "--dataset", "d", "--max-cost", "-1"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and "error:" in result.output


def test_jobs_spend_reconcile_volumes_show_engine_state(cli_env):
    from bot.engine.service import Engine
    from bot.settings import get_settings

    fake = FakeProvider("fake")
    eng = Engine(get_settings(), providers={"fake": fake})
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake))
    eng.stop(job.job_id, user="alice")
    eng.close()
    runner = CliRunner()
    out = runner.invoke(app, ["jobs"])
    assert out.exit_code == 0 and job.job_id in out.output and "stopped" in out.output
    out = runner.invoke(app, ["jobs", job.job_id, "--json"])
    assert out.exit_code == 0 and '"state": "stopped"' in out.output
    out = runner.invoke(app, ["spend", "month"])
    assert out.exit_code == 0 and "alice" in out.output
    out = runner.invoke(app, ["reconcile", "--no-resume"])
    assert out.exit_code == 0 and "adopted 0" in out.output
    out = runner.invoke(app, ["volumes"])
    assert out.exit_code == 0 and "no volumes" in out.output.lower()


def test_compare_and_sweep_refuse_bad_input_with_exit_2(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`tunebot compare` and `tunebot sweep` speak the chat's grammar: a correction and exit status 2."""
    from typer.testing import CliRunner

    from bot.cli import app

    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "home"))
    runner = CliRunner()
    one = runner.invoke(app, ["compare", "j1"])
    assert one.exit_code == 2 and "`compare` needs two jobs or more" in one.output
    flat = runner.invoke(app, ["sweep", "llama-3.1-8b", "lr=1e-4", "max_cost=5"])
    assert flat.exit_code == 2 and "a sweep needs an option with several values" in flat.output
    capless = runner.invoke(app, ["sweep", "llama-3.1-8b", "lr=1e-4,2e-4"])
    assert capless.exit_code == 2 and "a sweep needs max_cost=$X" in capless.output
    unknown = runner.invoke(app, ["compare", "nope1", "nope2", "--user", "alice"])
    assert unknown.exit_code == 2 and "no job nope1" in unknown.output and "Traceback" not in unknown.output


class _BrokenClient(FakeProvider):
    """A cloud client with a bug: its quote raises what no provider error maps (issue 38's
    DetachedInstanceError was such an error), so a launch taken over after a crash raises."""

    def quote(self, offer):  # type: ignore[no-untyped-def]
        raise RuntimeError("the client broke at https://cloud.example/v1?api_key=vast-secret-key-123")


def test_reconcile_says_a_take_over_that_raised_in_one_line_and_names_it(cli_env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 38: `tunebot reconcile` takes over a launch whose process died; the launch raises. The terminal
    gets one line per failure and no traceback (that goes to the data folder's log), the summary names the job
    and its reason, the exit status is 0 (the pass completed) and the job is back in recovering."""
    from bot.commands import engine_commands
    from bot.engine.launching.launch import claim
    from bot.engine.service import Engine
    from bot.settings import get_settings

    monkeypatch.setenv("VAST_API_KEY", "vast-secret-key-123")  # what the client's error text carries
    broken = _BrokenClient("fake")
    before = Engine(get_settings(), providers={"fake": broken})
    before.auto_launch = False
    job = before.create_job(request(), user="alice", estimate=estimate_for(broken)).job_id
    assert claim(before, job, actor="test")  # launching; then the bot died before it rented anything
    before.close()
    monkeypatch.setattr(
        engine_commands, "_engine", lambda: Engine(get_settings(), providers={"fake": broken})
    )
    # as in a real process: no handler on the root logger but what the CLI sets up (pytest adds its own)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])

    out = CliRunner().invoke(app, ["reconcile"])

    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output, out.output
    log = cli_env / "supervisor.log"
    broke = "the client broke at https://cloud.example/v1?api_key=***"
    warning = f"warning: launch of job {job} failed: RuntimeError: {broke} (traceback in {log})"
    assert warning in out.output.splitlines(), out.output
    reason = f"launch failed: RuntimeError: {broke}"
    assert f"  not done: job {job}: {reason}; back in recovering" in out.output.splitlines(), out.output
    assert "Traceback" in log.read_text() and f"RuntimeError: {broke}" in log.read_text()
    assert "vast-secret-key-123" not in out.output + log.read_text()
    after = Engine(get_settings(), providers={"fake": broken})
    view = after.get_job(job)
    after.close()
    assert (view.state, view.message) == ("recovering", reason)
    assert broken.creates == 0
