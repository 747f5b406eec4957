"""A job of real length, end to end: the status follows the runner to its last step (issue 27, item 2).

Every earlier end-to-end job was short enough never to meet the bot's event size limit. On eac3cff a report
carrying a few hundred steps (a fast runner, a longer report interval) was over 16 KB and refused: one
500-step job's status stopped at step 81 while its runner was at 448, another ended "Step 0/500". Here a
2,000-step job on the tiny model (the real runner, the local provider) reports only at its end, so one
report carries every step: the job's view reaches step 2,000 from that report and the chart has all 2,000
points; `tunebot jobs JOB --json` (another process, the same database) says the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.planner.request import EstimateRequest
from bot.settings import Settings
from store.models import RunnerEventRecord

from .fakes import make_estimate

STEPS = 2000


@pytest.mark.slow
def test_a_2000_step_job_reaches_its_last_step_in_the_status_and_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a tiny model: one thread is fastest on a busy machine
    tiny = make_tiny(tmp_path / "tiny").parent
    local = LocalProvider(workdir=tmp_path / "local", price_per_hour=0.10)
    data_dir = tmp_path / "data"
    db_url = f"sqlite:///{tmp_path / 'long.db'}"
    # One report in all (at the last step): no heartbeat is expected before it.
    settings = Settings(TUNEBOT_DATA_DIR=str(data_dir), TUNEBOT_HEARTBEAT_TIMEOUT=7200)
    eng = Engine(settings, db_url=db_url, providers={"local": local})
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(tiny / "data.jsonl"),
        method="lora",
        lora_r=4,
        seq_len=64,
        batch_size=1,
        grad_accum=1,
        gradient_checkpointing=False,
    )
    overrides = {
        "max_steps": STEPS,
        "learning_rate": 1e-3,
        "lora": {"dropout": 0.0},
        "plateau": {"enabled": False},
        "checkpoint": {"every_minutes": 600.0},
        "report": {"every_seconds": 3600.0},  # the whole run between two reports
    }
    job = eng.create_job(
        req, user="alice", estimate=make_estimate([local.offer()], hours=0.05), spec_overrides=overrides
    )
    assert job.state == "running", job.message
    deadline = time.time() + 1500  # minutes on a busy 2-core machine; well under one on an idle one
    try:
        while time.time() < deadline:
            eng.tick()
            if eng.get_job(job.job_id).state in ("succeeded", "stopped", "failed"):
                break
            time.sleep(1.0)
        view = eng.get_job(job.job_id)
        assert view.state == "succeeded", f"{view.state}: {view.message}"
        assert view.step == STEPS and view.max_steps == STEPS
        with eng.session() as s:
            rows = s.execute(
                select(RunnerEventRecord.kind, RunnerEventRecord.step).where(
                    RunnerEventRecord.job_id == job.job_id
                )
            ).all()
        # The runner's own progress report reached the last step (not only the closing event).
        assert max(step for kind, step in rows if kind == "progress") == STEPS, rows
        series = eng.series(job.job_id)
        assert [s for s, _ in series.train] == list(range(1, STEPS + 1))
        assert [s for s, _ in series.lr] == list(range(1, STEPS + 1))
        log = local.log_path(next(r.provider_instance_id for r in _instances(eng, job.job_id))).read_text()
        assert f"step {STEPS}/{STEPS}" in log
    finally:
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TUNEBOT_", "DATABASE_"))},
        "DATABASE_URL": db_url,
        "TUNEBOT_DATA_DIR": str(data_dir),
    }
    shown = subprocess.run(
        [sys.executable, "-m", "bot.cli", "jobs", job.job_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    (seen,) = json.loads(shown.stdout)
    assert seen["step"] == STEPS and seen["max_steps"] == STEPS and seen["state"] == "succeeded"


def _instances(eng, job_id: str):  # type: ignore[no-untyped-def]
    from store.models import Instance

    with eng.session() as s:
        return list(s.execute(select(Instance).where(Instance.job_id == job_id)).scalars())
