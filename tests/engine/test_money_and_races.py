"""Issue 14: every dollar on the job that spent it, and concurrent bot processes never crash.

- every terminal path (succeeded, failed, stopped, plateau, retry budget, cap, price, cancelled) records
  the job's spend as the sum of its instances' billed seconds x locked prices, which is also its ledger;
- two supervisors on one job store each runner event once, publish it once, and log no traceback;
- several processes starting at once on a fresh SQLite file all open it (migrations under a file lock);
- two `tunebot serve` replicas starting together on PostgreSQL while an instance exists at a fake cloud
  that the database does not know: one row, one instance, both replicas up, no traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fakes.runner_events import signed
from sqlalchemy import select

from bot.engine.record.spend import billed_seconds
from bot.money import money
from bot.providers.base import InstanceStatus, LaunchRequest, OfferQuery, job_label
from bot.settings import Settings
from runner.contract.spec import JobSpec, progress_uri
from store.models import Instance, Job, RunnerEventRecord

from .conftest import Recorder, estimate_for, request
from .fakes import FakeProvider, make_estimate

TERMINAL_PATHS = ["succeeded", "failed", "plateau", "stopped", "retry_budget", "cap", "price", "cancelled"]
EXPECTED_STATE = {
    "succeeded": "succeeded",
    "failed": "failed",
    "plateau": "stopped",
    "stopped": "stopped",
    "retry_budget": "failed",
    "cap": "stopped",
    "price": "stopped",
    "cancelled": "cancelled",
}


def _spec(fake: FakeProvider) -> JobSpec:
    return JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])


def _preempt_all(fake: FakeProvider) -> None:
    for iid in list(fake.instances):
        fake.set_status(iid, InstanceStatus.preempted)


def _drive(path: str, eng, fake: FakeProvider, clock, settings: Settings) -> str:  # noqa: ANN001
    """Run a job to the end by one terminal path; returns its id."""
    if path == "cancelled":
        job = eng.create_job(request(), user="alice", estimate=estimate_for(fake, hours=500.0))
        assert job.state == "pending_approval"
        eng.stop(job.job_id, user="alice")
        return job.job_id
    cap = 5.0 if path == "cap" else None
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake, hours=0.1), max_cost=cap)
    assert job.state == "running", job.message
    clock.advance(700)
    if path == "succeeded":
        fake.set_status(next(iter(fake.instances)), InstanceStatus.exited, 0)
    elif path == "failed":
        fake.set_status(next(iter(fake.instances)), InstanceStatus.exited, 1)
    elif path == "plateau":
        eng.record_runner_event(
            job.job_id,
            _spec(fake).report.token,
            signed(eng, {"job_id": job.job_id, "seq": 1, "kind": "plateau", "step": 5, "timestamp": 1000.0}),
        )
    elif path == "stopped":
        eng.stop(job.job_id, user="alice")
    elif path == "retry_budget":
        for _ in range(settings.retry_budget + 1):
            _preempt_all(fake)
            eng.tick()
            clock.advance(300)
    elif path == "price":
        _preempt_all(fake)
        fake.live_price = fake.price * 1.5  # above the tolerance: the relaunch stops with its reason
    for _ in range(200):
        if eng.get_job(job.job_id).state == EXPECTED_STATE[path]:
            break
        eng.tick()
        clock.advance(settings.reconcile_every_s)
    return job.job_id


@pytest.mark.parametrize("path", TERMINAL_PATHS)
def test_every_terminal_path_records_the_spend_of_its_instances(make_engine, clock, settings, path):
    fake = FakeProvider("fake", price=36.0)  # $0.01 a second: every path spends real money but cancelled
    eng = make_engine(providers={"fake": fake})
    job_id = _drive(path, eng, fake, clock, settings)
    clock.advance(3600)  # an hour later nothing moves: a finished job's spend is final
    eng.tick()
    with eng.session() as s:
        job = s.get(Job, job_id)
        rows = s.execute(select(Instance).where(Instance.job_id == job_id)).scalars().all()
    assert job is not None and job.state == EXPECTED_STATE[path], (job and job.state, job and job.message)
    assert all(r.ended_at is not None for r in rows), "a finished job keeps no instance"
    instances = sum(billed_seconds(r, clock()) * r.price_per_hour / 3600.0 for r in rows)
    if path == "cancelled":
        assert rows == [] and instances == 0.0
    else:
        assert instances > 1.0  # 700 s or more at $36/h
    if path == "retry_budget":
        assert len(rows) == settings.retry_budget + 1
    assert job.spend == pytest.approx(instances, abs=1e-9)
    # What the person reads (`tunebot jobs`, the job's card) and the period report agree with it.
    assert eng.get_job(job_id).spend == pytest.approx(instances, abs=1e-6)
    listed = {v.job_id: v for v in eng.list_jobs(user="alice")}
    assert listed[job_id].spend == pytest.approx(instances, abs=1e-6)
    ledger = {line.key: line.amount for line in eng.spend("month", user="alice").by_job}
    assert ledger.get(job_id, 0.0) == pytest.approx(instances, abs=1e-6)


def test_budget_failed_job_shows_its_spend_in_the_jobs_command(make_engine, clock, settings, capsys):
    """The report of issue 14: a job that gave up after its retry budget showed `spend $0.0000`."""
    from bot.commands.engine_commands import jobs_command

    fake = FakeProvider("fake", price=36.0)
    eng = make_engine(providers={"fake": fake})
    job_id = _drive("retry_budget", eng, fake, clock, settings)
    view = eng.get_job(job_id)
    assert view.state == "failed" and "retry budget" in (view.message or "")
    ledger = {line.key: line.amount for line in eng.spend("month").by_job}[job_id]
    assert ledger > 1.0 and view.spend == pytest.approx(ledger, abs=1e-6)
    assert money(ledger) in _jobs_output(eng, jobs_command, capsys)  # written as money() writes it everywhere


def _jobs_output(eng, jobs_command, capsys) -> str:  # noqa: ANN001
    import bot.commands.engine_commands as cmds

    real = cmds._engine
    cmds._engine = lambda: eng  # the command on this engine (its fake provider and clock)
    close = eng.close
    eng.close = lambda: None  # type: ignore[method-assign]
    try:
        jobs_command(job_id=None, user=None, active=False, as_json=False)
    finally:
        cmds._engine = real
        eng.close = close  # type: ignore[method-assign]
    return capsys.readouterr().out


def test_closing_an_instance_of_a_finished_job_updates_its_spend(make_engine, clock):
    """A job that ended while its instance was not yet confirmed gone: the reaper closes the instance
    later, and the job's recorded spend follows (the instance billed until then)."""
    from bot.engine.record import states as S

    fake = FakeProvider("fake", price=36.0)
    eng = make_engine(providers={"fake": fake})
    job = eng.create_job(request(), user="alice", estimate=estimate_for(fake, hours=0.1))
    clock.advance(600)
    with eng.session() as s:
        assert S.transition(
            s, job.job_id, S.RUNNING, S.FAILED, actor="test", now=clock(), finished_at=clock()
        )
    clock.advance(600)
    eng.tick()  # the reaper terminates the instance of the finished job
    assert fake.live() == []
    with eng.session() as s:
        j = s.get(Job, job.job_id)
        rows = s.execute(select(Instance).where(Instance.job_id == job.job_id)).scalars().all()
    assert all(r.ended_at is not None for r in rows)
    instances = sum(billed_seconds(r, clock()) * r.price_per_hour / 3600.0 for r in rows)
    assert instances == pytest.approx(12.0)  # 1200 s at $36/h
    assert j is not None and j.spend == pytest.approx(instances, abs=1e-9)
    assert eng.get_job(job.job_id).spend == pytest.approx(instances, abs=1e-6)


