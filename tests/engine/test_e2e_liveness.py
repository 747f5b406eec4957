"""Issue 38 end to end, with the real runner training the tiny model through the local provider and the engine
supervising as `tunebot serve` does (its scheduler: tick, reconcile).

1. A job that reports once an hour (TUNEBOT_REPORT_EVERY=3600) runs 1,200 steps under a heartbeat timeout of a
   few seconds and ends succeeded with no preemption: its heartbeat, not its reports, says it lives. The
   provider here is the local one as the bot sees a cloud (``Unseen``: its "running" says nothing of the
   runner), so nothing but the heartbeat keeps the job alive (the local provider's own view of its process is
   tested in test_liveness.py).
2. A job whose instance is reclaimed (the provider says "preempted" while the runner is still training, as a
   spot instance under notice) is stopped by the bot and relaunched: its runner saves a checkpoint on the way
   out and reports it, and the relaunch resumes from that checkpoint, not from step 0.

The timeouts are shrunk (a 1 s tick, a 3 s heartbeat timeout) rather than the job made long.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.planner.request import EstimateRequest
from bot.providers.base import Instance, InstanceStatus
from bot.providers.local import LocalProvider
from bot.settings import Settings
from store.models import Instance as InstanceRow
from store.models import RunnerEventRecord

from .conftest import Recorder
from .fakes import make_estimate

FAST = {"TUNEBOT_RECONCILE_EVERY": 1.0, "TUNEBOT_HEARTBEAT_TIMEOUT": 3.0, "TUNEBOT_REPORT_EVERY": 3600.0}


class Unseen(LocalProvider):
    """The local provider as the bot sees a cloud: "running" is its machine's state, not its runner's."""

    sees_runner_process = False


class Reclaiming(LocalProvider):
    """The local provider with a spot reclaim notice: once ``notice`` is given, its instance reads "preempted"
    while its runner is still mid-training (the provider, not the runner, says so first).

    The runner is held (SIGSTOP) from the notice until the bot ends the instance (its SIGTERM, then SIGCONT):
    the step it saves on its way out is the step it had at the notice, whatever the machine's speed (a tiny
    model trains hundreds of steps while a notice, a tick and a SIGTERM go by: the job could end first)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.noticed: set[str] = set()

    def notice(self, instance_id: str) -> None:
        self._signal(self._record(instance_id), signal.SIGSTOP)
        self.noticed.add(instance_id)

    def _signal(self, rec: dict[str, Any], sig: int) -> None:
        super()._signal(rec, sig)
        if sig == signal.SIGTERM:
            super()._signal(rec, signal.SIGCONT)  # the SIGTERM pending, the held runner goes on to handle it

    def _instance(self, rec: dict[str, Any]) -> Instance:
        inst = super()._instance(rec)
        if inst.instance_id in self.noticed and inst.status == InstanceStatus.running:
            inst.status, inst.raw_status = InstanceStatus.preempted, "preempted (reclaim notice)"
        return inst


def _job(eng: Any, local: LocalProvider, tiny: Path, steps: int, seq_len: int = 64) -> str:
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(tiny / "data.jsonl"),
        method="lora",
        lora_r=4,
        seq_len=seq_len,
        batch_size=1,
        grad_accum=1,
        gradient_checkpointing=False,
        eval_split=0.0,
        samples=0,
    )
    overrides = {
        "max_steps": steps,
        "learning_rate": 1e-3,
        "plateau": {"enabled": False},
        "checkpoint": {"every_minutes": 600.0},  # no checkpoint but the one saved on the way out
    }
    job = eng.create_job(
        req, user="alice", estimate=make_estimate([local.offer()], hours=0.05), spec_overrides=overrides
    )
    assert job.state == "running", job.message
    return job.job_id


def _wait(eng: Any, job_id: str, done: Any, seconds: float = 900.0) -> Any:
    """The job's view once ``done(view)`` holds (the scheduler moves it; this only looks), or the last one."""
    deadline = time.time() + seconds
    view = eng.get_job(job_id)
    while time.time() < deadline and not done(view):
        time.sleep(0.5)
        view = eng.get_job(job_id)
    return view


