"""A job's time by phase (runner/contract/phases.py) as its runner reported it.

The newest stored report's phases (bot/engine/watching/runner_events.py keeps every signed event, its phases
bounded by the contract on the way in; a resumed run's reports carry its earlier runs'). `status JOB` and the
finished card set them against the quote stored with the job's offer (bot/planner/phases.py,
RankedOffer.phases; read by bot/engine/views.py); neither decides money (the ledger bills from the providers'
clocks: bot/engine/record/spend.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from runner.contract.phases import bounded
from runner.contract.spec import TERMINAL_EVENTS, EventKind
from store.models import RunnerEventRecord

# The reports that carry the job's phases so far (runner/train.py): progress and every end.
PHASED = sorted(
    {EventKind.progress.value, EventKind.checkpoint.value, EventKind.preempted.value}
    | {k.value for k in TERMINAL_EVENTS}
)


def run_phases(s: Any, job_id: str) -> dict[str, float] | None:
    """Where the job's time went, by phase, as its runner last reported it; None before any report did."""
    payloads = s.execute(
        select(RunnerEventRecord.payload)
        .where(RunnerEventRecord.job_id == job_id, RunnerEventRecord.kind.in_(PHASED))
        .order_by(RunnerEventRecord.seq.desc())
        .limit(8)
    ).scalars()
    for payload in payloads:
        phases = bounded(payload.get("phases") if isinstance(payload, dict) else None)
        if phases:
            return phases
    return None
