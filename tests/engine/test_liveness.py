"""Liveness apart from the report cadence (issue 38): a runner that reports once an hour but beats is alive;
a silent one is dead; a beat the run did not sign, or one written again, proves nothing; idleness is no
progress.

The engine is real (SQLite and PostgreSQL), the provider the in-memory fake, and the runner is played by the
test: it writes its progress object as runner/report.py does, with its signed beat at the head.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes.runner_events import job_key, signed
from sqlalchemy import select

from bot.engine.watching import progress
from runner.contract import heartbeat
from runner.contract.spec import progress_uri
from store.models import Job

from .conftest import estimate_for, request


def write_beat(engine, job_id: str, beat: heartbeat.Beat, *, key: bytes | None = None) -> None:  # type: ignore[no-untyped-def]
    """The progress object as runner/report.py writes it between reports: its beat first, no new events."""
    with engine.session() as s:
        uri = s.get(Job, job_id).checkpoint_uri
    path = Path(progress_uri(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        heartbeat.FIELD: beat.signed(key or job_key(engine, job_id)),
        "updated": time.time(),
        "job_id": job_id,
        "last_seq": -1,
        "events": [],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def started(engine, fake, job_id: str, clock, max_steps: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """The runner's first event (before it, the start deadline applies, not the heartbeat)."""
    item = {"version": 1, "job_id": job_id, "seq": 0, "kind": "started", "step": 0, "timestamp": clock.t}
    if max_steps is not None:
        item["max_steps"] = max_steps
    token = fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]
    assert engine.record_runner_event(job_id, json.loads(token)["report"]["token"], signed(engine, item))


def beat(job_id: str, n: int, step: int, stalled: float = 0.0, born: float = 1000.0) -> heartbeat.Beat:
    return heartbeat.Beat(job_id, born, n, step, stalled)


def test_a_runner_that_reports_hourly_but_beats_is_never_declared_dead(engine, fake, clock, settings):
    """Item 1: reports every hour, heartbeat timeout 600 s. Three timeouts pass without an event while the
    runner beats and steps: no preemption. Then the beats stop: one timeout later it is preempted."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    timeout = settings.heartbeat_timeout_s
    every = heartbeat.every(timeout)
    for n in range(int(3 * timeout / every)):
        clock.advance(every)
        write_beat(engine, job, beat(job, n, step=10 * n))
        engine.tick()
        view = engine.get_job(job)
        assert view.state == "running" and view.preemptions == 0, (n, view.message)
    clock.advance(timeout + 1)  # the runner died: no more beats
    engine.tick()
    view = engine.get_job(job)
    assert view.preemptions == 1, view.state
    assert fake.creates == 2  # relaunched


def test_beats_the_run_did_not_sign_or_wrote_before_prove_nothing(engine, fake, clock, settings):
    """A beat signed with another key, the same beat written again, and an older beat put back over a newer
    one are not news: the runner counts as silent and is relaunched one timeout after its last real beat."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    timeout = settings.heartbeat_timeout_s
    clock.advance(timeout / 2)
    write_beat(engine, job, beat(job, 5, step=50))  # the last real beat
    engine.tick()
    clock.advance(timeout / 2)
    write_beat(engine, job, beat(job, 6, step=60), key=b"another job's key" * 2)  # not this run's
    engine.tick()
    clock.advance(timeout / 4)
    write_beat(engine, job, beat(job, 5, step=50))  # the same beat again (a replay)
    engine.tick()
    clock.advance(timeout / 4)
    write_beat(engine, job, beat(job, 2, step=20))  # an older beat put back
    engine.tick()
    assert engine.get_job(job).state == "running"  # within one timeout of the last real beat: alive
    clock.advance(1)
    engine.tick()
    view = engine.get_job(job)
    assert view.preemptions == 1 and fake.creates == 2, view.state


