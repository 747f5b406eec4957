"""Nobody pays for an unwatched job.

- The scheduler's leader renews a lease row (SQLite and PostgreSQL alike) that any process reads: is a
  supervisor alive?
- `tunebot launch` with no live supervisor says so and how to start one (`tunebot serve`); with one, it does
  not.
- A runner's last event ends its job in whichever process sees it first: `tunebot jobs JOB` (not `serve`)
  reads the progress object, finishes the job and terminates its instance on the (fake) cloud; a push of the
  last event ends it without waiting for a tick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.runner_events import signed, signed_all
from fakes.worlds import join_finisher

from bot.providers.base import OfferQuery, job_label
from bot.settings import Settings

from .conftest import Recorder, estimate_for, request
from .fakes import make_estimate


def _wait(cond, timeout: float = 20.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_scheduler_leader_keeps_a_lease_every_process_can_read(make_engine):
    from bot.engine.watching.watch import supervisor
    from bot.scheduler import Scheduler

    engine = make_engine(clock=time.time)
    other = make_engine(clock=time.time)  # another process on the same database (`tunebot launch`)
    assert not other.supervised()
    sched = Scheduler(engine, tasks={}, lease_s=3.0)
    sched.start()
    try:
        assert _wait(lambda: sched.is_leader), "no leader"
        assert _wait(other.supervised)  # on PostgreSQL too, where the advisory lock decides who leads
        seen = [supervisor(other.ctx)]  # the lease the others read, as it is renewed

        def past_the_first_expiry() -> bool:
            lease = supervisor(other.ctx)
            assert lease is not None, f"the lease lapsed: {seen[-1]}"
            assert lease.renewed_at <= seen[-1].expires_at, f"renewed after it expired: {seen[-1]}, {lease}"
            seen.append(lease)
            return lease.renewed_at > seen[0].expires_at

        assert _wait(past_the_first_expiry), seen[-1]  # each renewal made before the lease before it expired
        assert other.supervised()  # still alive past one lease period
    finally:
        sched.stop()
    assert not other.supervised()  # a stopped supervisor says so at once


def test_a_pushed_last_event_ends_the_job_without_a_tick(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    from runner.contract.spec import JobSpec

    spec = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    done = {
        "job_id": job.job_id,
        "seq": 3,
        "kind": "finished",
        "step": 10,
        "timestamp": 5.0,
        "output_uri": spec.output_uri,
    }
    assert engine.record_runner_event(job.job_id, spec.report.token, signed(engine, done))
    assert _wait(lambda: engine.get_job(job.job_id).state == "succeeded")  # no tick ran
    join_finisher(job.job_id)  # it announces after the final state commits
    assert fake.live() == [] and "finished" in rec.kinds()


# ---- across processes, on the fake Vast API and moto S3 ------------------------------------------------


@pytest.fixture
def vast() -> Iterator[Any]:
    from fakes.clouds import FakeVast

    fake = FakeVast().start()
    try:
        yield fake
    finally:
        fake.stop()


def _cli(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from bot.cli import main; main()", *args],
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _cli_env(tmp_path: Path, vast: Any, bucket: str) -> dict[str, str]:
    return {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
        "TUNEBOT_DATA_DIR": str(tmp_path / "data"),
        "TUNEBOT_CHECKPOINT_URI": f"{bucket}/tb",
        "VAST_API_KEY": vast.api_key,
        "VAST_API_URL": vast.url,
        "TUNEBOT_LOCAL_PROVIDER": "0",
    }


@pytest.mark.slow
def test_launch_without_a_supervisor_says_so(tmp_path: Path, vast: Any, s3_bucket: str) -> None:
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    env = _cli_env(tmp_path, vast, s3_bucket)
    args = ["launch", str(tiny / "model"), f"dataset={tiny / 'data.jsonl'}", "steps=5", "max_cost=$5"]
    first = _cli(args, env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = " ".join(first.stdout.split())
    assert "No tunebot supervisor is running" in out and "Run tunebot serve" in out, out[-3000:]
    assert "docs/deploy.md" in out and "--wait" in out
    assert len(vast.live_instances()) == 1  # the job runs, and the person knows nothing watches it

    # With a live supervisor (a fresh lease, as `tunebot serve`'s scheduler keeps it), no warning.
    from sqlmodel import Session

    from store.db import make_engine
    from store.models import SchedulerLease

    db = make_engine(env["DATABASE_URL"])
    with Session(db) as s:
        s.add(
            SchedulerLease(
                name="scheduler", holder="serve-1", expires_at=time.time() + 600, renewed_at=time.time()
            )
        )
        s.commit()
    db.dispose()
    second = _cli(args, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "No tunebot supervisor" not in second.stdout


@pytest.mark.slow
def test_a_finish_seen_by_the_cli_tears_the_instance_down(tmp_path: Path, vast: Any, s3_bucket: str) -> None:
    """No `tunebot serve` runs. The runner finishes (its progress object says so); a person runs
    `tunebot jobs JOB`: that process ends the job and terminates the instance, which would have billed
    until someone ran `tunebot reconcile`."""
    import fsspec
    from fakes.clouds.fixtures import client_for

    from bot.engine.service import Engine
    from runner.contract.spec import progress_uri

    env = _cli_env(tmp_path, vast, s3_bucket)
    client = client_for(vast)
    offer = client.search_offers(OfferQuery(interruptible=False, min_reliability=0.0))[0]
    settings = Settings(
        TUNEBOT_DATA_DIR=env["TUNEBOT_DATA_DIR"], TUNEBOT_CHECKPOINT_URI=env["TUNEBOT_CHECKPOINT_URI"]
    )
    engine = Engine(settings, db_url=env["DATABASE_URL"], providers={"vast": client})
    job = engine.create_job(request(), user="alice", estimate=make_estimate([offer]))
    assert job.state == "running", job.message
    label = job_label(job.job_id)
    assert len(vast.live_instances(label)) == 1
    from store.models import Job

    with engine.session() as s:
        folder = s.get(Job, job.job_id).checkpoint_uri
    events = [
        {"job_id": job.job_id, "seq": 0, "kind": "started", "step": 0, "timestamp": time.time()},
        {
            "job_id": job.job_id,
            "seq": 1,
            "kind": "finished",
            "step": 20,
            "max_steps": 20,
            "loss": 1.25,
            "timestamp": time.time(),
        },
    ]
    obj = {"job_id": job.job_id, "updated": time.time(), "last_seq": 1, "events": signed_all(engine, events)}
    engine.close()
    with fsspec.open(progress_uri(folder), "w") as fh:  # what the runner wrote as it ended
        fh.write(json.dumps(obj))

    shown = _cli(["jobs", job.job_id], env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "succeeded" in shown.stdout, shown.stdout
    assert vast.live_instances(label) == []  # torn down by the process that looked, not by a supervisor
    check = Engine(settings, db_url=env["DATABASE_URL"], providers={"vast": client})
    try:
        view = check.get_job(job.job_id)
        assert view.state == "succeeded" and view.step == 20 and view.spend > 0
    finally:
        check.close()
