"""The neutral event stream out of the engine, for the chat layer (Slack, terminal) to render.

The engine knows nothing of Block Kit or rich; it publishes EngineEvents to subscribers. A
subscriber that raises is logged and skipped: chat trouble never stops the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)


class EngineEventKind(StrEnum):
    job_created = "job_created"
    approval_needed = "approval_needed"
    job_started = "job_started"
    progress = "progress"
    checkpoint = "checkpoint"
    preempted = "preempted"
    # out of GPU memory: moved to a bigger GPU, or asking (engine/watching/grow.py)
    out_of_memory = "out_of_memory"
    start_retry = "start_retry"  # an instance never started the runner: terminated, retried once elsewhere
    recovered = "recovered"
    plateau = "plateau"
    finished = "finished"
    failed = "failed"
    stopped = "stopped"
    resumed = "resumed"  # a stopped or failed job continues (`resume`): data {checkpoint_uri, max_cost}
    link = "link"  # a page about the job (the W&B run): data {url, name}
    warning = "warning"  # something about the job people should know (runner data refused, storage unscoped)
    budget_alert = "budget_alert"
    idle_volume = "idle_volume"
    daily_summary = "daily_summary"  # data {"summary": DailySummary as JSON}
    weekly_report = "weekly_report"  # data {"report": WeeklyReport as JSON}
    # A sweep (bot/engine/control/sweeps.py): data {"sweep_id"}; its thread is the sweep's, its runs are lines
    # in it.
    sweep_created = "sweep_created"  # priced and created (running, or waiting for approval: data approval)
    sweep_stage = "sweep_stage"  # a stage ended: the better runs go on, the others are stopped
    sweep_done = "sweep_done"  # ended: done (a winner), stopped or failed


class EngineEvent(BaseModel):
    kind: EngineEventKind
    job_id: str | None = None
    user: str | None = None  # owner of the job / budget / volume
    channel: str | None = None  # where the job was requested (chat-specific id, opaque here)
    thread_ts: str | None = None
    message: str = ""  # a human sentence, already free of secrets
    data: dict[str, Any] = Field(default_factory=dict)  # numbers for rendering (loss, spend, eta...)
    at: float = Field(default_factory=time.time)


Subscriber = Callable[[EngineEvent], None]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> None:
        with self._lock:
            self._subscribers.append(fn)

    def publish(self, event: EngineEvent) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(event)
            except Exception:  # noqa: BLE001 - a broken renderer must not stop the engine
                log.exception("event subscriber failed on %s", event.kind)
