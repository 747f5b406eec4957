"""Periodic work (tick, reconcile, spend roll-up, daily summary, weekly report, volume reminders, catalog
refresh) with exactly one leader among several bot processes.

Leadership: on PostgreSQL a session advisory lock held on a dedicated connection (it dies with the
process, so a standby's next try succeeds); on SQLite a lease row with an expiry renewed by the
leader (one machine, usually one process). Only the leader runs an APScheduler 3
BackgroundScheduler, whose jobs live in a persistent SQLAlchemyJobStore on the same database.
Each run of a task first inserts a ``task_runs`` row keyed by (task, period); the unique key makes
a period run at most once even while leadership changes hands.

Start-up work that takes over other processes' work (``on_lead``: the engine's ``resume_all`` - reconcile,
adoption, reclaiming launches whose process died) runs only when this process becomes the leader, before
its periodic jobs start: a replica started next to a running leader never steals the leader's launches or
races it for the same adoption.

Usage::

    sched = Scheduler(engine)      # default tasks from settings
    sched.start()                  # returns at once; a thread campaigns for leadership
    ...
    sched.stop()
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine as SAEngine
from sqlalchemy import text, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bot.engine.watching.watch import LEASE_NAME  # the lease row other processes read: is a supervisor alive?
from store.db import is_sqlite, make_engine, migrate, normalize_url
from store.models import SchedulerLease, TaskRun

if TYPE_CHECKING:
    from bot.engine.service import Engine

log = logging.getLogger(__name__)

LOCK_KEY = 0x7475_6E62  # advisory lock id of the scheduler leader ("tunb")
JOBSTORE_TABLE = "apscheduler_jobs"

_registry: dict[str, Scheduler] = {}  # holder id -> running scheduler in this process
_registry_lock = threading.Lock()


@dataclass
class Task:
    """A periodic task: every ``every_s`` seconds, or daily at ``at`` ("HH:MM") in ``timezone``; with
    ``weekday`` ("mon".."sun") weekly, on that day at ``at``."""

    fn: Callable[[], Any]
    every_s: float | None = None
    at: str | None = None
    timezone: str = "UTC"
    weekday: str | None = None

    def period_key(self, now: float) -> str:
        if self.every_s:
            return str(int(now // self.every_s))
        from zoneinfo import ZoneInfo

        when = datetime.fromtimestamp(now, ZoneInfo(self.timezone))
        return when.strftime("%G-W%V") if self.weekday else when.strftime("%Y-%m-%d")


def default_tasks(engine: Engine, *, tick_every_s: float | None = None) -> dict[str, Task]:
    s = engine.settings
    period = s.reconcile_every_s

    def refresh_catalog() -> None:
        from bot.providers.catalog import live_catalog

        live_catalog(s, providers=engine.providers)

    return {
        "tick": Task(engine.tick, every_s=tick_every_s or s.tick_every_s),  # what bot/settings.py checks
        "reconcile": Task(engine.reconcile, every_s=period),
        "spend_rollup": Task(engine.roll_up_spend, every_s=300.0),
        "volume_reminders": Task(engine.volume_reminders, every_s=3600.0),
        "catalog_refresh": Task(refresh_catalog, every_s=max(s.catalog_ttl_s, 60.0)),
        "daily_summary": Task(engine.daily_summary, at=s.summary_time, timezone=s.summary_timezone),
        **(
            {
                "weekly_report": Task(
                    engine.weekly_report,
                    at=s.summary_time,
                    timezone=s.summary_timezone,
                    weekday=s.weekly_report_day,
                )
            }
            if s.weekly_report_day
            else {}
        ),
    }


def start_scheduler(
    engine: Engine,
    settings: Any = None,
    *,
    tick_every_s: float | None = None,
    on_lead: Callable[[], Any] | None = None,
) -> Scheduler:
    """Start the bot's scheduler (the default tasks); call ``.shutdown()`` on the result to stop it.
    ``on_lead`` runs each time this process becomes the leader (``engine.resume_all`` in `tunebot serve`)."""
    sched = Scheduler(engine, tasks=default_tasks(engine, tick_every_s=tick_every_s), on_lead=on_lead)
    sched.start()
    return sched


def run_task(holder: str, name: str) -> None:
    """APScheduler's entry point (a module-level function, so the persistent job store can name it)."""
    with _registry_lock:
        sched = _registry.get(holder)
    if sched is None or not sched.is_leader:
        return
    sched.run_once(name)


