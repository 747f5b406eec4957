"""What every engine step needs, and nothing else: settings, sessions, providers, clock, bus, limits.

The step modules (launch, finish, runner_events, progress, observe, recovery, reconcile, supervise,
jobs, ...) take an ``EngineContext`` instead of the ``Engine`` facade, so they import this module and
never the facade: the facade (bot/engine/service.py) builds one context and passes it down. The context is
frozen; what a process remembers between calls (its launch claims, which progress objects it has
already read, when it last rolled up spend) lives in its ``memory``, one object per process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlmodel import Session

from bot.engine.events import EngineEvent, EngineEventKind, EventBus

if TYPE_CHECKING:
    from sqlalchemy import Engine as SAEngine

    from bot.engine.permissions import Permissions
    from bot.providers.base import Provider
    from bot.settings import Settings
    from store.models import Job


@dataclass(frozen=True)
class Limits:
    """Timing knobs of the engine that are not user settings (tests shorten them)."""

    launch_claim_timeout_s: float = 300.0  # a launch claim older than this is taken over
    terminate_deadline_s: float = 60.0  # keep terminating through an outage this long, then retry later
    stop_grace_s: float = 120.0  # a graceful stop that has not ended by then is terminated
    lost_grace_s: float = 60.0  # a row newer than this may simply not be listed yet
    # A tick rolls all spend up into the ledger at most this often (at 10,000 running jobs that is
    # 10,000 lines); in between it rolls up only people and teams with a budget, so that alerts stay
    # timely. Caps do not wait for either: they read the instances. Views roll up on demand.
    rollup_every_s: float = 60.0


@dataclass
class ProcessMemory:
    """Per-process state: never shared between replicas, rebuilt empty after a restart."""

    process_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    own_claims: set[str] = field(default_factory=set)
    progress_seen: dict[str, tuple] = field(default_factory=dict)  # job id -> window of the last read
    progress_stat: dict[str, tuple] = field(default_factory=dict)  # job id -> ((mtime_ns, size), read at)
    heartbeats: dict[str, Any] = field(default_factory=dict)  # job id -> the runner's newest beat heard
    finishing: set[str] = field(default_factory=set)  # jobs a pushed terminal event is finishing now
    last_rollup: float | None = None
    rolled_up_once: bool = False
    rolled_sources: set[str] = field(default_factory=set)  # ledger sources whose older lines are written
    calibration: Any = None  # (stamp, Calibration) of bot/engine/outcome/calibration.py
    job_master_key: bytes | None = None  # bot/engine/launching/integrity.py (read once)
    integrity_reported: set[str] = field(default_factory=set)  # jobs told about refused runner data
    # bot/engine/money/reports.volumes: the clouds' last volume listing
    volumes_synced_at: float | None = None
    volumes_sync_lock: threading.Lock = field(default_factory=threading.Lock)
    volume_asks: dict[str, list[float]] = field(default_factory=dict)  # member -> their recent `volumes`
    volumes_lock: threading.Lock = field(default_factory=threading.Lock)
    # (job id, run id) -> that run's key (bot/engine/launching/integrity.py): a run's key never changes, so
    # the cache holds no decision; which run is current is read from the database every time.
    run_keys: dict[tuple[str, str], bytes] = field(default_factory=dict)
    pushing: set[str] = field(default_factory=set)  # jobs whose Hub push runs in this process now
    # job id -> (how much slower than quoted, whether its cap cut it) as last said (engine/money/slow_jobs.py)
    pace_said: dict[str, tuple[float, bool]] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineContext:
    settings: Settings
    db: SAEngine
    providers: dict[str, Provider]
    bus: EventBus
    clock: Callable[[], float] = time.time
    limits: Limits = field(default_factory=Limits)
    memory: ProcessMemory = field(default_factory=ProcessMemory)
    permissions: Permissions | None = None  # the policy (default: from the settings)
    # Providers this process supervises but does not offer for new jobs: a Slack `serve` with the local
    # provider off still observes, stops, charges and tears down the local jobs the CLI launched on its store.
    watch_only: Mapping[str, Provider] = field(default_factory=dict)

    @property
    def supervisable(self) -> Mapping[str, Provider]:
        """Every provider a job of this store may run on that this process can reach: the offered ones
        (``providers``, where new jobs launch) and the watch-only ones. Observing, stopping, charging and
        tearing down ask this; launching and pricing ask ``providers``."""
        if not self.watch_only:
            return self.providers
        return ChainMap(self.providers, self.watch_only)  # type: ignore[arg-type]

    @property
    def policy(self) -> Permissions:
        """Who may do what (bot/engine/permissions.py): the steps that decide alone (a launch) ask it."""
        if self.permissions is not None:
            return self.permissions
        from bot.engine.permissions import Permissions

        return Permissions.from_settings(self.settings)

    def now(self) -> float:
        return float(self.clock())

    @contextmanager
    def session(self) -> Iterator[Session]:
        s = Session(self.db, expire_on_commit=False)
        try:
            yield s
        finally:
            s.close()

    # the names the step modules have always used
    @property
    def own_claims(self) -> set[str]:
        return self.memory.own_claims

    @property
    def process_id(self) -> str:
        return self.memory.process_id

    def publish(
        self,
        kind: EngineEventKind,
        job_id: str | None,
        message: str,
        *,
        job: Job | None = None,
        user: str | None = None,
        **data: Any,
    ) -> EngineEvent:
        """Publish an event on the bus, addressed to the job's thread (read from the job row if not given)."""
        if job is None and job_id:
            from store.models import Job

            with self.session() as s:
                job = s.get(Job, job_id)
        ev = EngineEvent(
            kind=kind,
            job_id=job_id,
            user=user or (job.owner if job else None),
            channel=job.channel if job else None,
            thread_ts=job.thread_ts if job else None,
            message=message,
            data=data,
            at=self.now(),
        )
        self.bus.publish(ev)
        return ev
