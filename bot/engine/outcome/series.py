"""A job's chart data from its runner events: every step's loss and learning rate, evals, preemptions.

The runner sends, with each event, every optimizer step since the previous one (``points``) and the eval
losses measured meanwhile (``evals``, runner/contract/spec.py); older runners sent only the step of each
report, which is taken as it is. A run that resumed from an earlier checkpoint trains some steps again: the
newest value of a step wins. Preemptions are the runner's ``preempted`` events and the engine's own ``running
-> recovering`` transitions (a host that vanished without a word), placed at the last step reported before
them; resumes are the ``started`` events of a run that did not begin at step 0.

``fold`` is pure (tested directly); ``job_series`` reads the rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from bot.engine.api import EngineError, JobSeries
from bot.engine.context import EngineContext
from bot.engine.views import job_view
from store.models import AuditLog, Job, RunnerEventRecord

MAX_POINTS = 20_000  # a chart has no use for more; a longer run is thinned evenly, the last step kept


@dataclass(frozen=True)
class EventRow:
    seq: int
    kind: str
    step: int
    loss: float | None
    at: float
    payload: dict[str, Any]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _thin(points: dict[int, float]) -> list[tuple[int, float]]:
    items = sorted(points.items())
    if len(items) <= MAX_POINTS:
        return items
    stride = -(-len(items) // MAX_POINTS)
    return items[::stride] + ([items[-1]] if (len(items) - 1) % stride else [])


def fold(events: Iterable[EventRow], recoveries: Iterable[float] = ()) -> dict[str, Any]:
    """Train, eval and learning-rate series and preemption/resume steps from runner events (by seq) and
    the times the engine found the job preempted on its own."""
    train: dict[int, float] = {}
    evals: dict[int, float] = {}
    rates: dict[int, float] = {}
    preempted: list[int] = []
    resumed: list[int] = []
    timeline: list[tuple[float, int]] = []  # (when, step) of every event, to place the engine's marks
    for e in sorted(events, key=lambda r: r.seq):
        timeline.append((e.at, e.step))
        points = e.payload.get("points")
        if isinstance(points, list):
            for point in points:
                if not (isinstance(point, list | tuple) and len(point) == 3 and isinstance(point[0], int)):
                    continue
                loss, lr = _number(point[1]), _number(point[2])
                if loss is not None:
                    train[point[0]] = loss
                if lr is not None:
                    rates[point[0]] = lr
        elif e.kind == "progress":  # a runner without points: the reported step alone
            if (loss := _number(e.loss)) is not None:
                train[e.step] = loss
            if (lr := _number(e.payload.get("learning_rate"))) is not None:
                rates[e.step] = lr
        for point in e.payload.get("evals") or []:
            if isinstance(point, list | tuple) and len(point) == 2 and isinstance(point[0], int):
                if (loss := _number(point[1])) is not None:
                    evals[point[0]] = loss
        if e.kind == "preempted":
            preempted.append(e.step)
        elif e.kind == "started" and e.step > 0:
            resumed.append(e.step)
    timeline.sort()
    for when in sorted(recoveries):
        before = [step for at, step in timeline if at <= when]
        step = before[-1] if before else 0
        if step not in preempted:  # the runner said so itself already
            preempted.append(step)
    return {
        "train": _thin(train),
        "eval": sorted(evals.items()),
        "lr": _thin(rates),
        "preemptions": sorted(preempted),
        "resumes": sorted(resumed),
    }


def job_series(ctx: EngineContext, job_id: str) -> JobSeries:
    with ctx.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            raise EngineError(f"no job {job_id}")
        rows = s.execute(
            select(
                RunnerEventRecord.seq,
                RunnerEventRecord.kind,
                RunnerEventRecord.step,
                RunnerEventRecord.loss,
                RunnerEventRecord.at,
                RunnerEventRecord.payload,
            ).where(RunnerEventRecord.job_id == job_id)
        ).all()
        preempted = AuditLog.action.like("transition:%->recovering")
        recoveries = s.execute(select(AuditLog.at).where(AuditLog.job_id == job_id, preempted)).scalars()
        data = fold((EventRow(*r) for r in rows), list(recoveries))
    view = job_view(job)
    return JobSeries(
        job_id=job.id,
        model=view.model,
        method=view.method,
        provider=job.provider,
        gpu=job.gpu,
        gpu_count=job.gpu_count,
        interruptible=job.interruptible,
        step=job.last_step,
        max_steps=job.max_steps,
        **data,
    )