class Scheduler:
    def __init__(
        self,
        engine: Engine | None = None,
        *,
        db_url: str | None = None,
        tasks: dict[str, Task] | None = None,
        lease_s: float = 15.0,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
        on_lead: Callable[[], Any] | None = None,
    ) -> None:
        if engine is None and (db_url is None or tasks is None):
            raise ValueError("give an engine, or a db_url and tasks")
        self.db_url = normalize_url(db_url or engine.db_url)  # type: ignore[union-attr]
        self.tasks = tasks if tasks is not None else default_tasks(engine)  # type: ignore[arg-type]
        self.lease_s = lease_s
        self.holder = holder or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self.on_lead = on_lead
        migrate(self.db_url)
        self.db: SAEngine = make_engine(self.db_url)
        self._lock_conn: Any = None
        self._aps: Any = None
        self._leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- leadership -------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._leader

    def _try_lead(self) -> bool:
        if is_sqlite(self.db):
            return self._renew_lease()
        if self._lock_conn is None:
            conn = self.db.connect()
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
            conn.commit()
            if not got:
                conn.close()
                return False
            self._lock_conn = conn
            self._beat()
            return True
        try:  # still holding it? (the lock lives exactly as long as this connection)
            self._lock_conn.execute(text("SELECT 1"))
            self._lock_conn.commit()
        except Exception:  # noqa: BLE001 - connection lost: the lock is gone with it
            self._lock_conn = None
            return False
        self._beat()
        return True

    def _beat(self) -> None:
        """PostgreSQL: the advisory lock decides who leads; the lease row, renewed here, tells every other
        process that a supervisor lives (bot/engine/watching/watch.py: `tunebot launch` warns when none
        does)."""
        now = self.clock()
        try:
            with Session(self.db) as s:
                res = s.execute(
                    update(SchedulerLease)
                    .where(SchedulerLease.name == LEASE_NAME)
                    .values(holder=self.holder, expires_at=now + self.lease_s, renewed_at=now)
                )
                if res.rowcount != 1:
                    s.add(
                        SchedulerLease(
                            name=LEASE_NAME, holder=self.holder, expires_at=now + self.lease_s, renewed_at=now
                        )
                    )
                s.commit()
        except Exception:  # noqa: BLE001 - only the signal is late; leadership is the lock's
            log.warning("scheduler %s could not renew its lease row", self.holder, exc_info=True)

    def _renew_lease(self) -> bool:
        now = self.clock()
        with Session(self.db) as s:
            res = s.execute(
                update(SchedulerLease)
                .where(
                    SchedulerLease.name == LEASE_NAME,
                    (SchedulerLease.holder == self.holder) | (SchedulerLease.expires_at < now),
                )
                .values(holder=self.holder, expires_at=now + self.lease_s, renewed_at=now)
            )
            if res.rowcount == 1:
                s.commit()
                return True
            s.rollback()
            s.add(
                SchedulerLease(
                    name=LEASE_NAME, holder=self.holder, expires_at=now + self.lease_s, renewed_at=now
                )
            )
            try:
                s.commit()
                return True
            except IntegrityError:
                s.rollback()
                return False

    def _release(self) -> None:
        if self._lock_conn is not None:
            try:
                self._lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                self._lock_conn.commit()
                self._lock_conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._lock_conn = None
        try:  # the lease row (SQLite: the lease itself; PostgreSQL: the signal) no longer says we live
            with Session(self.db) as s:
                s.execute(
                    update(SchedulerLease)
                    .where(SchedulerLease.name == LEASE_NAME, SchedulerLease.holder == self.holder)
                    .values(expires_at=0.0)
                )
                s.commit()
        except Exception:  # noqa: BLE001 - it expires on its own
            pass

    # --- APScheduler ------------------------------------------------------------------------------
    def _start_jobs(self) -> None:
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        aps = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=self.db, tablename=JOBSTORE_TABLE)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone=UTC,
        )
        aps.start(paused=True)
        for name, task in self.tasks.items():
            if task.every_s:
                trigger: Any = IntervalTrigger(seconds=task.every_s, timezone=UTC)
                grace = max(1, int(task.every_s))
            else:
                hour, minute = (int(x) for x in (task.at or "09:00").split(":"))
                trigger = CronTrigger(
                    day_of_week=task.weekday, hour=hour, minute=minute, timezone=task.timezone
                )
                grace = 3600
            aps.add_job(
                "bot.scheduler:run_task",
                trigger=trigger,
                args=[self.holder, name],
                id=name,
                name=name,
                replace_existing=True,
                misfire_grace_time=grace,
            )
        aps.resume()
        self._aps = aps

    def _stop_jobs(self) -> None:
        if self._aps is not None:
            try:
                self._aps.shutdown(wait=False)
            except Exception:  # noqa: BLE001
                pass
            self._aps = None

    def run_once(self, name: str) -> bool:
        """Run a task unless this period already ran (by any process); True when it ran here."""
        task = self.tasks[name]
        now = self.clock()
        key = task.period_key(now)
        with Session(self.db) as s:
            row = TaskRun(task=name, period_key=key, holder=self.holder, started_at=now)
            s.add(row)
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                return False
            run_id = row.id
        ok, message = True, None
        try:
            task.fn()
        except Exception as exc:  # noqa: BLE001 - a failing task is recorded, the scheduler goes on
            ok, message = False, f"{type(exc).__name__}: {exc}"[:500]
            log.exception("scheduled task %s failed", name)
        with Session(self.db) as s:
            s.execute(
                update(TaskRun)
                .where(TaskRun.id == run_id)
                .values(finished_at=self.clock(), ok=ok, message=message)
            )
            s.commit()
        return True

    # --- the campaign loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self._try_lead()
            except Exception:  # noqa: BLE001 - database trouble: step down, try again later
                log.exception("scheduler leadership check failed")
                leading = False
            if leading and not self._leader:
                log.info("scheduler %s is now the leader", self.holder)
                self._leader = True
                if self.on_lead is not None:
                    try:
                        self.on_lead()
                    except Exception:  # noqa: BLE001 - the periodic tasks retry what it could not do
                        log.exception("start-up work of the new leader failed")
                self._start_jobs()
            elif not leading and self._leader:
                log.warning("scheduler %s lost leadership", self.holder)
                self._leader = False
                self._stop_jobs()
            self._stop.wait(self.lease_s / 3)

    def start(self) -> None:
        with _registry_lock:
            _registry[self.holder] = self
        self._thread = threading.Thread(target=self._loop, name="tunebot-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_s)
        self._leader = False
        self._stop_jobs()
        self._release()
        with _registry_lock:
            _registry.pop(self.holder, None)
        self.db.dispose()