def test_idleness_is_no_progress_not_no_report(engine, fake, clock, settings):
    """A runner that steps between hourly reports is not idle past the idle limit; one whose beats say it has
    made no progress for the idle limit is stopped (idle), not relaunched."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    idle = settings.idle_stop_minutes * 60
    every = heartbeat.every(settings.heartbeat_timeout_s)
    n = 0
    while n * every < 2 * idle:  # twice the idle limit without an event, stepping all along
        clock.advance(every)
        write_beat(engine, job, beat(job, n, step=n, stalled=1.0))
        engine.tick()
        n += 1
    assert engine.get_job(job).state == "running"
    for k in range(int(idle / every) + 2):  # beating, but stuck at one step
        clock.advance(every)
        write_beat(engine, job, beat(job, n + k, step=n, stalled=(k + 1) * every))
        engine.tick()
    view = engine.get_job(job)
    assert view.state == "stopped" and view.stop_reason == "idle" and view.preemptions == 0
    assert fake.creates == 1


def test_a_runner_its_provider_sees_alive_is_not_dead_for_silence(engine, fake, clock, settings):
    """The local provider sees the runner's own process: silent past the heartbeat timeout (no beat: a runner
    from before heartbeats, or one whose storage is unwritable) it is not relaunched; idle, it is stopped."""
    fake.sees_runner_process = True  # as bot/providers/local.py says of its instances
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    clock.advance(settings.heartbeat_timeout_s * 2)
    engine.tick()
    view = engine.get_job(job)
    assert view.state == "running" and view.preemptions == 0
    clock.advance(settings.idle_stop_minutes * 60)
    engine.tick()
    view = engine.get_job(job)
    assert view.state == "stopped" and view.stop_reason == "idle" and view.preemptions == 0
    with engine.session() as s:
        assert s.execute(select(Job.preemptions)).scalar_one() == 0


def test_settings_that_would_count_a_live_runner_dead_are_refused_at_start(tmp_path, monkeypatch):
    """A heartbeat timeout the supervisor's reads cannot serve, or an idle limit shorter than the beats that
    carry progress, is refused by every command at start: exit code 2, what to set instead, no traceback. The
    issue's own settings (reports hourly, timeout 60 s) are fine: the beat does not follow the reports."""
    from typer.testing import CliRunner

    from bot.cli import app
    from bot.settings import get_settings

    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "cli"))
    runner = CliRunner()
    refused = {
        ("TUNEBOT_HEARTBEAT_TIMEOUT", "20"): "Set TUNEBOT_HEARTBEAT_TIMEOUT to 30 or more",
        ("TUNEBOT_IDLE_STOP_MINUTES", "0.5"): "Set TUNEBOT_IDLE_STOP_MINUTES to 1.5 or more",
    }
    for (name, value), advice in refused.items():
        monkeypatch.setenv(name, value)
        for args in (["jobs"], ["serve"]):
            get_settings.cache_clear()
            result = runner.invoke(app, args)
            assert result.exit_code == 2, (name, args, result.output)
            assert advice in result.output and "Traceback" not in result.output, result.output
        monkeypatch.delenv(name)
    monkeypatch.setenv("TUNEBOT_REPORT_EVERY", "3600")
    monkeypatch.setenv("TUNEBOT_HEARTBEAT_TIMEOUT", "60")
    get_settings.cache_clear()
    result = runner.invoke(app, ["jobs"])
    assert result.exit_code == 0, result.output
    get_settings.cache_clear()


def _push(engine, fake, item: dict) -> None:  # type: ignore[no-untyped-def]
    token = json.loads(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])["report"]["token"]
    assert engine.record_runner_event(item["job_id"], token, signed(engine, item))


