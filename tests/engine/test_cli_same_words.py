"""The CLI takes the chat's words (issue 38, item 3): `tunebot status [JOB|SWEEP]` exists, `tunebot resume JOB
max_cost=$X` sets the cap as `/tune resume` does, `tunebot jobs all|mine` and `tunebot gpus GPU` read as the
chat's `jobs` and `gpus`; a sweep id given to `tunebot jobs` says where sweeps are shown."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot.cli import app

from .conftest import estimate_for, request
from .fakes import FakeProvider


@pytest.fixture
def stopped_job(monkeypatch: pytest.MonkeyPatch) -> str:
    """A job of the operator, stopped by its owner, on the CLI's job database; approval above $1."""
    monkeypatch.setenv("TUNEBOT_APPROVAL_ABOVE", "1")
    from bot.engine.permissions import OPERATOR
    from bot.engine.service import Engine
    from bot.settings import get_settings

    get_settings.cache_clear()
    fake = FakeProvider("fake")
    eng = Engine(get_settings(), providers={"fake": fake})
    job = eng.create_job(request(), user=OPERATOR, estimate=estimate_for(fake), max_cost=0.5)
    eng.stop(job.job_id, user=OPERATOR)
    eng.close()
    return job.job_id


def test_status_shows_a_job_and_says_which_sweep_is_missing(stopped_job: str) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["status", stopped_job])
    assert out.exit_code == 0, out.output
    assert f"Job {stopped_job}" in out.output and "stopped" in out.output
    mine = runner.invoke(app, ["status"])  # no id: the active jobs of whoever asks (none here)
    assert mine.exit_code == 0 and "active jobs" in mine.output.lower(), mine.output
    sweep = runner.invoke(app, ["status", "sw-0a1b2c3d4e5f"])
    assert sweep.exit_code == 2 and "no sweep sw-0a1b2c3d4e5f" in sweep.output, sweep.output
    jobs = runner.invoke(app, ["jobs", "sw-0a1b2c3d4e5f"])
    assert jobs.exit_code == 2 and "tunebot status sw-0a1b2c3d4e5f" in jobs.output, jobs.output


def test_resume_takes_max_cost_as_the_chat_writes_it(stopped_job: str) -> None:
    """`resume JOB max_cost=$5`, the form the engine's own hints write: the new cap reaches the job (above the
    $1 approval amount, it waits for approval instead of launching)."""
    runner = CliRunner()
    out = runner.invoke(app, ["resume", stopped_job, "max_cost=$5"])
    assert out.exit_code == 0, out.output
    assert "pending_approval" in out.output and "max $5.00" in out.output, out.output
    bad = runner.invoke(app, ["resume", stopped_job, "lr=1e-4"])
    assert bad.exit_code == 2 and "`resume` takes only max_cost=$X" in bad.output, bad.output
    assert "usage: tunebot resume JOB [max_cost=$X]" in bad.output


def test_jobs_all_and_mine_and_gpus_by_name(stopped_job: str) -> None:
    runner = CliRunner()
    for scope in ("all", "mine"):
        out = runner.invoke(app, ["jobs", scope])
        assert out.exit_code == 0 and stopped_job in out.output, (scope, out.output)
    other = runner.invoke(app, ["jobs", "mine", "--user", "bob"])
    assert other.exit_code == 0 and stopped_job not in other.output
    gpus = runner.invoke(app, ["gpus", "h100"])
    assert gpus.exit_code == 0 and "H100" in gpus.output and "RTX" not in gpus.output, gpus.output
