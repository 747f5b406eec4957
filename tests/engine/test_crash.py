"""SIGKILL at every crash point of the launch, recovery and finish sequences, then restart.

For each point a subprocess engine is killed there; a new engine on the same database and the same
local-provider work dir restarts (resume_all + reconcile + ticks). Afterwards: no instance is
orphaned (alive at the provider without an open row of an active job), none was ever created twice
for one launch, and the job ends in the right state.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.engine.crash import CRASH_POINTS
from bot.providers.base import job_label
from bot.providers.local import LocalProvider
from bot.settings import Settings

HERE = Path(__file__).parent
# Acts like the runner under SIGTERM: exits 75 (preempted) at once.
SLEEPER = [
    sys.executable,
    "-c",
    "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\ntime.sleep(120)",
]
QUICK = [sys.executable, "-c", "import time; time.sleep(1.0)"]  # finishes with exit code 0

MODES = {
    "launch.after_claim": "launch",
    "launch.after_run_started": "launch",
    # issue 38: the restarted bot took the relaunch over with its run detached from the session
    # (DetachedInstanceError in build_spec) and the job stayed launching forever
    "relaunch.after_run_started": "recover",
    "launch.after_provider_create": "launch",
    "launch.after_commit": "launch",
    "recover.after_mark": "recover",
    "recover.after_terminate": "recover",
    "finish.before_terminate": "finish",
    "finish.after_terminate": "finish",
    "finish.after_commit": "finish",
}


def test_every_crash_point_is_covered():
    assert set(MODES) == set(CRASH_POINTS)


def _records(workdir: Path) -> list[dict]:
    try:
        return list(json.loads((workdir / "instances.json").read_text()).values())
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_and_restart(point: str, db_url: str, tmp_path: Path) -> None:
    from bot.engine.service import Engine

    mode = MODES[point]
    command = QUICK if mode == "finish" else SLEEPER
    workdir = tmp_path / "local"
    data_dir = tmp_path / "data"
    env = {**os.environ, "TUNEBOT_CRASH_AT": point}
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "crash_scenario.py"),
            mode,
            db_url,
            str(workdir),
            str(data_dir),
            json.dumps(command),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == -signal.SIGKILL, (
        f"not killed at {point}: rc={proc.returncode}\n{proc.stderr[-3000:]}"
    )
    local = LocalProvider(workdir=workdir, runner_command=command)
    eng = Engine(Settings(TUNEBOT_DATA_DIR=str(data_dir)), db_url=db_url, providers={"local": local})
    eng.terminate_deadline_s = 10.0
    try:
        (job,) = eng.list_jobs()  # the crash may come before the scenario could print the id
        job_id = job.job_id
        label = job_label(job_id)
        eng.resume_all()
        want = {"launch": "running", "recover": "running", "finish": "succeeded"}[mode]
        deadline = time.time() + 30
        while time.time() < deadline and eng.get_job(job_id).state != want:
            eng.reconcile()
            eng.tick()
            time.sleep(0.1)
        view = eng.get_job(job_id)
        assert view.state == want, f"{point}: {view.state} ({view.message})"
        live = [i for i in local.list_instances() if i.status.value != "terminated"]
        ours = [i for i in live if i.label == label]
        created = [r for r in _records(workdir) if r.get("label") == label]
        if mode == "finish":
            assert live == [], f"{point}: orphaned {live}"
            assert len(created) == 1
        else:
            assert len(ours) == 1 and len(live) == 1, f"{point}: live instances {live}"
            # Exactly one create per launch: one for "launch", the original plus one relaunch for "recover".
            assert len(created) == (1 if mode == "launch" else 2), f"{point}: created {created}"
            with eng.session() as s:
                from sqlalchemy import select

                from store.models import Instance

                open_rows = s.execute(select(Instance).where(Instance.ended_at.is_(None))).scalars().all()
            assert [r.provider_instance_id for r in open_rows] == [ours[0].instance_id]
            assert view.preemptions == (1 if mode == "recover" else 0)
            # A user stop then leaves nothing running.
            eng.stop(job_id, user="alice")
            for _ in range(50):
                if eng.get_job(job_id).state == "stopped":
                    break
                eng.tick()
                time.sleep(0.1)
            assert eng.get_job(job_id).state == "stopped"
            assert local.list_instances() == []
    finally:
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()


@pytest.mark.slow
def test_an_adopted_instance_is_billed_from_the_providers_clock(
    db_url: str, tmp_path: Path, s3_bucket: str
) -> None:
    """SIGKILL between Vast's create and the commit; the bot is down 3 s while Vast bills. After the
    restart adopts the instance and a stop terminates it, the job's spend is what Vast billed (start_date
    to destroy) at the locked price, to the cent. At $36/h a cent is a second: billing from the adoption
    would miss 3+ cents."""
    from fakes.clouds.fixtures import client_for
    from sqlalchemy import select

    from bot.engine.record.spend import job_spend
    from bot.engine.service import Engine
    from store.models import Instance

    with _crashed_on_vast(db_url, tmp_path, s3_bucket, "launch.after_provider_create") as (vast, settings):
        (created,) = list(vast.instances)  # it exists at Vast; the database has no row for it (Vast bills on)
        eng = Engine(settings, db_url=db_url, providers={"vast": client_for(vast)})
        eng.terminate_deadline_s = 10.0
        try:
            (job,) = eng.list_jobs()
            _recover_until(eng, job.job_id, "running")
            with eng.session() as s:
                (row,) = s.execute(select(Instance)).scalars().all()
            assert row.provider_instance_id == created and row.adopted
            assert row.created_at is not None and abs(row.launched_at - row.created_at) < 1e-6
            eng.stop(job.job_id, user="alice")
            for _ in range(100):
                if created in vast.billed and eng.get_job(job.job_id).state == "stopped":
                    break
                eng.tick()
                time.sleep(0.1)
            assert created in vast.billed, "never terminated"
            seconds, price = vast.billed[created]
            assert price == 36.0
            with eng.session() as s:
                spent = job_spend(s, job.job_id, eng.now())
            assert seconds > 3.0
            assert abs(spent - seconds * price / 3600) < 0.01, (spent, seconds * price / 3600)
        finally:
            eng.close()


@pytest.mark.slow
def test_a_finish_taken_over_after_a_crash_bills_until_the_provider_stopped(
    db_url: str, tmp_path: Path, s3_bucket: str
) -> None:
    """Issue 38: SIGKILL after Vast confirmed the destroy, before the final state committed; the bot is down
    3 s. The restarted bot finishes the job: its ledger ends where Vast's billing ended (the destroy call),
    not when the restarted bot found the instance gone. At $36/h a cent is a second."""
    from fakes.clouds.fixtures import client_for
    from sqlalchemy import select

    from bot.engine.record.spend import job_spend
    from bot.engine.service import Engine
    from store.models import Instance

    with _crashed_on_vast(db_url, tmp_path, s3_bucket, "finish.after_terminate") as (vast, settings):
        ((destroyed, (seconds, price)),) = vast.billed.items()  # Vast stopped billing at the destroy
        eng = Engine(settings, db_url=db_url, providers={"vast": client_for(vast)})
        eng.terminate_deadline_s = 10.0
        try:
            (job,) = eng.list_jobs()
            _recover_until(eng, job.job_id, "stopped")
            with eng.session() as s:
                (row,) = s.execute(select(Instance)).scalars().all()
                spent = job_spend(s, job.job_id, eng.now())
            assert row.provider_instance_id == destroyed and row.ended_at is not None
            assert abs(spent - seconds * price / 3600) < 0.01, (spent, seconds * price / 3600)
            assert abs(eng.get_job(job.job_id).spend - spent) < 1e-6
        finally:
            eng.close()


def _recover_until(eng: Any, job_id: str, state: str) -> None:
    """What a restarted bot does (resume, then reconcile and tick) until the job reaches ``state``."""
    eng.resume_all()
    deadline = time.time() + 30
    while time.time() < deadline and eng.get_job(job_id).state != state:
        eng.reconcile()
        eng.tick()
        time.sleep(0.1)
    assert eng.get_job(job_id).state == state


@contextlib.contextmanager
def _crashed_on_vast(
    db_url: str, tmp_path: Path, s3_bucket: str, crash_at: str
) -> Iterator[tuple[Any, Settings]]:
    """A bot on a fake Vast ($36/h: a cent a second) SIGKILLed at ``crash_at`` and then down 3 s while Vast
    bills; yields the fake Vast and the settings a restarted bot takes."""
    from fakes.clouds.vast import FakeVast

    vast = FakeVast(n_offers=8, seed=13).start()
    try:
        ask = vast.offers[0]
        ask.update(dph_total=36.0, reliability2=0.99, rentable=True)
        data_dir = tmp_path / "data"
        checkpoints = f"{s3_bucket}/tunebot"
        env = {
            **os.environ,
            "TUNEBOT_CRASH_AT": crash_at,
            "TUNEBOT_CHECKPOINT_URI": checkpoints,
            "TUNEBOT_TEST_VAST_URL": vast.url,
            "TUNEBOT_TEST_VAST_KEY": vast.api_key,
            "TUNEBOT_TEST_VAST_ASK": str(ask["id"]),
        }
        args = ["vast", db_url, str(tmp_path / "w"), str(data_dir), "[]"]
        proc = subprocess.run(
            [sys.executable, str(HERE / "crash_scenario.py"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert proc.returncode == -signal.SIGKILL, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
        time.sleep(3.0)  # the bot is down; Vast bills on (or stopped billing at a destroy)
        yield vast, Settings(TUNEBOT_DATA_DIR=str(data_dir), TUNEBOT_CHECKPOINT_URI=checkpoints)
    finally:
        vast.stop()