def _trained_22_steps_in_half_an_hour(engine, fake, clock) -> str:  # type: ignore[no-untyped-def]
    """A job whose runner started and reported step 22 half an hour later, at $1/h: $0.50 for 22 steps."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    _push(
        engine, fake, {"version": 1, "job_id": job, "seq": 0, "kind": "started", "step": 0, "timestamp": 1.0}
    )
    clock.advance(1800)
    _push(
        engine,
        fake,
        {"version": 1, "job_id": job, "seq": 1, "kind": "progress", "step": 22, "timestamp": 2.0},
    )
    return job


def test_a_relaunch_says_what_it_resumes_from_or_that_it_restarts_and_what_that_costs(engine, fake, clock):
    """Item 1: with no checkpoint yet, the thread said "relaunching from its last checkpoint" while 22 steps
    were trained and billed again. Now it says the job restarts from the beginning and about what the lost
    steps cost; with a checkpoint, which step it resumes from and the steps trained again."""
    from bot.providers.base import InstanceStatus

    from .conftest import Recorder

    rec = Recorder(engine.bus)
    job = _trained_22_steps_in_half_an_hour(engine, fake, clock)
    fake.set_status(next(iter(fake.instances)), InstanceStatus.preempted)
    engine.tick()
    said = [e.message for e in rec.events if str(e.kind) == "preempted"]
    assert said == [
        f"Job {job} was preempted (instance preempted); it has no checkpoint yet, so it restarts from the "
        "beginning: the 22 step(s) since are trained and billed again, about $0.50."
    ], said
    back = [e.message for e in rec.events if str(e.kind) == "recovered"]
    assert back and "restarted from the beginning (no checkpoint to resume from)" in back[0], back
    # The second run saves checkpoint-30, then trains to step 40 and is preempted: it resumes from step 30.
    with engine.session() as s:
        folder = s.get(Job, job).checkpoint_uri
    Path(folder, "checkpoint-30").mkdir(parents=True)
    Path(folder, "checkpoint-30", "COMPLETE").write_text("step 30\n")
    seq = {"version": 1, "job_id": job, "timestamp": 10.0}
    _push(engine, fake, {**seq, "seq": 2, "kind": "started", "step": 0})
    _push(
        engine,
        fake,
        {
            **seq,
            "seq": 3,
            "kind": "checkpoint",
            "step": 30,
            "checkpoint_uri": f"{folder}/checkpoint-30",
            "manifest_sha256": "ab" * 32,
        },
    )
    _push(engine, fake, {**seq, "seq": 4, "kind": "progress", "step": 40})
    clock.advance(1800)
    fake.set_status(next(iter(fake.instances)), InstanceStatus.preempted)
    engine.tick()
    said = [e.message for e in rec.events if str(e.kind) == "preempted"]
    assert said[-1].startswith(
        f"Job {job} was preempted (instance preempted); relaunching from its checkpoint at step 30: the 10 "
        "step(s) since are trained and billed again, about $"
    ), said[-1]
    back = [e.message for e in rec.events if str(e.kind) == "recovered"]
    assert "resumed from its checkpoint at step 30 on" in back[-1], back


def test_a_restart_says_what_it_costs_when_a_reconcile_closed_the_lost_instance_first(engine, fake, clock):
    """The instance's row may be closed before the preemption is marked (a reconcile saw it gone first): the
    lost steps' cost is then read from the job's newest row, not dropped from the sentence."""
    from bot.engine.outcome.finish import close_instance
    from bot.engine.watching.recovery import mark_preempted
    from store.models import Instance as InstanceRow

    from .conftest import Recorder

    rec = Recorder(engine.bus)
    job = _trained_22_steps_in_half_an_hour(engine, fake, clock)
    with engine.session() as s:
        (row,) = s.execute(select(InstanceRow).where(InstanceRow.job_id == job)).scalars()
    close_instance(engine.ctx, row, reason="gone", actor="reconcile")
    assert mark_preempted(engine.ctx, job, None, why="instance gone", gone=True)
    said = [e.message for e in rec.events if str(e.kind) == "preempted"]
    assert said == [
        f"Job {job} was preempted (instance gone); it has no checkpoint yet, so it restarts from the "
        "beginning: the 22 step(s) since are trained and billed again, about $0.50."
    ], said


def test_a_beat_alone_rewrites_no_progress_window(engine, fake, clock):
    """The beat rides at the head of the progress object: rewriting it every few seconds changes no recorded
    read of the events (no database write per beat), and is still heard."""
    from bot.engine.watching import progress

    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock)
    write_beat(engine, job, beat(job, 0, step=1))
    engine.tick()
    with engine.session() as s:
        window = s.get(Job, job).progress_window
    for n in range(1, 4):
        clock.advance(10)
        write_beat(engine, job, beat(job, n, step=1 + n))
        engine.tick()
        heard = progress.heard(engine.ctx, job, _run(engine, job))
        assert heard is not None and heard.step == 1 + n and heard.heard_at == clock.t
    with engine.session() as s:
        assert s.get(Job, job).progress_window == window


def _run(engine, job_id: str) -> str | None:  # type: ignore[no-untyped-def]
    with engine.session() as s:
        return s.get(Job, job_id).run_id


def test_a_rare_reporter_shows_the_step_its_heartbeat_claims_in_every_process(
    engine, make_engine, fake, clock, monkeypatch
):
    """Between hourly reports a job is shown at the step its current run's newest signed beat claims, not at
    the last report's: in the supervising process (what it heard) and in another one on the same database
    (`tunebot jobs` beside `tunebot serve`: it reads the beat). A beat its run did not sign is not shown; a
    claim past the job's last step is held to it; a member who may not see the job reads nothing of it."""
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id
    started(engine, fake, job, clock, max_steps=1200)
    other = make_engine()  # another process: nothing heard in its memory
    assert engine.get_job(job).step == 0 and other.get_job(job).step == 0

    clock.advance(30)
    write_beat(engine, job, beat(job, 0, step=647))
    engine.tick()
    assert engine.get_job(job).step == 647
    assert other.get_job(job).step == 647  # read from the object's head
    assert [v.step for v in other.list_jobs() if v.job_id == job] == [647]

    write_beat(engine, job, beat(job, 1, step=700), key=b"k" * 32)  # not this run's key
    fresh = make_engine()
    assert fresh.get_job(job).step == 0 and engine.get_job(job).step == 647

    last = 1200
    write_beat(engine, job, beat(job, 2, step=10**9))
    assert make_engine().get_job(job).step == last

    from bot.engine.api import PermissionDenied

    reads: list[str] = []
    real = progress.read_raw
    monkeypatch.setattr(progress, "read_raw", lambda uri: reads.append(uri) or real(uri))
    with pytest.raises(PermissionDenied):
        make_engine().get_job(job, viewer="mallory")
    assert reads == []
    assert make_engine().get_job(job, viewer="alice").step == last and len(reads) == 1
