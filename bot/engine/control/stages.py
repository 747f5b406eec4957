"""A sweep's word to a run paused at its stage boundary: go on (runner/contract/stage.py).

A sweep's runs pause at each stage's last step (``JobSpec.stages``, runner/stage.py) instead of training on;
the sweep stops the ones it drops as any job is stopped, and lets the ones it keeps go on with a decision
object in the current run's own checkpoint folder, signed with that run's key: no other host can write one
that run accepts. A job relaunched after its decision (a preemption, a resume) is a new run that waits again
at the boundary it resumed at: ``release`` is asked again for the new run, so every tick the sweep makes sure
each run it keeps has its word (``released`` says for which run and step it was given).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)


def stage_overrides(steps: list[int]) -> dict[str, object]:
    """The spec fields that make a run pause at every stage's last step but the run's own last (pure)."""
    return {"stages": {"steps": list(steps[:-1])}}


def current_run(ctx: EngineContext, job_id: str) -> str | None:
    """The job's current run (None between runs: its next one is released when it starts)."""
    from store.models import Job

    with ctx.session() as s:
        job = s.get(Job, job_id)
        return job.run_id if job is not None else None


def release(ctx: EngineContext, job_id: str, run_id: str, *, through: int, max_cost: float | None) -> bool:
    """Let run ``run_id`` of the job go on past step ``through`` with ``max_cost`` as its own cap; False
    when the object could not be written (tried again on the next tick)."""
    import fsspec

    from bot.engine.launching import integrity
    from bot.engine.launching.launch import storage_root
    from bot.engine.record import runs
    from runner.contract.stage import decision, decision_uri

    key = integrity.run_key(ctx, job_id, run_id)
    folder = runs.checkpoint_folder(runs.run_root(storage_root(ctx, job_id), run_id))
    try:
        fs, path = fsspec.core.url_to_fs(decision_uri(folder))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, decision(key, job_id, run_id, through=through, max_cost=max_cost))
    except Exception as exc:  # noqa: BLE001 - storage trouble: the next tick writes it again
        log.warning("job %s: the sweep's decision for run %s was not written: %s", job_id, run_id, exc)
        return False
    return True
