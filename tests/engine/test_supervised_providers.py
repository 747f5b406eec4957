"""Offered is not supervised: a Slack `tunebot serve` supervises the local jobs the CLI launched.

A Slack `serve` keeps the local provider off (TUNEBOT_LOCAL_PROVIDER unset or 0: no training on the bot's own
machine), while the CLI on the same store and data folder has it on. Before, the serve's engine knew only the
providers it offers, so a local job launched from the CLI was observed by nobody ("not configured": nothing
decided), a stop asked of it never reached the runner, and its instance was never torn down or charged to its
end. Here the CLI launches a local job (a runner stand-in), then a Slack serve's engine, built as `serve`
builds it, must not offer the local provider but must stop, observe, charge and tear the job down.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bot.engine.record.jobstate import JobState
from bot.planner.request import EstimateRequest
from bot.providers.local import LocalProvider
from bot.settings import get_settings

from .fakes import make_estimate

# Acts like the runner under SIGTERM: checkpoints (nothing here) and exits 75 at once.
SLEEPER = [
    sys.executable,
    "-c",
    "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\ntime.sleep(120)",
]


@pytest.mark.parametrize("setting", [None, "0"])
def test_a_slack_serve_supervises_local_jobs_the_cli_launched(
    setting: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.commands.chat_commands import _runtime
    from bot.engine.service import Engine

    if setting is None:
        monkeypatch.delenv("TUNEBOT_LOCAL_PROVIDER", raising=False)
    else:
        monkeypatch.setenv("TUNEBOT_LOCAL_PROVIDER", setting)
    get_settings.cache_clear()
    settings = get_settings()
    # The CLI's engine: the local provider on, in the data folder's work dir (the runner is a stand-in).
    cli_local = LocalProvider(workdir=settings.data_dir / "local-provider", runner_command=SLEEPER)
    cli = Engine(settings, providers={"local": cli_local})
    data = tmp_path / "train.jsonl"
    data.write_text('{"instruction": "Say hi.", "input": "", "output": "hi"}\n')
    job = cli.create_job(
        EstimateRequest(model="tiny", dataset=str(data)),
        user="alice",
        estimate=make_estimate([cli_local.offer()]),
    )
    assert cli.get_job(job.job_id).state == JobState.RUNNING
    (inst,) = cli_local.list_instances()
    cli.close()
    time.sleep(1.0)  # let the stand-in install its SIGTERM handler

    _, serve, _ = _runtime(serving=True)  # a Slack `tunebot serve`, as the command builds it
    try:
        assert "local" not in serve.providers  # never offered for a new job here
        est = serve.estimate(EstimateRequest(model="llama-3.2-1b", tokens=2_000, seq_len=256))
        assert all(o.provider != "local" for o in est.offers)
        assert "local" in serve.supervisable
        serve.tick()  # observed: still running, nothing refused as "not configured"
        assert serve.get_job(job.job_id).state == JobState.RUNNING
        serve.stop(job.job_id, user="alice")  # reaches the runner (SIGTERM: it checkpoints and exits)
        deadline = time.time() + 30
        while time.time() < deadline and serve.get_job(job.job_id).state != JobState.STOPPED:
            serve.tick()
            time.sleep(0.1)
        view = serve.get_job(job.job_id)
        assert view.state == JobState.STOPPED, view.message
        assert cli_local.list_instances() == []  # torn down
        assert cli_local.status(inst.instance_id).status.value == "terminated"
        with serve.session() as s:
            from sqlalchemy import select

            from store.models import Instance

            rows = s.execute(select(Instance).where(Instance.job_id == job.job_id)).scalars().all()
        assert [r.ended_at is not None for r in rows] == [True]  # charged to its end, no open row
        assert serve.reconcile().skipped_providers == []
    finally:
        for left in cli_local.list_instances():
            cli_local.terminate(left.instance_id)
        serve.close()


def test_an_engine_given_its_providers_supervises_exactly_those(tmp_path: Path) -> None:
    """Tests and the demo pass their providers: nothing is added behind them."""
    from bot.engine.service import Engine

    local = LocalProvider(workdir=tmp_path / "local")
    eng = Engine(get_settings(), db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"local": local})
    try:
        assert dict(eng.supervisable) == {"local": local} == eng.providers
    finally:
        eng.close()
