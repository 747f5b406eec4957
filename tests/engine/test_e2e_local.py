"""End to end on this machine: the real runner and a tiny model through the local provider.

The job is preempted twice (SIGTERM through LocalProvider.preempt, like a spot reclaim), relaunched
and resumed from its checkpoint twice, and finishes; its spend is exactly its instances' billed
seconds times their locked prices.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.planner.request import EstimateRequest
from bot.settings import Settings
from store.models import Instance, RunnerEventRecord

from .conftest import Recorder
from .fakes import make_estimate

MAX_STEPS = 24


@pytest.mark.slow
def test_preempted_twice_resumed_twice_finishes_with_exact_spend(tmp_path: Path) -> None:
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    local = LocalProvider(workdir=tmp_path / "local", price_per_hour=50.0)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e2e.db'}", providers={"local": local})
    rec = Recorder(eng.bus)
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(tiny / "data.jsonl"),
        method="lora",
        lora_r=8,
        seq_len=256,
        batch_size=4,
        grad_accum=2,
        gradient_checkpointing=False,
    )
    overrides = {
        "max_steps": MAX_STEPS,
        "learning_rate": 0.01,
        "plateau": {"enabled": False},
        "seed": 0,
        "checkpoint": {"every_minutes": 0.05},
        "report": {"every_seconds": 0.2},  # progress often enough to preempt mid-run on a fast machine
    }
    job = eng.create_job(
        req,
        user="alice",
        estimate=make_estimate([local.offer()], hours=0.01),
        max_cost=10.0,
        spec_overrides=overrides,
    )
    assert job.state == "running", job.message
    preempt_at = [6, 14]
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            eng.tick()
            view = eng.get_job(job.job_id)
            if view.state in ("succeeded", "stopped", "failed"):
                break
            if preempt_at and view.state == "running" and view.step >= preempt_at[0]:
                with eng.session() as s:
                    row = (
                        s.execute(
                            select(Instance).where(Instance.job_id == job.job_id, Instance.ended_at.is_(None))
                        )
                        .scalars()
                        .first()
                    )
                    # Preempt the current run only once it has itself reported "started" (a run
                    # killed before its SIGTERM handler exists did no work and resumes nothing).
                    launched = (
                        s.execute(select(Instance).where(Instance.job_id == job.job_id)).scalars().all()
                    )
                    started_so_far = (
                        s.execute(
                            select(RunnerEventRecord).where(
                                RunnerEventRecord.job_id == job.job_id, RunnerEventRecord.kind == "started"
                            )
                        )
                        .scalars()
                        .all()
                    )
                if row is not None and len(started_so_far) == len(launched):
                    local.preempt(row.provider_instance_id, 60.0)
                    preempt_at.pop(0)
            time.sleep(0.3)
        view = eng.get_job(job.job_id)
        assert view.state in ("succeeded", "stopped"), f"{view.state}: {view.message}"
        assert view.stop_reason in (None, "plateau")
        assert view.preemptions == 2
        assert view.step == MAX_STEPS
        assert view.output_uri and Path(view.output_uri).exists()
        with eng.session() as s:
            rows = s.execute(select(Instance).where(Instance.job_id == job.job_id)).scalars().all()
            started = (
                s.execute(
                    select(RunnerEventRecord)
                    .where(RunnerEventRecord.job_id == job.job_id, RunnerEventRecord.kind == "started")
                    .order_by(RunnerEventRecord.seq)
                )
                .scalars()
                .all()
            )
        assert len(rows) == 3 and all(r.ended_at is not None for r in rows)
        # Three runs reported "started"; the two resumed ones say where they resumed from (their seqs
        # restart at the checkpoint's and replace the old run's later events).
        resumed = [e for e in started if (e.payload.get("message") or "").startswith("resumed from")]
        assert len(started) == 3 and len(resumed) == 2, [e.payload for e in started]
        # Each relaunch resumed from a checkpoint of the same folder (the runner says so in its log).
        logs = [local.log_path(r.provider_instance_id).read_text() for r in rows]
        assert "resumed from" not in logs[0]
        assert all("resumed from" in text for text in logs[1:]), logs[1][-2000:]
        expected = sum((r.ended_at - r.launched_at) * r.price_per_hour / 3600 for r in rows)
        assert expected > 0.05
        assert round(view.spend, 2) == round(expected, 2)
        assert eng.spend("today", user="alice").total == pytest.approx(expected, abs=0.005)
        kinds = rec.kinds()
        assert kinds.count("preempted") == 2 and kinds.count("recovered") == 2
        assert "job_started" in kinds and "progress" in kinds and kinds[-1] in ("finished", "plateau")
        assert local.list_instances() == []
    finally:
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()
