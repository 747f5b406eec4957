"""No rented host can speak for another job, nor for its own once it is over (issue 19, item 2).

Attacks reported on a9605e4, each replayed here through the engine's real entry points (the tick's pull of
progress.json, ``record_runner_event`` behind /runner/events):

- job A's host, holding bucket-wide keys, wrote job B's progress.json with a "finished" event: B was marked
  succeeded, its instance torn down, its output pointed at the attacker's URL, a calibration row recorded;
- a job's token still worked after the job was final and overwrote its outcome;
- events had no size or count cap (one job's events grew the database to 200 MB).

Now an event counts only when the job's own key signed it (the key its instance got as TUNEBOT_JOB_KEY),
never once the job is final, within caps, and with links that point where this job's may.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from runner.contract.spec import JobSpec, progress_uri
from store.models import CalibrationRun, Job, RunnerEventRecord

from .conftest import Recorder, estimate_for, request


def env_of(fake: Any, n: int) -> dict[str, str]:
    return fake.launch_requests[n].env


def spec_of(fake: Any, n: int) -> JobSpec:
    return JobSpec.model_validate_json(env_of(fake, n)["TUNEBOT_JOB_SPEC"])


def as_host(item: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """An event signed the way a host with this environment can sign (with its own job's key). Every host
    gets a key: one without it fails here rather than sending the event unsigned."""
    from runner.contract.integrity import EVENT, sign

    assert env.get("TUNEBOT_JOB_KEY"), "the host got no job key: events would go unsigned"
    return sign(bytes.fromhex(env["TUNEBOT_JOB_KEY"]), EVENT, item)


def write_progress(path: str, events: list[dict[str, Any]]) -> None:
    target = Path(progress_uri(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"job_id": "x", "updated": time.time(), "events": events}))


def finished(job_id: str, seq: int, **kw: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "job_id": job_id,
        "seq": seq,
        "kind": "finished",
        "step": 100,
        "max_steps": 100,
        "loss": kw.pop("loss", 0.01),
        "timestamp": kw.pop("timestamp", time.time()),
        **kw,
    }


def two_jobs(engine: Any, fake: Any) -> tuple[str, str]:
    a = engine.create_job(request(), user="mallory", estimate=estimate_for(fake)).job_id
    b = engine.create_job(request(), user="bob", estimate=estimate_for(fake)).job_id
    assert engine.get_job(a).state == engine.get_job(b).state == "running"
    return a, b


def test_a_host_cannot_finish_another_job_through_its_progress_object(engine, fake) -> None:
    rec = Recorder(engine.bus)
    a, b = two_jobs(engine, fake)
    host_a = env_of(fake, 0)  # what A's host has: its own key, bucket-wide access to B's folder
    forged = finished(
        b,
        0,
        output_uri="https://evil.example/weights",
        message="all done",
        metrics={"max_memory_reserved_gb": 1.0, "tokens_per_second": 1e9},
    )
    # A huge seq and a future timestamp would also hide B's real events behind the "already read" window.
    hide = {**finished(b, 10**9, timestamp=time.time() + 10**7), "kind": "progress"}
    write_progress(spec_of(fake, 1).checkpoint.uri, [as_host(forged, host_a), as_host(hide, host_a)])
    engine.tick()
    engine.tick()
    view = engine.get_job(b)
    assert view.state == "running", (view.state, view.output_uri, view.message)
    assert view.output_uri is None and "evil" not in json.dumps(view.model_dump(mode="json"))
    assert len(fake.live()) == 2  # B's instance is not torn down
    with engine.session() as s:
        assert s.execute(select(func.count()).select_from(CalibrationRun)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(RunnerEventRecord)).scalar_one() == 0
    assert not [e for e in rec.events if e.job_id == b and e.kind in ("finished", "progress")]
    warnings = [e for e in rec.events if e.job_id == b and e.kind == "warning"]
    assert len(warnings) == 1 and "not signed with this job's key" in warnings[0].message
    write_progress(spec_of(fake, 1).checkpoint.uri, [as_host(forged, host_a)])  # again: told only once
    engine.tick()
    assert len([e for e in rec.events if e.job_id == b and e.kind == "warning"]) == 1

    # B's own runner, with B's key: its events count, its real end is recorded.
    from fakes.runner_events import signed

    mine = spec_of(fake, 1)
    done = finished(b, 3, output_uri=mine.output_uri, loss=0.4321)
    write_progress(mine.checkpoint.uri, [as_host(forged, host_a), signed(engine, done)])
    engine.tick()
    view = engine.get_job(b)
    assert view.state == "succeeded" and view.loss == 0.4321 and view.output_uri == mine.output_uri
    assert engine.get_job(a).state == "running"


def test_an_unsigned_event_is_refused_even_with_the_jobs_own_token(engine, fake) -> None:
    """Signing is on: the job's own token and its own progress object carry no unsigned event; the same
    event signed with the job's key counts."""
    a, _ = two_jobs(engine, fake)
    env, spec = env_of(fake, 0), spec_of(fake, 0)
    event = finished(a, 0, output_uri=spec.output_uri)
    assert not engine.record_runner_event(a, spec.report.token, event)
    write_progress(spec.checkpoint.uri, [event])
    engine.tick()
    assert engine.get_job(a).state == "running" and engine.get_job(a).output_uri is None
    with engine.session() as s:
        assert s.execute(select(RunnerEventRecord.seq).where(RunnerEventRecord.job_id == a)).all() == []
    assert engine.record_runner_event(a, spec.report.token, as_host(event, env))
    engine.tick()
    assert engine.get_job(a).state == "succeeded"


def test_a_final_jobs_token_changes_nothing(engine, fake) -> None:
    a, _ = two_jobs(engine, fake)
    env, spec = env_of(fake, 0), spec_of(fake, 0)
    token = spec.report.token
    assert engine.record_runner_event(a, token, as_host(finished(a, 0, output_uri=spec.output_uri), env))
    engine.tick()
    before = engine.get_job(a)
    assert before.state == "succeeded"
    late = {**finished(a, 1, output_uri="https://evil.example/x"), "kind": "failed", "message": "pwned"}
    assert not engine.record_runner_event(a, token, as_host(late, env))
    # ... nor through the progress object.
    write_progress(spec.checkpoint.uri, [as_host(late, env)])
    engine.tick()
    after = engine.get_job(a)
    assert (after.state, after.output_uri, after.message) == (before.state, before.output_uri, before.message)
    with engine.session() as s:
        job = s.get(Job, a)
        assert job.outcome == "finished"
        seqs = s.execute(select(RunnerEventRecord.seq).where(RunnerEventRecord.job_id == a)).scalars().all()
        assert seqs == [0]


def test_a_run_that_ended_speaks_for_nothing_even_before_the_next_one_starts(engine, fake) -> None:
    """Issue 28: a run's key and token end with the run, not with the job. Run 1 is preempted and no host has
    capacity: the job waits (recovering) with no current run. Run 1's host, with its old environment, says
    the job finished: nothing counts. Once a new run starts, run 1's key still counts for nothing."""
    from bot.providers.base import InstanceStatus

    job = engine.create_job(request(), user="mallory", estimate=estimate_for(fake)).job_id
    env, spec = env_of(fake, 0), spec_of(fake, 0)
    fake.capacity = False
    fake.set_status(next(iter(fake.instances)), InstanceStatus.preempted)
    engine.tick()
    assert engine.get_job(job).state == "recovering"
    forged = as_host(finished(job, 50, output_uri=spec.output_uri), env)
    assert not engine.record_runner_event(job, spec.report.token, forged)
    fake.capacity = True
    engine.tick()
    assert engine.get_job(job).state == "running" and fake.creates == 2
    assert env_of(fake, 1)["TUNEBOT_JOB_KEY"] != env["TUNEBOT_JOB_KEY"]  # each run its own key
    write_progress(spec_of(fake, 1).checkpoint.uri, [forged])  # even where the current run reports
    assert not engine.record_runner_event(job, spec_of(fake, 1).report.token, forged)
    engine.tick()
    view = engine.get_job(job)
    assert view.state == "running" and view.output_uri is None, (view.state, view.message)
    with engine.session() as s:
        assert s.execute(select(RunnerEventRecord.seq).where(RunnerEventRecord.job_id == job)).all() == []


def test_events_are_bounded_in_size_and_count(engine, fake) -> None:
    a, b = two_jobs(engine, fake)
    env, spec = env_of(fake, 0), spec_of(fake, 0)
    token = spec.report.token
    huge = {**finished(a, 0), "kind": "progress", "message": "x" * 1_000_000}
    assert not engine.record_runner_event(a, token, as_host(huge, env))
    # A host numbering its events past the stored-events cap moves the job's progress, without a row each.
    far = 10**6
    for seq in (far, far + 1):
        event = {**finished(a, seq, step=seq), "kind": "progress", "step": seq}
        assert engine.record_runner_event(a, token, as_host(event, env))
    with engine.session() as s:
        rows = s.execute(select(func.count()).select_from(RunnerEventRecord)).scalar_one()
    assert rows == 0
    assert engine.get_job(a).step == far + 1
    # A progress object far larger than a runner writes (5 MB) is not read at all.
    spec_b = spec_of(fake, 1)
    host_b = env_of(fake, 1)
    padded = [
        as_host({**finished(b, q), "kind": "progress", "step": q, "message": "y" * 1500}, host_b)
        for q in range(3500)
    ]
    write_progress(spec_b.checkpoint.uri, padded)
    assert Path(progress_uri(spec_b.checkpoint.uri)).stat().st_size > 5_000_000
    engine.tick()
    assert engine.get_job(b).step == 0


def test_links_must_point_where_the_job_may() -> None:
    from bot.engine.launching.integrity import Expected, cap_event, check_links
    from runner.contract.spec import RunnerEvent

    ok = Expected(
        output_prefix="s3://b/tunebot/j1/output",
        checkpoint_prefix="s3://b/tunebot/j1/checkpoints",
        hub_repo="acme/lora",
    )

    def kept(**fields: Any) -> dict[str, Any]:
        event, _ = check_links(RunnerEvent(job_id="j1", seq=0, kind="finished", **fields), ok)
        return {k: getattr(event, k) for k in fields}

    assert kept(output_uri="s3://b/tunebot/j1/output") == {"output_uri": "s3://b/tunebot/j1/output"}
    assert kept(output_uri="s3://b/tunebot/j1/output/merged")["output_uri"]
    for bad in (
        "s3://b/tunebot/j2/output",
        "s3://b/tunebot/j1/output-evil",
        "https://evil.example/x",
        "s3://b/tunebot/j1/output/../../j2/output",
        "s3://b/tunebot/j1/output/%2e%2e/j2",
    ):
        assert kept(output_uri=bad) == {"output_uri": None}, bad
    assert kept(checkpoint_uri="s3://b/tunebot/j1/checkpoints/checkpoint-4")["checkpoint_uri"]
    assert kept(checkpoint_uri="s3://b/tunebot/j2/checkpoints/checkpoint-4") == {"checkpoint_uri": None}
    assert kept(wandb_url="https://wandb.ai/acme/tunebot/runs/j1")["wandb_url"]
    for bad in (
        "http://wandb.ai/x",
        "https://wandb.ai.evil.example/x",
        "https://evil.example/wandb.ai",
        "https://user@wandb.ai/x",
    ):
        assert kept(wandb_url=bad) == {"wandb_url": None}, bad
    assert kept(hub_url="https://huggingface.co/acme/lora")["hub_url"]
    for bad in ("https://huggingface.co/acme/other", "https://huggingface.co/acme/lora-evil"):
        assert kept(hub_url=bad) == {"hub_url": None}, bad
    long = cap_event(
        RunnerEvent(
            job_id="j1",
            seq=0,
            kind="failed",
            message="m" * 10_000,
            metrics={f"k{i}": 1.0 for i in range(100)},
        )
    )
    assert len(long.message or "") == 2000 and len(long.metrics or {}) == 32
