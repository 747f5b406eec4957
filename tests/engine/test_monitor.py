"""Following a job: runner events by push (token, dedupe) and pull (progress.json), preemption, heartbeats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.runner_events import checkpoint_event, signed
from fakes.worlds import join_finisher
from sqlalchemy import func, select

from bot.providers.base import InstanceStatus
from runner.contract.spec import JobSpec
from store.models import Instance, RunnerEventRecord

from .conftest import Recorder, estimate_for, request


def _token(fake) -> str:  # noqa: ANN001
    return JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token


def _ev(job_id: str, seq: int, kind: str = "progress", **kw) -> dict:  # noqa: ANN003
    kw.setdefault("timestamp", 1000.0 + seq)  # a retried event carries its original timestamp
    return {"job_id": job_id, "seq": seq, "kind": kind, "step": kw.pop("step", seq), **kw}


def _sev(engine, job_id: str, seq: int, kind: str = "progress", **kw) -> dict:  # noqa: ANN001, ANN003
    """An event as the job's runner sends it: signed with the job's key."""
    return signed(engine, _ev(job_id, seq, kind, **kw))


def test_push_needs_the_job_token_and_dedupes_by_seq(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = _token(fake)
    assert not engine.record_runner_event(job.job_id, "wrong", _sev(engine, job.job_id, 1, loss=2.0))
    assert not engine.record_runner_event(job.job_id, None, _sev(engine, job.job_id, 1, loss=2.0))
    assert engine.record_runner_event(job.job_id, token, _sev(engine, job.job_id, 1, loss=2.0, max_steps=10))
    again = json.dumps(_sev(engine, job.job_id, 1, loss=2.0))
    assert engine.record_runner_event(job.job_id, token, again)  # repeat
    assert engine.record_runner_event(job.job_id, token, _sev(engine, job.job_id, 2, loss=1.5))
    assert not engine.record_runner_event(job.job_id, token, _sev(engine, "other-job", 3))
    with engine.session() as s:
        n = s.execute(select(func.count()).select_from(RunnerEventRecord)).scalar_one()
    assert n == 2
    view = engine.get_job(job.job_id)
    assert view.step == 2 and view.loss == 1.5 and view.max_steps == 10
    assert view.losses == [(1, 2.0), (2, 1.5)]
    assert rec.kinds().count("progress") == 2


def test_pull_reads_progress_json(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    ckpt = Path(JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).checkpoint.uri)
    ckpt.mkdir(parents=True, exist_ok=True)
    from runner.contract.spec import progress_uri

    events = [_sev(engine, job.job_id, i, loss=3.0 - i / 10) for i in range(5)]
    Path(progress_uri(str(ckpt))).write_text(json.dumps({"events": events}))
    engine.tick()
    assert engine.get_job(job.job_id).step == 4


def test_finished_event_finishes_the_job_and_terminates(engine, fake, clock):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = _token(fake)
    spec = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    out = spec.output_uri + "/adapter"  # under the job's own output prefix
    clock.advance(1800)
    engine.record_runner_event(job.job_id, token, _sev(engine, job.job_id, 1, "finished", output_uri=out))
    engine.tick()
    join_finisher(job.job_id)  # the pushed event may be finishing it in a thread meanwhile
    view = engine.get_job(job.job_id)
    assert view.state == "succeeded" and view.output_uri == out
    assert fake.live() == []
    assert view.spend == pytest.approx(0.5, abs=1e-6)
    assert "finished" in rec.kinds()


def test_plateau_stops_with_output(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    out = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).output_uri
    plateau = _sev(engine, job.job_id, 1, "plateau", output_uri=out)
    engine.record_runner_event(job.job_id, _token(fake), plateau)
    engine.tick()
    join_finisher(job.job_id)
    view = engine.get_job(job.job_id)
    assert view.state == "stopped" and view.stop_reason == "plateau" and view.output_uri == out
    assert "plateau" in rec.kinds()


def test_a_plateau_stop_is_announced_once(engine, fake):
    """The runner's plateau event and the finish both announced it: the thread and the console said "Loss
    plateaued" twice. The finish says it (with the spend and what the run bought), the runner's event moves
    the progress."""
    import io

    from bot.chat.console import ConsoleNotifier
    from bot.chat.terminal import cli_console

    rec = Recorder(engine.bus)
    out = io.StringIO()
    ConsoleNotifier(engine, cli_console(out), progress_every_s=0.0).attach(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    spec = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    plateau = _sev(
        engine, job.job_id, 1, "plateau", step=5, max_steps=10, loss=1.2345, output_uri=spec.output_uri
    )
    assert engine.record_runner_event(job.job_id, _token(fake), plateau)
    engine.tick()
    engine.tick()
    join_finisher(job.job_id)
    assert engine.get_job(job.job_id).state == "stopped"
    assert rec.kinds().count("plateau") == 1, rec.kinds()
    printed = out.getvalue()
    assert printed.count("Loss plateaued") == 1, printed
    assert "Loss plateaued at 1.2345 (step 5)" in " ".join(printed.split()), printed


@pytest.mark.parametrize(
    "status,code",
    [
        (InstanceStatus.preempted, None),
        (InstanceStatus.exited, 75),
        (InstanceStatus.exited, 77),  # storage credentials expiring, not renewed: relaunched with fresh ones
        (InstanceStatus.stopped, None),
        (InstanceStatus.terminated, None),
    ],
)
def test_preemption_from_provider_status_relaunches(engine, fake, status, code):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    first = fake.launch_requests[-1]
    s1 = JobSpec.model_validate_json(first.env["TUNEBOT_JOB_SPEC"])
    saved = checkpoint_event(engine, job.job_id, 1, 7, s1.checkpoint.uri)
    assert engine.record_runner_event(job.job_id, s1.report.token, saved)
    iid = next(iter(fake.instances))
    fake.set_status(iid, status, code)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "running" and view.preemptions == 1
    assert fake.creates == 2 and len(fake.live()) == 1
    second = fake.launch_requests[-1]
    s2 = JobSpec.model_validate_json(second.env["TUNEBOT_JOB_SPEC"])
    # resumes from the same checkpoints: those its first run saved (each run writes its own folder)
    assert [(p.uri, p.step) for p in s2.resume] == [(saved["checkpoint_uri"], 7)]
    assert s1.report.token != s2.report.token
    assert "preempted" in rec.kinds() and "recovered" in rec.kinds()


def test_missing_heartbeat_counts_as_preemption(engine, fake, clock):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    engine.record_runner_event(job.job_id, _token(fake), _sev(engine, job.job_id, 1))
    clock.advance(599)
    engine.tick()
    assert engine.get_job(job.job_id).preemptions == 0
    clock.advance(2)
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.preemptions == 1 and view.state == "running" and fake.creates == 2
    assert len(fake.live()) == 1


def test_runner_crash_fails_the_job(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    fake.set_status(next(iter(fake.instances)), InstanceStatus.exited, 1)
    engine.tick()
    assert engine.get_job(job.job_id).state == "failed"
    assert fake.live() == [] and "failed" in rec.kinds()


def test_retry_budget_exhausted_fails(engine, fake, settings):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    for _ in range(settings.retry_budget + 1):
        for iid in list(fake.instances):
            fake.set_status(iid, InstanceStatus.preempted)
        engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "failed" and "retry budget" in (view.message or "")
    assert fake.creates == settings.retry_budget + 1
    assert fake.live() == []


def test_idle_instance_is_stopped(make_engine, fake, clock, settings):
    settings.heartbeat_timeout_s = 10_000  # make idleness, not the heartbeat, the trigger
    eng = make_engine()
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake))
    # The runner started (before its first event the start deadline applies, not idleness), then went quiet.
    started = _sev(eng, job.job_id, 1, "started", timestamp=clock.t)
    assert eng.record_runner_event(job.job_id, _token(fake), started)
    clock.advance(settings.idle_stop_minutes * 60 + 1)
    eng.tick()
    view = eng.get_job(job.job_id)
    assert view.state == "stopped" and view.stop_reason == "idle"
    assert fake.live() == []
    with eng.session() as s:
        assert s.execute(select(Instance.ended_at)).scalar_one() is not None


def test_resumed_run_renumbering_from_its_checkpoint_is_not_lost(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = _token(fake)
    for seq in range(1, 6):
        pushed = _sev(engine, job.job_id, seq, timestamp=100.0 + seq)
        assert engine.record_runner_event(job.job_id, token, pushed)
    # After a resume the runner numbers again from its checkpoint's seq (3), with newer timestamps.
    for seq, kind, ts in ((3, "started", 200.0), (4, "finished", 201.0)):
        event = _sev(engine, job.job_id, seq, kind, step=seq, timestamp=ts)
        engine.record_runner_event(job.job_id, token, event)
    # A retried push of an old event changes nothing.
    engine.record_runner_event(job.job_id, token, _sev(engine, job.job_id, 4, step=4, timestamp=104.0))
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "succeeded"
    with engine.session() as s:
        kinds = s.execute(select(RunnerEventRecord.kind).order_by(RunnerEventRecord.seq)).scalars().all()
    assert kinds == ["progress", "progress", "started", "finished", "progress"]


def test_instance_stuck_provisioning_is_replaced(engine, fake, clock, settings):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    fake.set_status(next(iter(fake.instances)), InstanceStatus.provisioning)
    clock.advance(settings.heartbeat_timeout_s + 1)
    engine.tick()
    assert engine.get_job(job.job_id).preemptions == 0  # image pulls take a while: patience first
    clock.advance(settings.heartbeat_timeout_s)
    engine.tick()
    view = engine.get_job(job.job_id)
    # Past its start deadline (here the 20 min floor): a failed start, replaced once, not a preemption.
    assert view.preemptions == 0 and view.state == "running" and fake.creates == 2 and len(fake.live()) == 1


def test_provider_outage_decides_nothing(engine, fake, clock):
    from bot.providers.base import ProviderDownError

    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))

    def down(_iid):  # type: ignore[no-untyped-def]
        raise ProviderDownError("502", provider="fake")

    fake.status = down  # type: ignore[method-assign]
    clock.advance(60)
    engine.tick()
    assert engine.get_job(job.job_id).state == "running" and fake.creates == 1


def test_invalid_spec_fails_with_reason(engine, fake):
    job = engine.create_job(
        request(), user="alice", estimate=estimate_for(fake), spec_overrides={"seq_len": 1}
    )
    assert job.state == "failed" and "invalid job spec" in (job.message or "")
    assert fake.creates == 0