# --- two supervisors on one job ---------------------------------------------------------------------------


def _ev(job_id: str, seq: int) -> dict:
    return {
        "job_id": job_id,
        "seq": seq,
        "kind": "progress",
        "step": seq,
        "loss": 3.0 - seq / 1000,
        "max_steps": 10_000,
        "timestamp": 1000.0 + seq,
    }


def test_two_supervisors_on_one_job_store_and_post_each_event_once(make_engine, fake, caplog):
    caplog.set_level(logging.INFO)
    a, b = make_engine(), make_engine()
    seen = Recorder(a.bus), Recorder(b.bus)
    job = a.create_job(request(), user="alice", estimate=estimate_for(fake))
    assert job.state == "running"
    token = _spec(fake).report.token
    progress = Path(progress_uri(_spec(fake).checkpoint.uri))
    progress.parent.mkdir(parents=True, exist_ok=True)
    events: list[dict] = []
    rounds, per_round = 12, 25
    for _ in range(rounds):
        events += [signed(a, _ev(job.job_id, len(events) + k)) for k in range(per_round)]
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"events": events}))
        tmp.replace(progress)
        barrier = threading.Barrier(3)

        def supervise(eng, barrier=barrier) -> None:  # noqa: ANN001
            barrier.wait()
            eng.tick()

        def push(barrier=barrier, newest=events[-per_round:]) -> None:  # noqa: ANN001 - the runner's push
            barrier.wait()
            for e in newest:
                assert a.record_runner_event(job.job_id, token, e)

        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(supervise, a), pool.submit(supervise, b), pool.submit(push)]:
                f.result()
    with a.session() as s:
        stored = s.execute(select(RunnerEventRecord.seq).where(RunnerEventRecord.job_id == job.job_id)).all()
    assert sorted(r[0] for r in stored) == list(range(rounds * per_round))
    posted = [e.data["step"] for r in seen for e in r.events if str(e.kind) == "progress"]
    assert sorted(posted) == list(range(rounds * per_round))  # each step posted in the thread once
    view = a.get_job(job.job_id)
    assert view.state == "running" and view.step == rounds * per_round - 1
    problems = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert problems == [], [r.getMessage() for r in problems]


