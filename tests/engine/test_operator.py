"""Issues 27 and 28: the CLI and the console are one identity, the operator (an admin of the bot's machine).

On eac3cff a CLI user was `$USER` (or `cli`, `@cli` in messages) and the console's `console`; and `tunebot
approve JOB --user NAME` approved in any name, a Slack admin's included.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot.cli import app
from bot.engine.permissions import OPERATOR
from store.models import AuditLog, Job

from .conftest import estimate_for, request
from .fakes import FakeProvider


@pytest.fixture
def cli_env(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("USER", "alice")  # the login name of whoever types: not who acts
    monkeypatch.delenv("TUNEBOT_ADMINS", raising=False)
    from bot.settings import get_settings

    get_settings.cache_clear()
    yield tmp_path / "cli"
    get_settings.cache_clear()


def _pending(owner: str, n: int = 2) -> list[str]:
    """Jobs of ``owner`` waiting for approval (no admin configured), made on the CLI's database."""
    from bot.engine.service import Engine
    from bot.settings import get_settings

    fake = FakeProvider("fake")
    eng = Engine(get_settings(), providers={"fake": fake})
    try:
        ids = [
            eng.create_job(request(), user=owner, estimate=estimate_for(fake, hours=500.0)).job_id
            for _ in range(n)
        ]
        assert {eng.get_job(i).state for i in ids} == {"pending_approval"}
        return ids
    finally:
        eng.close()


def _approver(job_id: str) -> str | None:
    from bot.engine.service import Engine
    from bot.settings import get_settings

    eng = Engine(get_settings(), providers={})
    try:
        with eng.session() as s:
            return s.get(Job, job_id).approved_by  # type: ignore[union-attr]
    finally:
        eng.close()


def test_the_cli_and_the_console_approve_as_the_one_operator(cli_env):
    """eac3cff: `tunebot approve` acted as $USER (here alice, the job's owner: refused as her own job) and the
    console as `console`; now both are the operator, whatever the login name."""
    cli_job, console_job = _pending("alice")
    out = CliRunner().invoke(app, ["approve", cli_job])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["console"], input=f"approve {console_job}\nexit\n")
    assert out.exit_code == 0 and "approved job" in out.output, out.output
    assert _approver(cli_job) == _approver(console_job) == OPERATOR
    assert "@operator approved" in " ".join(out.output.split())


def test_cli_approve_never_acts_in_a_members_name(cli_env, monkeypatch):
    """eac3cff: `tunebot approve JOB --user U_BOSS` approved as the Slack admin U_BOSS (anyone at the bot's
    machine could sign for anyone)."""
    monkeypatch.setenv("TUNEBOT_ADMINS", "U_BOSS")
    from bot.settings import get_settings

    get_settings.cache_clear()
    (job_id,) = _pending("U_ALICE", 1)
    for name in ("U_BOSS", "U_ALICE", "bob"):
        out = CliRunner().invoke(app, ["approve", job_id, "--user", name])
        assert out.exit_code == 2, out.output
        assert "never in someone else's name" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(app, ["console", "--user", "U_BOSS"], input=f"approve {job_id}\nexit\n")
    assert out.exit_code == 2 and "never in someone else's name" in out.output, out.output
    assert _approver(job_id) is None
    from bot.engine.service import Engine

    eng = Engine(get_settings(), providers={})
    try:
        with eng.session() as s:
            actors = {a.actor for a in s.query(AuditLog).where(AuditLog.job_id == job_id)}
        assert actors == {"U_ALICE"}  # nobody approved, in nobody's name
    finally:
        eng.close()
