"""Supervision: what to do with each active job, decided from facts and then applied.

``decide(job, observation, now, limits)`` is pure: a job's facts (its row's few columns), what the
provider and the runner said (an ``Observation``), the time and the limits in, one ``Action`` out.
It is tested as a table (tests/engine/test_decide.py). ``apply(ctx, job, action)`` does the action
through the step modules (launch, finish, recovery, jobs). ``tick(ctx)`` gathers the facts for all
active jobs at once: one query for the jobs, one for their open instances, one listing per
provider, one query for the spend of the capped ones, one transaction for the refreshed statuses.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from sqlalchemy import select

from bot.engine.context import EngineContext
from bot.engine.control import jobs
from bot.engine.launching.launch import take_over
from bot.engine.money import slow_jobs
from bot.engine.outcome import finish as finish_mod
from bot.engine.pace import cap_due
from bot.engine.record import states as S
from bot.engine.record.spend import cost, ended_spend
from bot.engine.record.states import JobState
from bot.engine.watching import observe, progress, startup
from bot.engine.watching.recovery import mark_preempted, relaunch
from runner.contract.spec import EXIT_BUDGET, EXIT_INSTALL, EXIT_OUT_OF_MEMORY, EventKind
from store.models import Instance as InstanceRow
from store.models import Job

log = logging.getLogger(__name__)

# The runner's own terminal event decides how a job ends (state, reason).
OUTCOME_STATE = {
    "finished": (JobState.SUCCEEDED, "finished"),
    "plateau": (JobState.STOPPED, "plateau"),
    "failed": (JobState.FAILED, "runner failed"),
    "budget": (JobState.STOPPED, "budget"),  # the runner stopped itself at the job's spend cap
}
ENDED = ("exited", "preempted", "gone")  # verdicts after which the instance no longer trains
TICK_EVERY_S = 10.0  # the scheduler's tick at most this far apart (bot/scheduler.py default_tasks)


@dataclass(frozen=True)
class SupervisionLimits:
    """The settings a decision reads, in seconds."""

    stop_grace_s: float  # the most a stop waits for the runner's report (a job's own grace is shorter)
    idle_stop_s: float
    heartbeat_timeout_s: float
    cap_horizon_s: float  # the soonest the bot looks again (its tick): the cap's stop is due this far ahead

    @classmethod
    def of(cls, ctx: EngineContext) -> SupervisionLimits:
        st = ctx.settings
        return cls(
            stop_grace_s=st.stop_grace_s,
            idle_stop_s=st.idle_stop_minutes * 60,
            heartbeat_timeout_s=st.heartbeat_timeout_s,
            cap_horizon_s=min(st.reconcile_every_s, TICK_EVERY_S),
        )


class JobFacts(NamedTuple):
    """The columns of a job that supervision reads: the decision's, then the progress pull's (a named
    tuple: a tick builds one per active job straight from its row, several times cheaper than a frozen
    dataclass, and its fields read ~20x faster than a SQLAlchemy row's)."""

    id: str
    state: str
    outcome: str | None = None
    message: str | None = None
    stop_requested_at: float | None = None
    stop_reason: str | None = None
    last_event_at: float | None = None
    started_at: float | None = None
    max_cost: float | None = None
    # Seconds a new instance may take to start the runner (bot/engine/launching/preflight.py); None: jobs from
    # before, twice the heartbeat timeout.
    start_deadline_s: float | None = None
    checkpoint_uri: str | None = None  # where the runner writes its progress object (progress.pull_many)
    progress_window: str | None = None  # the last read of it recorded (progress.py)
    run_id: str | None = None  # the current run, whose key signs its events
    # Its pace against its quote (engine/money/slow_jobs.py): progress, the runner's time left, the quote.
    last_step: int = 0
    max_steps: int | None = None
    eta_seconds: float | None = None
    estimated_hours: float | None = None
    price_per_hour: float | None = None
    sweep_id: str | None = None  # a sweep's run: its pace is the sweep's (slow_jobs.tell)


class Observation(NamedTuple):
    """What the provider said of the job's newest open instance, and what the job has spent (a named
    tuple, as JobFacts).

    ``verdict``: running | provisioning | unknown | preempted | exited | gone | error ("error": the
    provider could not be asked; "gone" also when the job has no open instance).
    """

    verdict: str = "gone"
    exit_code: int | None = None
    launched_at: float | None = None  # of the newest open instance; None = no instance
    spent: float = 0.0
    burn_per_hour: float = 0.0  # all open instances together
    # The runner's heartbeat (progress.py's liveness), on the bot's clock: when its newest beat was
    # heard, and when it last made progress by that beat. None: no beat heard from this run yet.
    heard_at: float | None = None
    active_at: float | None = None
    # The provider sees the runner's own process, and it lives (the local provider: a process on this
    # machine). A silent runner its provider sees alive is not dead: it is stopped as idle, or not at all.
    alive: bool = False
    # A stop asked of a live runner (bot/engine/outcome/stop_request.py): how long this job waits for the
    # runner's checkpoint (its grace; None: the limit's), and whether the runner has reported it (its
    # ``preempted`` event, since the stop was asked).
    stop_grace_s: float | None = None
    said_stopped: bool = False


class Do(StrEnum):
    nothing = "nothing"
    launch = "launch"  # approved: claim and launch
    relaunch = "relaunch"  # recovering: close what is left, claim, launch on the next best offer
    take_over = "take_over"  # launching: take over a launch whose process died
    finish = "finish"  # end the job in ``final`` with ``reason`` (terminates first)
    preempt = "preempt"  # running -> recovering (``reason``), end the instance (``gone``), relaunch
    stop = "stop"  # ask for a graceful stop (``reason``: budget)
    stop_now = "stop_now"  # ask for the stop and end the job at once (``reason``: idle)
    grow = "grow"  # out of GPU memory at every back-off level: a bigger GPU within the cap, or ask (grow.py)
    start_failed = "start_failed"  # the instance never started the runner: one retry elsewhere, then failed


@dataclass(frozen=True)
class Action:
    do: Do = Do.nothing
    final: JobState | None = None
    reason: str | None = None
    message: str | None = None
    gone: bool = False
    exit_code: int | None = None  # an exited runner's code (apply adds the runner's last words)


NOTHING = Action()


def decide(job: JobFacts, obs: Observation | None, now: float, limits: SupervisionLimits) -> Action:
    """The one place that says what happens to an active job next. Pure: no I/O, no clock."""
    if job.state != JobState.RUNNING:
        return _decide_not_running(job)
    said = _runner_outcome(job)
    if said is not None:
        return said
    obs = obs or Observation()
    # Each rule in turn: None passes the job to the next one; an Action (NOTHING included) is the decision.
    return (
        _instance_ended(job, obs)
        or _stop_requested(job, obs, now, limits)
        or _provider_unanswered(obs)
        or _instance_silent(job, obs, now, limits)
        or _spend_reaches_cap(job, obs, limits)
        or NOTHING
    )


def _decide_not_running(job: JobFacts) -> Action:
    """Approved, recovering or launching: the step that moves it on; any other state waits."""
    if job.state == JobState.APPROVED:
        return Action(Do.launch)
    if job.state == JobState.RECOVERING:
        if job.stop_requested_at is not None:
            return Action(Do.finish, JobState.STOPPED, job.stop_reason)
        return Action(Do.relaunch)
    if job.state == JobState.LAUNCHING:
        return Action(Do.take_over)
    return NOTHING


def _runner_outcome(job: JobFacts) -> Action | None:
    """The runner's own terminal event decides: out of memory grows the job (unless a stop was asked
    for), any other outcome ends it; None while the runner has said nothing final."""
    if job.outcome == EventKind.out_of_memory.value and job.stop_requested_at is None:
        return Action(Do.grow, reason="out of memory", message=job.message)
    if job.outcome in OUTCOME_STATE:  # a failure carries its own words
        final, reason = OUTCOME_STATE[job.outcome]
        return Action(Do.finish, final, reason, job.message if final == JobState.FAILED else None)
    return None


def _instance_ended(job: JobFacts, obs: Observation) -> Action | None:
    """The instance no longer trains: the stop we asked for, the runner's exit code, or a lost host."""
    v = obs.verdict
    if v in ENDED and job.stop_requested_at is not None:
        return Action(Do.finish, JobState.STOPPED, job.stop_reason)  # the stop we asked for
    if v == "exited":
        return _exit_action(obs.exit_code)
    if v in ("preempted", "gone"):
        return Action(Do.preempt, reason=f"instance {v}", gone=v == "gone")
    return None


def _exit_action(code: int | None) -> Action:
    """What an exited runner's code says, before (or without) its last event being read."""
    if code == EXIT_OUT_OF_MEMORY:  # the exit code alone (its event may not have been read yet)
        return Action(Do.grow, reason="out of memory")
    if code == 0:
        return Action(Do.finish, JobState.SUCCEEDED, "finished")
    if code == EXIT_INSTALL:  # runner/bootstrap.py: the runner could not be installed on this host
        return Action(
            Do.start_failed,
            reason="the runner could not be installed on the host (exit 78: fetching the staged wheel, "
            "its SHA-256 check or pip install failed; the host's log says which)",
        )
    if code == EXIT_BUDGET:  # the runner stopped itself at the cap (its event may not be read yet)
        return Action(Do.finish, JobState.STOPPED, "budget")
    return Action(Do.finish, JobState.FAILED, f"runner exited with code {code}", exit_code=code)


def _stop_requested(job: JobFacts, obs: Observation, now: float, limits: SupervisionLimits) -> Action | None:
    """A stop was asked for and the instance still runs: wait (NOTHING) for the runner to save and report its
    checkpoint, then end the job (its report acknowledged the checkpoint; the finish terminates). End it
    without waiting when there is nothing to wait for: the runner reported, it has said nothing from this
    instance (nothing to save, or it was launched after the stop), it is silent past the heartbeat timeout
    (dead), the job's spend has reached its cap (the grace never bills past it), or the grace is over."""
    if job.stop_requested_at is None:
        return None
    finish = Action(Do.finish, JobState.STOPPED, job.stop_reason)
    if obs.launched_at is None:
        return finish
    launched_after = obs.launched_at >= job.stop_requested_at
    starting = job.last_event_at is None or job.last_event_at < obs.launched_at
    heard = max(job.last_event_at or 0.0, obs.heard_at or 0.0, obs.launched_at)
    dead = not obs.alive and now - heard > limits.heartbeat_timeout_s
    capped = bool(job.max_cost) and obs.spent >= (job.max_cost or 0.0)
    grace = limits.stop_grace_s if obs.stop_grace_s is None else min(obs.stop_grace_s, limits.stop_grace_s)
    if launched_after or starting or obs.said_stopped or dead or capped:
        return finish
    if now - job.stop_requested_at > grace:
        return finish
    return NOTHING


def _provider_unanswered(obs: Observation) -> Action | None:
    """No instance, or the provider could not be asked: nothing is decided on a failed provider call."""
    return NOTHING if obs.launched_at is None or obs.verdict == "error" else None


def _instance_silent(job: JobFacts, obs: Observation, now: float, limits: SupervisionLimits) -> Action | None:
    """Too long without a word: a runner that never started, an idle or silent one, a host never up.

    Liveness is the runner's heartbeat or any event (``heard``), never the report cadence alone: a runner that
    reports once an hour beats every few seconds (issue 38). Idleness is no progress: no step by its beats and
    no event. A runner whose provider sees its process alive is never declared dead for silence."""
    assert obs.launched_at is not None
    heard = max(job.last_event_at or 0.0, obs.heard_at or 0.0, obs.launched_at)
    starting = job.last_event_at is None or job.last_event_at < obs.launched_at  # not a word from this host
    if starting and job.start_deadline_s is not None:
        # The image pull and the model download take what they take (a 70B model: over an hour): neither the
        # heartbeat nor the idle rule applies before the runner's first event, the start deadline does.
        if now - obs.launched_at > job.start_deadline_s:
            minutes = job.start_deadline_s / 60
            return Action(Do.start_failed, reason=f"the runner did not start within {minutes:.0f} min")
    elif obs.verdict == "running":
        last_activity = max(job.last_event_at or job.started_at or obs.launched_at, obs.active_at or 0.0)
        if now - last_activity > limits.idle_stop_s:
            return Action(Do.stop_now, reason="idle")
        if now - heard > limits.heartbeat_timeout_s and not obs.alive:
            return Action(Do.preempt, reason=f"no heartbeat for {limits.heartbeat_timeout_s:.0f} s")
    elif now - heard > 2 * limits.heartbeat_timeout_s:  # provisioning | unknown: never came up
        return Action(Do.preempt, reason=f"instance stuck in {obs.verdict}")
    return None


def _spend_reaches_cap(job: JobFacts, obs: Observation, limits: SupervisionLimits) -> Action | None:
    """Stop at the job's cap: its spend reached it, or will have by the bot's next look (bot/engine/pace.py
    cap_due: the low end of the projection, never a reconcile period ahead)."""
    if job.max_cost and cap_due(obs.spent, obs.burn_per_hour, job.max_cost, limits.cap_horizon_s):
        return Action(Do.stop, reason="budget")
    return None


def apply(ctx: EngineContext, job: JobFacts, action: Action, row: InstanceRow | None = None) -> None:
    """Carry out a decision (each step is itself guarded by a conditional transition)."""
    if action.do is Do.nothing:
        return
    if action.do is Do.launch:
        jobs.launch(ctx, job.id, user="engine")
    elif action.do is Do.relaunch:
        relaunch(ctx, job.id)
    elif action.do is Do.take_over:
        take_over(ctx, job.id, actor="engine", force=False)
    elif action.do is Do.finish:
        assert action.final is not None
        message = action.message
        if action.exit_code is not None:
            said = _exit_message(ctx, row)
            message = f"the runner exited with code {action.exit_code}" + (f": {said}" if said else "")
        finish_mod.finish(ctx, job.id, action.final, reason=action.reason, message=message)
    elif action.do is Do.preempt:
        if mark_preempted(ctx, job.id, row, why=action.reason or "preempted", gone=action.gone):
            relaunch(ctx, job.id)
    elif action.do is Do.stop:
        log.info("job %s: its spend reaches its cap; stopping", job.id)
        jobs.request_stop(ctx, job.id, reason=action.reason or "budget", actor="engine")
    elif action.do is Do.grow:
        from bot.engine.watching.grow import grow

        grow(ctx, job.id, said=action.message)
    elif action.do is Do.stop_now:  # an idle runner makes no step that could see a stop request: no grace
        jobs.request_stop(ctx, job.id, reason=action.reason or "idle", actor="engine", graceful=False)
        # The graceful stop lets the runner save and report on its way out: read that while its run is still
        # current, so the stopped job's result (and a later resume) is that checkpoint (issue 38).
        progress.pull_many(ctx, [job])
        finish_mod.finish(ctx, job.id, JobState.STOPPED, reason=action.reason)
    elif action.do is Do.start_failed:
        startup.start_failed(ctx, job.id, row, why=action.reason or "the runner did not start")


def _exit_message(ctx: EngineContext, row: InstanceRow | None) -> str | None:
    """The runner's own last words, where the provider can read them (the local provider's log)."""
    provider = ctx.supervisable.get(row.provider) if row is not None else None
    read = getattr(provider, "exit_message", None)
    if row is None or not callable(read):
        return None
    try:
        return read(row.provider_instance_id)
    except Exception:  # noqa: BLE001 - a missing log never blocks the finish
        return None


_FACT_COLUMNS = tuple(getattr(Job, name) for name in JobFacts._fields)


def _load_jobs(ctx: EngineContext, where: Iterable) -> list[JobFacts]:  # type: ignore[type-arg]
    """Jobs as the named tuples of the columns supervision reads: no ORM objects, no JSON decoded, read
    through Core (at 10,000 running jobs, building ORM objects was the largest part of a tick, and the
    ORM's loading of plain column rows still a tenth of it)."""
    make = JobFacts._make
    with ctx.db.connect() as conn:
        return [make(r) for r in conn.execute(select(*_FACT_COLUMNS).where(*where))]


def _chunks(ids: list[str], n: int = 1000) -> Iterable[list[str]]:
    for k in range(0, len(ids), n):
        yield ids[k : k + n]


def tick(ctx: EngineContext) -> int:
    """One pass over the active jobs; returns how many there were."""
    limits = SupervisionLimits.of(ctx)
    active = _load_jobs(ctx, [Job.state.in_(sorted(S.ACTIVE))])
    running: list[JobFacts] = []
    for job in active:
        if job.state == JobState.RUNNING:
            running.append(job)
        else:
            _safely(ctx, job, None, limits)
    if running:
        _supervise_running(ctx, running, limits)
    progress.forget_all_but(ctx, {j.id for j in running})
    return len(active)


def _supervise_running(ctx: EngineContext, running: list[JobFacts], limits: SupervisionLimits) -> None:
    """Running jobs in passes over all of them at once (at 10,000 jobs, each pass is a few milliseconds
    and each query or listing far more): their progress, their open instances, the providers' verdicts,
    their spend, then one decision each."""
    changed = progress.pull_many(ctx, running)
    facts = {j.id: j for j in running}
    if changed:
        for fresh in _refresh(ctx, sorted(changed)):
            facts[fresh.id] = fresh
    rows = _open_rows(ctx, facts)
    for job_rows in rows.older.values():  # a job never keeps two instances: the newest one stays
        for extra in job_rows:
            finish_mod.terminate_instance(ctx, _model(ctx, extra), reason="duplicate")
    to_ask = [r for jid, r in rows.newest.items() if facts[jid].outcome not in OUTCOME_STATE]
    verdicts = observe.observe_many(ctx, to_ask) if to_ask else {}
    _pull_ended(ctx, running, facts, rows.newest, verdicts)
    now = ctx.now()  # one time for the tick's decisions: a job's deadline is at most a tick late
    spent = _spent(ctx, [jid for jid, f in facts.items() if f.max_cost], rows, now)
    stopping = _stopping(ctx, [f for f in facts.values() if f.stop_requested_at is not None], limits)
    gone, newest, older_rows = Observation(), rows.newest, rows.older
    sees = {name for name, p in ctx.supervisable.items() if getattr(p, "sees_runner_process", False)}
    for job_id, f in facts.items():
        row = newest.get(job_id)
        if row is None:
            _safely(ctx, f, gone, limits, now)
            continue
        verdict, code = verdicts.get(row.id, _UNASKED)
        older = older_rows.get(job_id)
        burn = row.price_per_hour + (sum(r.price_per_hour for r in older) if older else 0.0)
        beat = progress.heard(ctx, job_id, f.run_id)
        obs = Observation(
            verdict,
            code,
            row.launched_at,
            spent.get(job_id, 0.0),
            burn,
            beat.heard_at if beat is not None else None,
            beat.active_at if beat is not None else None,
            verdict == "running" and row.provider in sees,
            *stopping.get(job_id, (None, False)),
        )
        _safely(ctx, f, obs, limits, now, row)
        slow_jobs.tell_safely(ctx, f, obs.spent, burn)  # a job well over its quoted time says so, once


_UNASKED = ("error", None)  # no verdict: the provider was not asked (its outcome decides) or could not be


def _stopping(
    ctx: EngineContext, jobs_: list[JobFacts], limits: SupervisionLimits
) -> dict[str, tuple[float, bool]]:
    """For the jobs a stop was asked of (few at any time): each one's grace (from its quote by phase:
    bot/engine/outcome/stop_request.py) and whether its runner has reported its checkpoint since the stop (its
    ``preempted`` event, stored on or after the stop). Two queries, only when there are such jobs."""
    if not jobs_:
        return {}
    from sqlalchemy import func

    from bot.engine.outcome.stop_request import grace_s
    from runner.contract.heartbeat import every
    from store.models import RunnerEventRecord

    ids = [j.id for j in jobs_]
    with ctx.db.connect() as conn:
        offers = dict(conn.execute(select(Job.id, Job.offer).where(Job.id.in_(ids))).all())
        said = dict(
            conn.execute(
                select(RunnerEventRecord.job_id, func.max(RunnerEventRecord.at))
                .where(RunnerEventRecord.job_id.in_(ids), RunnerEventRecord.kind == EventKind.preempted.value)
                .group_by(RunnerEventRecord.job_id)
            ).all()
        )
    beat = every(limits.heartbeat_timeout_s)
    out: dict[str, tuple[float, bool]] = {}
    for j in jobs_:
        offer = offers.get(j.id)
        phases = offer.get("phases") if isinstance(offer, dict) else None
        grace = grace_s(
            phases, j.max_steps, beat_s=beat, tick_s=limits.cap_horizon_s, most_s=limits.stop_grace_s
        )
        at = said.get(j.id)
        out[j.id] = (grace, at is not None and at >= (j.stop_requested_at or 0.0))
    return out


def _pull_ended(
    ctx: EngineContext,
    running: list[JobFacts],
    facts: dict[str, JobFacts],
    newest: dict[str, OpenInstance],
    verdicts: dict[int, tuple[str, int | None]],
) -> None:
    """Read again the progress of the jobs whose instance ended or is gone: their last events may have
    landed just before the exit (the runner's own outcome then decides, not the exit alone)."""
    ended = {jid for jid, r in newest.items() if verdicts.get(r.id, _UNASKED)[0] in ENDED}
    ended.update(jid for jid in facts if jid not in newest)
    if not ended:
        return
    again = [j for j in running if j.id in ended]
    if progress.pull_many(ctx, again):
        for fresh in _refresh(ctx, [j.id for j in again]):
            facts[fresh.id] = fresh


def _safely(
    ctx: EngineContext,
    job: JobFacts,
    obs: Observation | None,
    limits: SupervisionLimits,
    now: float | None = None,
    row: Any = None,
) -> None:
    try:
        action = decide(job, obs, ctx.now() if now is None else now, limits)
        if action.do is not Do.nothing:
            apply(ctx, job, action, _model(ctx, row) if row is not None else None)
    except Exception:  # noqa: BLE001 - one broken job never stops the others
        log.exception("supervising job %s failed", job.id)


def _model(ctx: EngineContext, row: Any) -> InstanceRow:
    """An instance row as the model the step modules take (they mark it ended): read whole, only for
    the few rows an action touches."""
    if isinstance(row, InstanceRow):
        return row
    with ctx.session() as s:
        return s.get(InstanceRow, row.id) or InstanceRow(**row._asdict())


class OpenInstance(NamedTuple):
    """The columns of an open instance row that supervision reads (a named tuple, as JobFacts)."""

    id: int
    provider: str
    provider_instance_id: str
    job_id: str
    price_per_hour: float
    launched_at: float
    ended_at: float | None
    status: str | None
    raw_status: str | None
    exit_code: int | None
    last_seen_at: float | None


def _refresh(ctx: EngineContext, ids: list[str]) -> list[JobFacts]:
    out: list[JobFacts] = []
    for chunk in _chunks(ids):
        out.extend(_load_jobs(ctx, [Job.id.in_(chunk)]))
    return out


class OpenRows(NamedTuple):
    """The jobs' open instance rows (plain rows): each job's newest, and older ones still open (a job
    never keeps two: they are duplicates, oldest first)."""

    newest: dict[str, OpenInstance]
    older: dict[str, list[OpenInstance]]


def _open_rows(ctx: EngineContext, job_ids: Collection[str]) -> OpenRows:
    """Open instance rows of these jobs. For many jobs, one scan of the open rows (their index) filtered
    here beats thousands of IN-list parameters."""
    newest: dict[str, OpenInstance] = {}
    older: dict[str, list[OpenInstance]] = {}
    t = InstanceRow.__table__  # type: ignore[attr-defined]
    q = select(*(t.c[c] for c in OpenInstance._fields)).where(t.c.ended_at.is_(None)).order_by(t.c.id)
    if len(job_ids) <= 500:
        q = q.where(t.c.job_id.in_(sorted(job_ids)))
    make = OpenInstance._make
    with ctx.db.connect() as conn:  # Core: plain rows, no ORM loading
        for r in map(make, conn.execute(q)):
            job_id = r.job_id
            if job_id in job_ids:
                before = newest.get(job_id)
                if before is not None:
                    older.setdefault(job_id, []).append(before)
                newest[job_id] = r
    return OpenRows(newest, older)


def _spent(ctx: EngineContext, job_ids: list[str], rows: OpenRows, now: float) -> dict[str, float]:
    """These jobs' spend so far, for the cap check: the formula of the job's view (spend.job_spend),
    every instance's cost; the ended ones read in one query, the open ones those the tick holds."""
    if not job_ids:
        return {}
    with ctx.db.connect() as conn:
        out = ended_spend(conn, job_ids, now)
    newest, older = rows.newest, rows.older
    for job_id in job_ids:
        row = newest.get(job_id)
        if row is None:
            continue
        spent = out.get(job_id, 0.0) + cost(row.launched_at, None, row.price_per_hour, now)
        for r in older.get(job_id, ()):
            spent += cost(r.launched_at, None, r.price_per_hour, now)
        out[job_id] = spent
    return out


def follow(ctx: EngineContext, job_ids: Iterable[str]) -> list[str]:
    """Read these running jobs' progress objects, then finish the ones whose runner said how it ended: a
    process that is not the supervisor (`tunebot jobs`, the CLI's polling) tears a finished instance down
    too. Returns the ids finished here."""
    ids = sorted(set(job_ids))
    running = Job.state == JobState.RUNNING
    rows = [r for chunk in _chunks(ids) for r in _load_jobs(ctx, [Job.id.in_(chunk), running])]
    if rows:
        progress.pull_many(ctx, rows)
    return finish_reported(ctx, [r.id for r in rows])


def finish_reported(ctx: EngineContext, job_ids: Iterable[str]) -> list[str]:
    """Finish now the running jobs whose runner's terminal event has been stored, whichever process stored
    it (the finish terminates and confirms, and does nothing to a job another process already ended).
    Returns the ids finished here."""
    ids = sorted(set(job_ids))
    limits = SupervisionLimits.of(ctx)
    done: list[str] = []
    for chunk in _chunks(ids):
        told = _load_jobs(
            ctx, [Job.id.in_(chunk), Job.state == JobState.RUNNING, Job.outcome.in_(sorted(OUTCOME_STATE))]
        )
        for job in told:
            _safely(ctx, job, None, limits)
            done.append(job.id)
    return done


def reap(ctx: EngineContext) -> None:
    """Instances still open whose job is final (a terminate that failed earlier): try again."""
    with ctx.session() as s:
        rows = list(
            s.execute(
                select(InstanceRow)
                .join(Job, Job.id == InstanceRow.job_id)
                .where(InstanceRow.ended_at.is_(None), Job.state.in_(sorted(S.FINAL)))
            ).scalars()
        )
    for row in rows:
        finish_mod.terminate_instance(ctx, row, reason="job finished")


__all__ = [
    "Action",
    "Do",
    "JobFacts",
    "Observation",
    "SupervisionLimits",
    "apply",
    "decide",
    "finish_reported",
    "follow",
    "reap",
    "tick",
]