def test_two_processes_rolling_up_the_ledger_at_once_write_each_line_once(make_engine, clock):
    """Two bot processes (a leader handing over, a CLI `tunebot spend`) rolling up the same new lines."""
    from bot.engine.record.spend import DAY
    from store.models import SpendEntry

    a, b = make_engine(), make_engine()
    for round_ in range(3):
        with a.session() as s:
            for k in range(100):
                s.add(
                    Instance(
                        provider="fake",
                        provider_instance_id=f"r{round_}-{k}",
                        job_id=None,
                        price_per_hour=0.5 + k / 100,
                        launched_at=clock() - 1.5 * DAY + k,
                        status="running",
                    )
                )
            s.commit()
        barrier = threading.Barrier(2)

        def roll(eng, barrier=barrier) -> None:  # noqa: ANN001
            barrier.wait()
            eng.roll_up_spend()

        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(roll, a), pool.submit(roll, b)]:
                f.result()  # neither raises
        clock.advance(60)
    with a.session() as s:
        rows = s.execute(select(Instance)).scalars().all()
        lines = s.execute(select(SpendEntry)).scalars().all()
    keys = [(e.source, e.period_start) for e in lines]
    assert len(keys) == len(set(keys)) >= 2 * len(rows)  # each instance's day once (two or three days)
    assert sum(e.amount for e in lines) == pytest.approx(
        sum(billed_seconds(r, clock() - 60) * r.price_per_hour / 3600 for r in rows)
    )


