"""A job id is checked for its shape before any lookup, at every door (engine, /runner/events, CLI).

On PostgreSQL a NUL in a text parameter is an error, not a miss: before, `record_runner_event` raised,
/runner/events answered 500 and logged the id raw, so a newline in it forged a log line.
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fakes.runner_events import signed
from fakes.worlds import serve_web
from typer.testing import CliRunner

from bot.engine.api import EngineError
from runner.contract.spec import JobSpec

from .conftest import estimate_for, request

HOSTILE = ["j\x00b", "j1\nERROR forged log line", "x" * 5000, "", " j1", "../j1", "j1\u202e"]


def _token(fake) -> str:  # noqa: ANN001
    return JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_engine_refuses_a_malformed_job_id_before_the_lookup(engine, fake, bad: str) -> None:  # noqa: ANN001
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    for call in (
        lambda: engine.get_job(bad),
        lambda: engine.stop(bad, user="alice"),
        lambda: engine.approve(bad, approver="admin"),
        lambda: engine.set_thread(bad, channel="C1", thread_ts="1.2"),
    ):
        with pytest.raises(EngineError, match="is not a job id"):
            call()
    event = {"job_id": bad, "seq": 1, "kind": "progress"}
    assert engine.record_runner_event(bad, _token(fake), event) is False
    assert engine.get_job(job.job_id).job_id == job.job_id  # a good id still works


def test_runner_events_with_a_hostile_job_id_are_400_and_log_nothing_raw(
    engine,
    fake,
    caplog: pytest.LogCaptureFixture,  # noqa: ANN001
) -> None:
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = _token(fake)
    # without the token look-up (the token is then checked after the parse), and as `tunebot serve` wires it
    for lookup in (None, "runner_token_job"):
        if lookup is not None:
            assert engine.runner_token_job(token) == job.job_id
            assert engine.runner_token_job("B" * 43) is None
            lookup = engine.runner_token_job
        extra = {"runner_token_job": lookup} if lookup else {}
        served = serve_web(record_runner_event=engine.record_runner_event, **extra)
        with served as server, caplog.at_level(logging.INFO):
            for bad in HOSTILE:
                event = {"job_id": bad, "seq": 1, "kind": "progress", "step": 1}
                resp = httpx.post(
                    server.url + "/runner/events",
                    content=json.dumps(event),
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=10,
                )
                assert resp.status_code in (400, 401), (bad, resp.status_code, resp.text)
            good = signed(
                engine, {"job_id": job.job_id, "seq": 1, "kind": "progress", "step": 1, "timestamp": 1000.0}
            )
            resp = httpx.post(
                server.url + "/runner/events",
                json=good,
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
            assert resp.status_code == 200, resp.text
    lines = "\n".join(r.getMessage() for r in caplog.records).splitlines()
    assert not any(line.startswith("ERROR forged") for line in lines)
    assert not any("\x00" in line for line in lines)


def test_the_cli_answers_a_hostile_job_id_with_exit_2(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    from bot.settings import get_settings

    get_settings.cache_clear()
    runner = CliRunner()
    for args in (["jobs", "j1\nERROR forged"], ["stop", "j1\x1b[31m"], ["approve", "x" * 300]):
        result = runner.invoke(app_(), args)
        assert result.exit_code == 2, (args, result.output)
        assert "is not a job id" in result.output and "Traceback" not in result.output
        assert "\nERROR forged" not in result.output and "\x1b[31m" not in result.output
    get_settings.cache_clear()


def app_():  # type: ignore[no-untyped-def]
    from bot.cli import app

    return app
