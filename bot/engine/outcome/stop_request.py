"""A graceful stop on any provider: the bot's signed word to a live runner, and the grace it is given.

On the local provider the bot SIGTERMs the runner's process (its provider's ``preempt``). A cloud offers no
signal path to the runner: terminating the instance kills it, and the work since its last timed checkpoint is
lost and billed again (issue 38). So before it ends a live cloud runner (a person's ``stop``, a sweep dropping
a run, a budget), the bot writes a stop request beside the run's checkpoints, signed with the run's own key
(runner/contract/stop.py), with its own storage access. The runner looks for it at every heartbeat, saves,
reports the checkpoint in its ``preempted`` event and exits; the supervisor (bot/engine/watching/supervise.py)
waits for that report at most ``grace_s``, acknowledges the checkpoint as it reads it, then terminates. The
wait is a state the tick revisits (``jobs.stop_requested_at``), never a blocking call, and its seconds are
billed and recorded as any others.

A runner that cannot answer is not waited for: a job whose runner has said nothing from its instance yet
(nothing to save), or whose progress object carries no heartbeat of its current run (dead, or from before
heartbeats), is terminated at once, as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)

# A step and a save on a busy host, at least (the quote's figures for a tiny job are fractions of a second).
MIN_WORK_S = 30.0
SAVES = 2.0  # the save on the way out may wait for the timed save still uploading (runner/checkpoint.py)
# A resumable checkpoint holds the trainable weights in fp32 and the optimizer's two moments: up to 6x the
# bytes of the output (16- or 32-bit weights), whose save the quote prices (its "output" phase).
CHECKPOINT_OVER_OUTPUT = 6.0


def grace_s(phases: object, max_steps: int | None, *, beat_s: float, tick_s: float, most_s: float) -> float:
    """How long a stop waits for the runner's checkpoint: a heartbeat (the runner looks for the request once a
    beat), the step it is in, a checkpoint save (two: the timed one may still upload) by the job's quote
    (``phases``: its offer's seconds by phase), and a tick (the bot reads the report); never more than
    ``most_s`` (TUNEBOT_STOP_GRACE), which is also the grace of a job without a quote by phase. Pure."""
    if not isinstance(phases, dict) or not max_steps:
        return most_s

    def seconds(name: str) -> float:
        value = phases.get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

    step = sum(seconds(k) for k in ("warmup", "steps", "optimizer", "logging")) / max(1, max_steps)
    save = CHECKPOINT_OVER_OUTPUT * seconds("output")
    work = max(MIN_WORK_S, step + SAVES * save)
    return min(most_s, beat_s + work + tick_s)


def ask(ctx: EngineContext, job_id: str, *, reason: str) -> bool:
    """Ask the job's live runner to save, report and exit: write its current run's signed stop request. True
    when written (the supervisor then waits for the report, within the grace); False when the runner cannot
    answer (no run, not started on its instance yet, no heartbeat of this run in its progress object) or the
    request could not be written: the caller ends the job at once."""
    import fsspec
    from sqlalchemy import select

    from bot.engine.launching import integrity
    from bot.engine.record import states as S
    from runner.contract.stop import request, request_uri
    from store.models import Instance, Job

    with ctx.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state != S.RUNNING or not job.run_id or not job.checkpoint_uri:
            return False
        newest = s.execute(
            select(Instance.launched_at)
            .where(Instance.job_id == job_id, Instance.ended_at.is_(None))
            .order_by(Instance.id.desc())
            .limit(1)
        ).scalar()
        folder, run_id, spoke = job.checkpoint_uri, job.run_id, job.last_event_at
    if newest is None or spoke is None or spoke < newest:
        return False  # the runner has not started on this instance: nothing to save
    key = integrity.run_key(ctx, job_id, run_id)
    if key is None or not beats(folder, key, job_id):
        return False
    try:
        fs, path = fsspec.core.url_to_fs(request_uri(folder))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, request(key, job_id, run_id, reason=reason))
    except Exception as exc:  # noqa: BLE001 - storage trouble: ended at once, as before
        log.warning("job %s: the stop request for run %s was not written: %s", job_id, run_id, exc)
        return False
    log.info("job %s: asked its runner to save and stop (%s)", job_id, reason)
    return True


def beats(folder: str, key: bytes, job_id: str) -> bool:
    """Whether the run's progress object starts with a heartbeat its key signed (runner/contract/
    heartbeat.py): a runner that beats reads the stop request too. Reads the object's head only."""
    import fsspec

    from runner.contract import heartbeat
    from runner.contract.spec import progress_uri

    try:
        fs, path = fsspec.core.url_to_fs(progress_uri(folder))
        raw = fs.cat_file(path, start=0, end=len(heartbeat.HEAD) + heartbeat.MAX_BYTES)
    except Exception:  # noqa: BLE001 - no object (yet), or unreadable: no beat to go by
        return False
    obj = heartbeat.head(raw)
    return obj is not None and heartbeat.parse(obj, key, job_id) is not None