def test_resume_at_start_survives_a_failing_reconcile(engine, fake, caplog):
    """`tunebot serve` runs resume_all before serving: an error in it must not end the process."""
    from bot.engine.launching.launch import claim

    engine.auto_launch = False
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    assert claim(engine, job.job_id, actor="test")  # its launcher died

    def broken():  # type: ignore[no-untyped-def]
        raise RuntimeError("database hiccup")

    engine.reconcile = broken  # type: ignore[method-assign]
    engine.resume_all()  # does not raise
    assert engine.get_job(job.job_id).state == "running"  # the rest of the start still happened
    assert any("reconcile pass failed" in r.getMessage() for r in caplog.records)


# --- several processes on a fresh SQLite file ---------------------------------------------------------------

ATTEMPTS = 5
# One CLI process: imports everything once, then for each attempt waits for the go signal and runs its
# command on that attempt's new database (so all three start on it at the same moment).
_AT_ONCE = """
import os, sys, time
from pathlib import Path
from bot.cli import main
from bot.settings import get_settings
import bot.engine.service
work, me, attempts, argv = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
for attempt in range(attempts):
    run = work / f"run{attempt}"
    os.environ["TUNEBOT_DATA_DIR"] = str(run / "data")
    os.environ["DATABASE_URL"] = f"sqlite:///{run / 'data' / 'tunebot.db'}"
    get_settings.cache_clear()
    (run / f"ready-{me}").touch()
    while not (run / "go").exists():
        time.sleep(0.002)
    sys.argv = ["tunebot", *argv]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    print(f"attempt {attempt}: exit {code}", file=sys.stderr, flush=True)
    (run / f"exit-{me}").write_text(str(code))
"""


def test_three_processes_at_once_on_a_fresh_sqlite_file(tmp_path):
    """Three CLI processes opening one new SQLite database at the same moment: all of them work."""
    import sqlite3

    from alembic.script import ScriptDirectory

    from store.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    commands = [["jobs"], ["jobs", "--active"], ["spend", "today"]]
    for attempt in range(ATTEMPTS):
        (tmp_path / f"run{attempt}").mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _AT_ONCE, str(tmp_path), str(i), str(ATTEMPTS), *argv],
            env={**os.environ},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, argv in enumerate(commands)
    ]
    try:
        for attempt in range(ATTEMPTS):  # each time a new database file, three processes racing to create it
            run = tmp_path / f"run{attempt}"
            deadline = time.monotonic() + 120
            while not all((run / f"ready-{i}").exists() for i in range(len(commands))):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a process died"
                time.sleep(0.01)
            (run / "go").touch()
            while not all((run / f"exit-{i}").exists() for i in range(len(commands))):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a process died"
                time.sleep(0.01)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for (_, err), argv in zip(outputs, commands, strict=True):
        assert "Traceback" not in err and "cannot open the job database" not in err, (argv, err[-3000:])
        assert err.count(": exit 0") == ATTEMPTS, (argv, err[-3000:])
    for attempt in range(ATTEMPTS):
        with sqlite3.connect(tmp_path / f"run{attempt}" / "data" / "tunebot.db") as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]


