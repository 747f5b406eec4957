"""Liveness: whether a running job's runner lives, from its heartbeat, whatever its report cadence.

A runner writes a signed beat at the head of its progress object every few seconds
(runner/contract/heartbeat.py), from its own thread, through long evals and uploads, and whether or not it has
anything to report; its progress reports may come once an hour (TUNEBOT_REPORT_EVERY). Issue 38: with reports
hourly, a runner at step 647 was declared dead by the heartbeat timeout and relaunched from step 0.

Each progress read (bot/engine/watching/progress.py) hands the object's head here. A beat counts when the key
of the job's current run signed it and it is newer than the last one counted (a later runner process, else a
later beat: a beat written again, or an older one put back, proves nothing). The runner is then *heard* now,
on the bot's clock (the host's clock is never compared with ours), and its last progress is ``stalled_s`` (the
beat's own claim, bounded by now) before that. This process keeps what it heard in its memory: after a restart
the first read hears each runner again (benefit of the doubt: the newest beat is in the object).

supervise.decide reads it through the Observation: the heartbeat timeout runs from the last word heard (a beat
or an event), the idle rule from the last progress (a step or an event). A host's beats are a bounded claim:
they keep a silent-but-beating runner from being relaunched, never a job past its spend cap, and the
provider's own verdict (gone, exited, preempted) ends it whatever the beats say."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from runner.contract import heartbeat

if TYPE_CHECKING:
    from bot.engine.context import EngineContext


class Heard(NamedTuple):
    """The newest beat this process counted for a job's run, and when (the bot's clock)."""

    run_id: str
    order: tuple[float, int]  # heartbeat.Beat.order of the beat
    step: int
    heard_at: float  # when this process first read it
    active_at: float  # when the runner last made progress, by that beat (heard_at - its stalled_s)


def newer(known: Heard | None, run_id: str, beat: heartbeat.Beat, now: float) -> Heard | None:
    """What is heard after reading ``beat`` of run ``run_id`` at ``now``, None when it is not news (the same
    beat again, or an older one). Pure."""
    if known is not None and known.run_id == run_id and beat.order <= known.order:
        return None
    return Heard(run_id, beat.order, beat.step, now, now - min(beat.stalled_s, now))


def note(ctx: EngineContext, job_id: str, run_id: str, key: bytes, raw: bytes | None) -> bool:
    """Count the beat at the head of a progress object read for the job's current run (``run_id``, whose key
    is ``key``); True when it was news."""
    obj = heartbeat.head(raw) if raw else None
    beat = heartbeat.parse(obj, key, job_id) if obj is not None else None
    if beat is None:
        return False
    fresh = newer(ctx.memory.heartbeats.get(job_id), run_id, beat, ctx.now())
    if fresh is None:
        return False
    ctx.memory.heartbeats[job_id] = fresh
    return True


def heard(ctx: EngineContext, job_id: str, run_id: str | None) -> Heard | None:
    """The newest beat heard from the job's current run, None before its first one (or without a run)."""
    known = ctx.memory.heartbeats.get(job_id)
    return known if known is not None and run_id is not None and known.run_id == run_id else None
