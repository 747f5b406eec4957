"""Two `tunebot serve` replicas started at once on PostgreSQL: both stay up, one leads, and only the leader
runs the start-up resume (reconcile, adoption, stale launches), so an instance left by a crash is adopted
exactly once. Real processes, a fake Vast with an instance whose row was lost, a fake Slack Web API."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from fakes.clouds.vast import FakeVast
from fakes.slack_api import FakeSlack
from sqlalchemy import select

from bot.planner.request import EstimateRequest
from bot.providers.base import LaunchRequest
from store.db import make_engine
from store.models import AuditLog, Instance, Job

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vast_offer(vast: FakeVast):  # type: ignore[no-untyped-def]
    from bot.providers.vast import VastProvider

    client = VastProvider(api_key=vast.api_key, base_url=vast.url)
    ask = vast.offers[0]
    (offer,) = client._search(
        {"id": {"eq": ask["id"]}, "type": "on-demand", "rentable": {"eq": True}, "limit": 1},
        interruptible=False,
    )
    return client, offer


def seed_lost_instance(pg_url: str, vast: FakeVast) -> str:
    """A running job whose Vast instance exists but has no row (a crash between create and commit)."""
    from sqlmodel import Session

    client, offer = vast_offer(vast)
    now = time.time()
    with Session(make_engine(pg_url)) as s:
        s.add(
            Job(
                id="jreplica1",
                owner="U1",
                state="running",
                request=EstimateRequest(model="tiny").model_dump(mode="json"),
                offer={**offer.model_dump(mode="json"), "labels": ["cheapest"], "fits": True},
                provider="vast",
                price_per_hour=offer.price_per_hour,
                created_at=now,
                updated_at=now,
                started_at=now,
            )
        )
        s.commit()
    client.launch(LaunchRequest(job_id="jreplica1", offer=offer, image="tunebot-runner:test"))
    return "jreplica1"


def serve_env(pg_url: str, slack: FakeSlack, vast: FakeVast) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": pg_url,
        "SLACK_BOT_TOKEN": "xoxb-replica-test",
        "SLACK_SIGNING_SECRET": "replica-secret",
        "SLACK_API_URL": slack.api_url,
        "VAST_API_KEY": vast.api_key,
        "VAST_API_URL": vast.url,
        "TUNEBOT_RECONCILE_EVERY": "3600",  # only the start-up resume adopts within the test
    }


def start_serve(env: dict[str, str], port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--http", "--host", "127.0.0.1", "--port", str(port)],
        env={**env, "TUNEBOT_DATA_DIR": str(data_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(procs: list[subprocess.Popen[bytes]], ports: list[int]) -> None:
    up = {port: False for port in ports}
    deadline = time.time() + 60
    while time.time() < deadline and not all(up.values()):
        for port in ports:
            try:
                up[port] = up[port] or httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
            except httpx.HTTPError:
                pass
        assert all(p.poll() is None for p in procs), "a replica died at start"
        time.sleep(0.2)
    assert all(up.values()), up


def wait_tick(pg_url: str, procs: list[subprocess.Popen[bytes]], after: float, timeout: float = 90) -> None:
    """Wait until the leader's scheduler has finished a tick that started at ``after`` (time.time()) or later:
    its start-up resume ran before its periodic jobs began, and every replica has been campaigning beside it
    since ``after``. Evidence in the database (task_runs) where a sleep would guess the time it takes."""
    from sqlmodel import Session

    from store.models import TaskRun

    db = make_engine(pg_url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        with Session(db) as s:
            done = s.execute(
                select(TaskRun).where(
                    TaskRun.task == "tick", TaskRun.started_at >= after, TaskRun.finished_at.is_not(None)
                )
            ).first()
        if done is not None:
            return
        assert all(p.poll() is None for p in procs), "a replica died next to the leader"
        time.sleep(0.2)
    raise AssertionError(f"no tick of the leader ended within {timeout} s")


def leaders_before_stop(outputs: list[str], stopped_at: datetime) -> int:
    """How many times a replica became the leader while all were up. Once the leader exits on SIGTERM
    its lease is free, and a replica still shutting down may take it: that is not a second leader."""
    count = 0
    for out in outputs:
        for line in out.splitlines():
            if "is now the leader" in line:
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                count += at < stopped_at
    return count


def stop_all(procs: list[subprocess.Popen[bytes]]) -> list[str]:
    outputs = []
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out.decode("utf-8", "replace"))
    return outputs


def test_a_replica_started_next_to_the_leader_does_not_take_over_its_launch(
    pg_url: str, tmp_path: Path
) -> None:
    """The leader is up; a launch is in flight (a fresh claim). A second replica starts: it must stay up and
    leave the launch alone (before, every `serve` ran resume_all at start and force-reclaimed it)."""
    from sqlmodel import Session

    vast = FakeVast(n_offers=8, seed=7).start()
    procs: list[subprocess.Popen[bytes]] = []
    outputs: list[str] = []
    try:
        with FakeSlack() as slack:
            env = serve_env(pg_url, slack, vast)
            ports = [free_port(), free_port()]
            procs.append(start_serve(env, ports[0], tmp_path / "leader"))
            wait_healthy(procs, ports[:1])
            wait_tick(pg_url, procs, after=0.0)  # the leader's own start-up resume is done (it runs first)
            now = time.time()
            with Session(make_engine(pg_url)) as s:
                s.add(
                    Job(
                        id="jinflight",
                        owner="U1",
                        state="launching",
                        request=EstimateRequest(model="tiny").model_dump(mode="json"),
                        offer={
                            **vast_offer(vast)[1].model_dump(mode="json"),
                            "labels": ["cheapest"],
                            "fits": True,
                        },
                        provider="vast",
                        claim_id="claim-of-the-leader",
                        claimed_at=now,
                        created_at=now,
                        updated_at=now,
                    )
                )
                s.commit()
            procs.append(start_serve(env, ports[1], tmp_path / "replica"))
            wait_healthy(procs, ports)
            wait_tick(pg_url, procs, after=time.time())  # the replica campaigned beside the leader meanwhile
            assert [p.poll() for p in procs] == [None, None], "a replica died next to the leader"
            with Session(make_engine(pg_url)) as s:
                job = s.get(Job, "jinflight")
                reclaims = (
                    s.execute(select(AuditLog).where(AuditLog.action == "reclaim-launch")).scalars().all()
                )
            assert job is not None and job.claim_id == "claim-of-the-leader" and reclaims == []
            assert vast.created_total == 0
    finally:
        stopped_at = datetime.now()
        outputs = stop_all(procs)
        vast.stop()
    assert leaders_before_stop(outputs, stopped_at) == 1, outputs


def test_two_replicas_started_at_once_both_stay_up_and_one_adopts(pg_url: str, tmp_path: Path) -> None:
    vast = FakeVast(n_offers=8, seed=7).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with FakeSlack() as slack:
            job_id = seed_lost_instance(pg_url, vast)
            ports = [free_port(), free_port()]
            env = serve_env(pg_url, slack, vast)
            procs = [start_serve(env, port, tmp_path / f"r{i}") for i, port in enumerate(ports)]
            wait_healthy(procs, ports)
            # leadership settled: the leader's resume done, a tick after both were up; both must still be up
            wait_tick(pg_url, procs, after=time.time())
            assert [p.poll() for p in procs] == [None, None], "a replica died next to the leader"
            db = make_engine(pg_url)
            from sqlmodel import Session

            with Session(db) as s:
                rows = s.execute(select(Instance).where(Instance.job_id == job_id)).scalars().all()
                adoptions = s.execute(select(AuditLog).where(AuditLog.action == "adopt")).scalars().all()
            assert len(rows) == 1 and rows[0].adopted
            assert len(adoptions) == 1
    finally:
        stopped_at = datetime.now()
        outputs = stop_all(procs)
        vast.stop()
    leaders = leaders_before_stop(outputs, stopped_at)
    assert leaders == 1, outputs
    for out in outputs:
        assert "Traceback" not in out, out[-3000:]