# --- two serve replicas on PostgreSQL adopting the same instance --------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_serve_replicas_adopt_an_unrecorded_instance_once_on_postgres(pg_url, tmp_path, s3_bucket):
    import httpx
    import psycopg
    from fakes.clouds import FakeVast
    from fakes.clouds.fixtures import client_for
    from fakes.slack_api import FakeSlack

    from bot.engine.launching.launch import claim
    from bot.engine.service import Engine

    vast = FakeVast().start()
    try:
        client = client_for(vast)
        offer = client.search_offers(OfferQuery(interruptible=False, min_reliability=0.0))[0]
        settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tb")
        eng = Engine(settings, db_url=pg_url, providers={"vast": client})
        eng.auto_launch = False
        job = eng.create_job(request(), user="alice", estimate=make_estimate([offer]))
        assert claim(eng, job.job_id, actor="test")  # launching; the launcher died after the create call
        created = client.launch(LaunchRequest(job_id=job.job_id, offer=offer, image="img"))
        eng.close()
        # Hold inserts into `instances` until both replicas have decided to adopt: both then write at once.
        gate = psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"))
        gate.execute("LOCK TABLE instances IN SHARE MODE")
        watch = psycopg.connect(gate.info.dsn, autocommit=True)  # a transaction caches pg_stat_activity
        ports = [_free_port(), _free_port()]
        with FakeSlack() as slack:
            procs = []
            for i, port in enumerate(ports):
                env = {
                    **os.environ,
                    "DATABASE_URL": pg_url,
                    "TUNEBOT_DATA_DIR": str(tmp_path / f"replica{i}"),
                    "TUNEBOT_CHECKPOINT_URI": f"{s3_bucket}/tb",
                    "VAST_API_KEY": vast.api_key,
                    "VAST_API_URL": vast.url,
                    "SLACK_BOT_TOKEN": "xoxb-replica-test",
                    "SLACK_SIGNING_SECRET": "FAKE-SIGNING-SECRET-5d2e",
                    "SLACK_API_URL": slack.api_url,
                }
                env.pop("SLACK_APP_TOKEN", None)
                env.pop("TUNEBOT_LOCAL_PROVIDER", None)
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            "from bot.cli import main; main()",
                            "serve",
                            "--http",
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(port),
                        ],
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
            outputs: list[str] = []
            try:
                deadline = time.time() + 120
                first_blocked: float | None = None
                while time.time() < deadline - 60 and all(p.poll() is None for p in procs):
                    waiting = watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    ).fetchone()
                    if waiting and waiting[0] >= 2:
                        break
                    if waiting and waiting[0] >= 1:
                        # The scheduler's lease usually lets only the leader adopt: a second waiter may
                        # never come. Give it 5 s (it used to wait out the whole minute).
                        first_blocked = first_blocked or time.time()
                        if time.time() - first_blocked > 5.0:
                            break
                    time.sleep(0.1)
                gate.rollback()  # both replicas are blocked on the same adoption: let them go together
                for port, proc in zip(ports, procs, strict=True):
                    while True:
                        try:
                            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                                break
                        except httpx.HTTPError:
                            pass
                        if proc.poll() is not None:
                            said = proc.communicate()[0][-4000:]
                            pytest.fail(f"a replica exited {proc.returncode}:\n{said}")
                        assert time.time() < deadline, "serve did not start"
                        time.sleep(0.3)
                # the leader has resumed (before its periodic jobs start) and a tick of it has ended since
                # both answered: evidence in task_runs, not a guess at how long that takes
                healthy_at = time.time()
                while not watch.execute(
                    "SELECT 1 FROM task_runs WHERE task = 'tick' AND started_at >= %s"
                    " AND finished_at IS NOT NULL",
                    (healthy_at,),
                ).fetchone():
                    assert time.time() < healthy_at + 90, "no tick of the leader ended"
                    assert all(p.poll() is None for p in procs), "a replica exited"
                    time.sleep(0.2)
                check = Engine(settings, db_url=pg_url, providers={"vast": client})
                with check.session() as s:
                    rows = s.execute(select(Instance)).scalars().all()
                view = check.get_job(job.job_id)
                check.close()
                live = [str(i["id"]) for i in vast.live_instances(job_label(job.job_id))]
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)
                for proc in procs:
                    try:
                        outputs.append(proc.communicate(timeout=30)[0])
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        outputs.append(proc.communicate()[0])
                gate.close()
                watch.close()
        logs = "\n----\n".join(o[-3000:] for o in outputs)
        assert [(r.provider_instance_id, r.adopted, r.ended_at) for r in rows] == [
            (created.instance_id, True, None)
        ], logs
        assert view.state == "running", logs
        assert live == [created.instance_id], logs  # kept running: nothing terminated, nothing bought
        for out in outputs:
            assert "Traceback" not in out and "UniqueViolation" not in out, out[-4000:]
    finally:
        vast.stop()