def _serve(eng: Any) -> Any:
    from bot.scheduler import start_scheduler

    return start_scheduler(
        eng
    )  # what `tunebot serve` runs: the tick every min(TUNEBOT_RECONCILE_EVERY, 10 s)


@pytest.mark.slow
def test_a_1200_step_job_reporting_hourly_ends_succeeded_with_no_preemption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.engine.service import Engine
    from runner.tiny import make_tiny

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a tiny model: one thread is fastest on a busy machine
    tiny = make_tiny(tmp_path / "tiny").parent
    local = Unseen(workdir=tmp_path / "local", price_per_hour=0.10)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), **FAST)
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e2e.db'}", providers={"local": local})
    rec = Recorder(eng.bus)
    job = _job(eng, local, tiny, 1200)
    sched = _serve(eng)
    try:
        view = _wait(eng, job, lambda v: v.state in ("succeeded", "stopped", "failed"))
        assert view.state == "succeeded", f"{view.state}: {view.message}"
        assert view.preemptions == 0 and view.step == 1200
        assert "preempted" not in rec.kinds()
        with eng.session() as s:
            reports = s.execute(
                select(RunnerEventRecord.kind, RunnerEventRecord.payload).where(
                    RunnerEventRecord.job_id == job
                )
            ).all()
            launched = s.execute(select(InstanceRow).where(InstanceRow.job_id == job)).scalars().all()
        assert len(launched) == 1
        # One report in all, at the last step (the progress events before it carry its chart points only).
        told = [p["step"] for kind, p in reports if kind == "progress" and p.get("tokens_per_second")]
        assert told == [1200], reports
    finally:
        sched.shutdown()
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()


@pytest.mark.slow
def test_a_runner_stopped_and_relaunched_resumes_from_the_checkpoint_it_saved_on_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.engine.service import Engine
    from bot.engine.watching import progress
    from runner.tiny import make_tiny

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    tiny = make_tiny(tmp_path / "tiny").parent
    local = Reclaiming(workdir=tmp_path / "local", price_per_hour=0.10)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), **FAST)
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e2e.db'}", providers={"local": local})
    rec = Recorder(eng.bus)
    steps = 400
    job = _job(eng, local, tiny, steps)
    sched = _serve(eng)
    try:
        # Training, between two hourly reports: its beats say how far (the reports would not).
        def trained(_view: Any) -> bool:
            beat = progress.heard(eng.ctx, job, _run_id(eng, job))
            return beat is not None and beat.step >= 20

        assert _wait(eng, job, trained).state == "running"
        (first,) = _instances(eng, job)
        local.notice(first.provider_instance_id)  # the provider says preempted; the runner trains on
        view = _wait(eng, job, lambda v: v.state in ("succeeded", "stopped", "failed"))
        assert view.state == "succeeded", f"{view.state}: {view.message}"
        assert view.preemptions == 1 and view.step == steps
        said = [e.message for e in rec.events if str(e.kind) == "preempted"]
        assert len(said) == 1 and "relaunching from its checkpoint at step" in said[0], said
        saved = int(said[0].split("checkpoint at step ")[1].split(":")[0].split(".")[0])
        assert 20 <= saved < steps  # the checkpoint saved on the way out (none was saved before), mid-run
        runs = _instances(eng, job)
        assert len(runs) == 2
        out = local.log_path(runs[0].provider_instance_id).read_text()
        assert "checkpoint saved: " in out and f"checkpoint-{saved}" in out, out[-2000:]
        resumed = local.log_path(runs[1].provider_instance_id).read_text()
        assert f"checkpoint-{saved} at step {saved}" in resumed, resumed[-3000:]
        recovered = [e.message for e in rec.events if str(e.kind) == "recovered"]
        assert recovered and f"resumed from its checkpoint at step {saved}" in recovered[0], recovered
    finally:
        sched.shutdown()
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()


def _instances(eng: Any, job_id: str) -> list[InstanceRow]:
    with eng.session() as s:
        return list(
            s.execute(
                select(InstanceRow).where(InstanceRow.job_id == job_id).order_by(InstanceRow.id)
            ).scalars()
        )


def _run_id(eng: Any, job_id: str) -> str | None:
    from store.models import Job

    with eng.session() as s:
        return s.get(Job, job_id).run_id
