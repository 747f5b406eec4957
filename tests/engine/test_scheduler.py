"""The scheduler: one leader among several processes, each task once per period, a standby takes over."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.scheduler import Scheduler, Task

HERE = Path(__file__).parent
PERIOD = 1.0
LEASE = 1.5


def _runs(log: Path) -> list[tuple[int, str, int, float]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        pid, name, key, at = line.split()
        out.append((int(pid), name, int(key), float(at)))
    return out


def _last_key(log: Path) -> int:
    return max(key for _, _, key, _ in _runs(log))


def _wait_periods(log: Path, key: int, timeout: float = 60.0) -> None:
    """Wait until every task has run for period ``key`` or a later one (the scheduler's own periods passing,
    however slowly this machine runs them), rather than sleeping a number of periods."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {name for _, name, k, _ in _runs(log) if k >= key} >= {"reconcile", "summary"}:
            return
        time.sleep(0.1)
    raise AssertionError(f"no run for period {key}: {_runs(log)[-6:]}")


def _spawn(db_url: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "scheduler_worker.py"), db_url, str(log), str(PERIOD), str(LEASE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_one_leader_each_task_once_per_period_standby_takes_over(pg_url: str, tmp_path: Path):
    log = tmp_path / "runs.log"
    first = _spawn(pg_url, log)
    second = None
    try:
        assert first.stdout.readline().strip() == "ready"
        deadline = time.time() + 20
        while time.time() < deadline and not _runs(log):
            time.sleep(0.1)
        assert _runs(log), "no task ran"
        second = _spawn(pg_url, log)
        assert second.stdout.readline().strip() == "ready"
        # four more periods of every task while the standby campaigns beside the leader
        _wait_periods(log, _last_key(log) + 4)
        both = _runs(log)
        assert {pid for pid, *_ in both} == {first.pid}, "the standby ran tasks while the leader lived"
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.time()
        deadline = killed_at + 20
        while time.time() < deadline and not [r for r in _runs(log) if r[0] == second.pid]:
            time.sleep(0.1)
        taken = [r for r in _runs(log) if r[0] == second.pid]
        assert taken, "the standby never took over"
        assert taken[0][3] - killed_at < 4 * LEASE + 2 * PERIOD
        _wait_periods(log, taken[0][2] + 3)  # three more periods under the new leader
        runs = _runs(log)
        per_period = collections.Counter((name, key) for _, name, key, _ in runs)
        assert max(per_period.values()) == 1, f"a task ran twice in one period: {per_period.most_common(3)}"
        for name in ("reconcile", "summary"):
            keys = sorted(key for _, n, key, _ in runs if n == name)
            assert len(keys) >= 5
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def test_run_once_per_period_and_persistent_job_store(db_url: str):
    calls: list[str] = []
    now = [1000.0]
    tasks = {
        "a": Task(lambda: calls.append("a"), every_s=60.0),
        "daily": Task(lambda: calls.append("d"), at="09:00", timezone="Europe/Paris"),
    }
    s1 = Scheduler(db_url=db_url, tasks=tasks, clock=lambda: now[0], lease_s=3.0)
    s2 = Scheduler(db_url=db_url, tasks=tasks, clock=lambda: now[0], lease_s=3.0)
    try:
        assert s1.run_once("a") and not s2.run_once("a")  # same period: once, whoever asks
        now[0] += 60
        assert s2.run_once("a")
        assert s1.run_once("daily") and not s1.run_once("daily")
        assert calls == ["a", "a", "d"]
        # The leader's jobs go to the persistent job store on the same database.
        s1._start_jobs()
        from sqlalchemy import text

        with s1.db.connect() as conn:
            ids = {r[0] for r in conn.execute(text("SELECT id FROM apscheduler_jobs"))}
        assert ids == {"a", "daily"}
    finally:
        s1.stop()
        s2.stop()


def test_sqlite_lease_has_one_holder_and_expires(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    now = [0.0]
    tasks = {"a": Task(lambda: None, every_s=10.0)}
    a = Scheduler(db_url=url, tasks=tasks, lease_s=5.0, clock=lambda: now[0], holder="a")
    b = Scheduler(db_url=url, tasks=tasks, lease_s=5.0, clock=lambda: now[0], holder="b")
    try:
        assert a._try_lead() and not b._try_lead()
        now[0] += 3
        assert a._try_lead() and not b._try_lead()  # renewed
        now[0] += 6  # a stopped renewing
        assert b._try_lead() and not a._try_lead()
    finally:
        a.db.dispose()
        b.db.dispose()


def test_default_tasks_cover_the_periodic_work(engine):
    from bot.scheduler import default_tasks

    tasks = default_tasks(engine)
    assert set(tasks) == {
        "tick",
        "reconcile",
        "spend_rollup",
        "volume_reminders",
        "catalog_refresh",
        "daily_summary",
        "weekly_report",
    }
    assert tasks["daily_summary"].at == engine.settings.summary_time
    assert tasks["reconcile"].every_s == engine.settings.reconcile_every_s
    weekly = tasks["weekly_report"]
    assert (weekly.weekday, weekly.at) == ("mon", engine.settings.summary_time)
    assert weekly.fn == engine.weekly_report


def test_a_weekly_task_runs_once_per_iso_week(db_url: str):
    calls: list[str] = []
    monday = 1_764_547_200.0 + 9 * 3600  # 2025-12-01 09:00 UTC, a Monday
    now = [monday]
    tasks = {"weekly": Task(lambda: calls.append("w"), at="09:00", weekday="mon")}
    sched = Scheduler(db_url=db_url, tasks=tasks, clock=lambda: now[0], lease_s=3.0)
    try:
        assert sched.run_once("weekly")
        now[0] += 3 * 86400  # Thursday, same week
        assert not sched.run_once("weekly")
        now[0] += 4 * 86400  # the next Monday
        assert sched.run_once("weekly") and calls == ["w", "w"]
        sched._start_jobs()
        job = sched._aps.get_job("weekly")
        assert str(job.trigger.fields[4]) == "mon"  # CronTrigger(day_of_week=mon, ...)
    finally:
        sched.stop()
