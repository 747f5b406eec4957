"""Who watches the jobs: whether a supervisor lives, and ending a job as soon as any process sees it end.

A job costs money until its instance is terminated, and the supervisor (the scheduler's leader in
`tunebot serve`: its tick follows every running job, ends finished ones, enforces caps, relaunches after
preemptions) is what terminates it. The leader renews a lease row in the store every few seconds (on
PostgreSQL beside its advisory lock), so any process can tell whether one is alive: `tunebot launch` without
a live one starts one in the background (bot/commands/supervisor.py), or says so and how to start one
(TUNEBOT_START_SUPERVISOR=0). And a runner's terminal event ends its job in whichever process
reads it first (a push to /runner/events, `tunebot jobs`, `launch --wait`, the console, the tick): the finish
terminates the instance and is idempotent with the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from store.models import SchedulerLease

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

LEASE_NAME = "scheduler"  # the scheduler leader's lease row (bot/scheduler.py writes it)

UNWATCHED = (
    "No tunebot supervisor is running on this job database (no live scheduler lease): nothing will "
    "terminate the instance when the job ends or relaunch it after a preemption (the runner stops itself "
    "at the spend cap, but its machine bills until something terminates it). Run `tunebot serve` (the way "
    "to run tunebot: docs/deploy.md), or follow the job from here with `--wait`; `tunebot jobs JOB` also "
    "ends a job its runner reports finished."
)


@dataclass(frozen=True)
class Supervisor:
    holder: str
    renewed_at: float
    expires_at: float


def supervisor(ctx: EngineContext) -> Supervisor | None:
    """The live supervisor (its lease not expired), or None when nothing supervises the jobs."""
    with ctx.session() as s:
        row = s.get(SchedulerLease, LEASE_NAME)
    if row is None or row.expires_at <= ctx.now():
        return None
    return Supervisor(row.holder, row.renewed_at, row.expires_at)
