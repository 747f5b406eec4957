"""Runner events into the store: the push path's checks, then ``ingest`` / ``ingest_many`` for both paths.

Push: the runner POSTs each RunnerEvent with the job's bearer token (checked in constant time against
the stored hash). Pull (bot/engine/watching/progress.py) hands what it read from the progress object to the
same functions. An event is kept once per (job, seq), under the job's row lock (processes too), and counts
only when the job's own key signed it (bot/engine/launching/integrity.py: another job's host that can write
this job's progress object forges nothing), only while the job is not final, within the size caps, and with
its links pointing where this job's may; what is refused is told once in the job's thread.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from bot.engine.events import EngineEventKind
from bot.engine.launching import integrity
from bot.engine.launching.launch import storage_root, token_hash
from bot.engine.record import runs
from bot.engine.record import states as S
from runner.contract.spec import (
    EventKind,
    RunnerEvent,
    readable_events,
)
from store.db import update_each
from store.models import Job, RunnerEventRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

try:  # a first read parses every object whole: orjson does it in a quarter of json's time
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; plain json still works
    _loads = json.loads

log = logging.getLogger(__name__)

TERMINAL = {
    EventKind.finished.value,
    EventKind.plateau.value,
    EventKind.failed.value,
    EventKind.out_of_memory.value,
    EventKind.budget.value,
}
MEASURED = {EventKind.finished.value, EventKind.plateau.value}  # runs whose metrics teach the planner


def token_ok(job: Job, token: str | None) -> bool:
    if not token or not job.token_hash:
        return False
    return hmac.compare_digest(token_hash(token), job.token_hash)


def receive_pushed(eng: EngineContext, job: Job, payload: dict[str, Any] | bytes | str) -> bool:
    """A pushed event of a job whose token matched: stored when the job is not final and the key of its
    current run signed it; False otherwise (what was refused is told once in the thread)."""
    if job.state in S.FINAL:
        return False
    current = integrity.current_key(eng, job.id, job.run_id)
    if current is None:  # between runs: an ended run's token no longer works either
        return False
    if not isinstance(payload, dict):
        try:
            payload = json.loads(payload)
        except ValueError:
            return False
    run_id, key = current
    events, refused = integrity.signed_events(key, job.id, [payload])
    integrity.report_refused(eng, job.id, refused)
    if not events:
        return False
    ingest(eng, job.id, events, run_id=run_id)
    return True


def ingest(
    eng: EngineContext, job_id: str, events: Iterable[RunnerEvent], *, run_id: str | None = None
) -> int:
    """Store new events (dedupe by seq), update the job's progress and publish; returns how many were new.
    ``run_id``: the run whose key verified them; nothing is stored unless it is still the job's current run
    once the job's row is locked (a relaunch in between replaced it). None: the caller checked nothing (tests
    and tools that feed events straight in): the job's current run then counts as the writer."""
    events = sorted((e for e in events if e.job_id == job_id), key=lambda e: e.seq)
    if not events:
        return 0
    now = eng.now()
    new: list[RunnerEvent] = []
    seqs = [e.seq for e in events]
    with eng.session() as s:
        known = _known(s, job_id, seqs)
    if not any(_is_new(e, known.get(e.seq)) for e in events):
        return 0  # a re-read progress object with nothing new: no lock taken
    refused: Counter[str] = Counter()
    with eng.session() as s:
        # Two supervisors (or a push and a pull) on one job take turns from here to the commit: the
        # second one reads the first one's rows as known, so it stores and posts nothing twice.
        job = S.lock_job(s, job_id)
        if job is None or job.state in S.FINAL:
            return 0  # a final job's outcome is settled: nothing a runner says changes it
        if run_id is not None and job.run_id != run_id:
            return 0  # signed by a run that is not (or no longer) the job's current one
        events, refused["link"] = _bounded(eng, job, events)
        known = _known(s, job_id, seqs)
        for e in events:
            if e.seq >= integrity.MAX_STORED_EVENTS:  # moves the job's progress, without a row
                if _applies_unstored(e, job):
                    new.append(e)
                continue
            old = known.get(e.seq)
            if not _is_new(e, old):
                continue
            if old is not None:
                s.delete(old)
                s.flush()
            row = RunnerEventRecord(
                job_id=job_id,
                seq=e.seq,
                kind=e.kind.value,
                step=e.step,
                loss=e.loss,
                at=now,
                payload=json.loads(e.model_dump_json()),
            )
            s.add(row)
            known[e.seq] = row
            new.append(e)
        if not new:
            return 0
        if job.run_id:
            runs.acknowledge(s, job, job.run_id, new, output_prefix=_output_prefix(eng, job), now=now)
        fields = {**_progress_fields(job, new), "last_event_at": now, "updated_at": now}
        s.execute(update(Job).where(Job.id == job_id).values(**fields))
        try:
            s.commit()
        except IntegrityError:  # a concurrent push/pull stored the same seq: the other one publishes
            s.rollback()
            return 0
        owner_job = job
    integrity.report_refused(eng, job_id, refused)
    _announce(eng, owner_job, new)
    return len(new)


def valid_events(job_id: str, items: list[dict[str, Any]]) -> list[RunnerEvent]:
    """This job's readable events among the items, in seq order."""
    return [e for e in readable_events(items) if e.job_id == job_id]


def _output_prefix(eng: EngineContext, job: Any) -> str:
    """Where the output of the job's current run goes (a plan's own output_uri wins)."""
    plan = getattr(job, "plan", None) or {}
    if isinstance(plan, dict) and plan.get("output_uri"):
        return str(plan["output_uri"])
    if job.run_id and job.run_id != integrity.LEGACY_RUN:
        return runs.output_folder(runs.run_root(storage_root(eng, job.id), job.run_id))
    return f"{storage_root(eng, job.id)}/output"


def _bounded(eng: EngineContext, job: Any, events: list[RunnerEvent]) -> tuple[list[RunnerEvent], int]:
    """The events cut to their caps, with every link that does not point where this job's may dropped;
    how many links were dropped."""
    expected = None  # most events carry no link: where this job's may point is worked out on the first
    out, dropped = [], 0
    for e in events:
        e = integrity.cap_event(e)
        if e.output_uri or e.checkpoint_uri or e.wandb_url or e.hub_url:
            if expected is None:
                expected = integrity.expected_of(eng, job, _output_prefix(eng, job))
            e, n = integrity.check_links(e, expected)
            dropped += n
        out.append(e)
    return out, dropped


def _applies_unstored(e: RunnerEvent, job: Any) -> bool:
    """Past the stored-events cap an event is not kept as a row; it still moves the job's progress when it
    is newer than what was applied (a terminal event always, until the job has an outcome)."""
    if e.kind.value in TERMINAL:
        return job.outcome is None
    return e.seq > job.last_event_seq


def _announce(eng: EngineContext, owner_job: Job, new: list[RunnerEvent]) -> None:
    """Publish what the new events mean to people (progress, checkpoints, links) and record measurements."""
    job_id = owner_job.id
    for e in new:
        if e.kind is EventKind.started and e.wandb_url and not (e.message or "").startswith("resumed from"):
            eng.publish(
                EngineEventKind.link,
                job_id,
                f"W&B run of job {job_id}: {e.wandb_url}",
                job=owner_job,
                url=e.wandb_url,
                name="W&B run",
            )
        if e.kind is EventKind.results and e.results is not None:
            _keep_results(eng, job_id, e)
        if e.kind is EventKind.warning and e.message:
            eng.publish(EngineEventKind.warning, job_id, f"Job {job_id}: {e.message}", job=owner_job)
        if e.kind is EventKind.started and e.wandb_note and not _wandb_noted(eng, job_id, e.seq):
            eng.publish(  # once per job: every resume would say the same while W&B stays away
                EngineEventKind.link,
                job_id,
                e.wandb_note,
                job=owner_job,
                url=None,
                name="Weights & Biases",
            )
        if e.kind.value in MEASURED and e.metrics:
            from bot.engine.outcome.calibration import record_run

            try:
                record_run(eng, owner_job, e)  # what this run measured teaches the planner (issue 11)
            except Exception as exc:  # noqa: BLE001 - a measurement must never stop the job's bookkeeping
                log.warning("job %s: measurements not recorded: %s", job_id, exc)
        kind = {
            EventKind.progress: EngineEventKind.progress,
            EventKind.checkpoint: EngineEventKind.checkpoint,
            # The plateau milestone is the finish's (bot/engine/outcome/finish.py: with the spend and what the
            # run bought), as "finished" is: the runner's event only moves the progress, or it is said twice.
            EventKind.plateau: EngineEventKind.progress,
        }.get(e.kind)
        if kind is None:
            continue
        loss = f", loss {e.loss:.4f}" if e.loss is not None else ""
        total = f"/{e.max_steps}" if e.max_steps else ""
        eng.publish(
            kind,
            job_id,
            f"Job {job_id}: step {e.step}{total}{loss}",
            job=owner_job,
            step=e.step,
            max_steps=e.max_steps,
            loss=e.loss,
            eta_seconds=e.eta_seconds,
            tokens_per_second=e.tokens_per_second,
            checkpoint_uri=e.checkpoint_uri,
        )


def _keep_results(eng: EngineContext, job_id: str, e: RunnerEvent) -> None:
    """What the run bought (eval before and after, the result's step, the answers) on the job's row: the
    event was signed, capped in size and validated with runner.contract.spec.RunResults's bounds on the way
    here."""
    assert e.results is not None
    with eng.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id, Job.state.not_in(sorted(S.FINAL)))
            .values(results=e.results.model_dump(mode="json"))
        )
        s.commit()


def _wandb_noted(eng: EngineContext, job_id: str, seq: int) -> bool:
    """Whether an earlier run of the job already told its thread that W&B logs offline."""
    with eng.session() as s:
        payloads = s.execute(
            select(RunnerEventRecord.payload).where(
                RunnerEventRecord.job_id == job_id,
                RunnerEventRecord.kind == EventKind.started.value,
                RunnerEventRecord.seq != seq,
            )
        ).scalars()
        return any(isinstance(p, dict) and p.get("wandb_note") for p in payloads)


def _known(s: Any, job_id: str, seqs: list[int]) -> dict[int, RunnerEventRecord]:
    rows = s.execute(
        select(RunnerEventRecord).where(RunnerEventRecord.job_id == job_id, RunnerEventRecord.seq.in_(seqs))
    ).scalars()
    return {r.seq: r for r in rows}


def _is_new(e: RunnerEvent, old: RunnerEventRecord | None) -> bool:
    """The same event again (a retried push, a re-read progress object) is not new. A *newer* event under
    a seq we know is a resumed run renumbering from its checkpoint: it replaces the old one, so a
    "finished" after a resume is never lost."""
    return old is None or float(old.payload.get("timestamp") or 0.0) < e.timestamp - 1e-6


def _outcome_note(e: RunnerEvent) -> str | None:
    """What the person should read about how the run ended, in the runner's own words."""
    if e.kind is EventKind.failed:
        return f"runner: {e.message}"[:1000] if e.message else None
    notes = []  # "Pushed to the Hub" is the bot's to say: it pushes (bot/engine/outcome/hub_push.py)
    if e.message and not e.message.startswith("stopped: the loss"):
        notes.append(e.message)
    return "; ".join(notes)[:1000] or None


_PROGRESS_COLUMNS = (
    Job.id,
    Job.owner,
    Job.channel,
    Job.thread_ts,
    Job.last_event_seq,
    Job.last_step,
    Job.max_steps,
    Job.last_loss,
    Job.eta_seconds,
    Job.output_uri,
    Job.outcome,
    Job.message,
    Job.progress_window,
    Job.state,
    Job.checkpoint_uri,
    Job.plan,
    Job.last_checkpoint_uri,
    Job.last_checkpoint_step,
    Job.run_id,
)


def ingest_many(
    eng: EngineContext,
    batch: dict[str, list[dict[str, Any]]],
    windows: dict[str, str] | None = None,
    verified_by: dict[str, str] | None = None,
) -> tuple[set[str], set[str]]:
    """``ingest`` for many jobs' progress items at once: one read of the jobs and of the stored events
    the batch could repeat, one executemany for the new events and one for the jobs' progress (and
    ``windows``, each job's read, recorded with its events), one commit. Only the items that will be
    stored are validated. A job whose events would replace stored ones (a resumed run renumbering)
    goes through ``ingest``. ``verified_by``: the run whose key verified each job's items; a job whose
    current run is another one once its row is locked stores nothing. Returns (jobs with new events, jobs
    whose window was recorded)."""
    if not batch:
        return set(), set()
    windows = windows or {}
    verified_by = verified_by or {}
    now = eng.now()
    single: dict[str, list[RunnerEvent]] = {}  # jobs for the exact path, one by one
    new_by_job: dict[str, list[RunnerEvent]] = {}
    links: dict[str, int] = {}  # links dropped per job
    jobs: dict[str, Any] = {}  # plain rows of the progress columns
    with eng.session() as s:
        ids = sorted(batch)
        for k in range(0, len(ids), 500):
            chunk = ids[k : k + 500]
            jobs.update(_lock_progress_rows(s, chunk))
            stored = _stored_timestamps(s, batch, chunk, jobs)
            for jid in chunk:
                job = jobs.get(jid)
                if not _still_writable(job, jid, verified_by):
                    continue
                fresh, exact = _fresh_items(jid, batch[jid], stored)
                if exact:
                    single[jid] = valid_events(jid, batch[jid])
                elif fresh:
                    events, links[jid] = _bounded(eng, job, valid_events(jid, fresh))
                    if events:
                        new_by_job[jid] = events
        if not _store_batch(eng, s, jobs, new_by_job, windows, now):
            # another supervisor or a push stored some of them: the exact path, job by job
            single.update(new_by_job)
            new_by_job = {}
    changed = set(new_by_job)
    written = {jid for jid in new_by_job if windows.get(jid)}
    for jid, n in links.items():
        if jid in new_by_job:
            integrity.report_refused(eng, jid, Counter(link=n))
    _announce_batch(eng, jobs, new_by_job)
    for jid, events in single.items():
        if events and ingest(eng, jid, events, run_id=verified_by.get(jid)):
            changed.add(jid)
    return changed, written


def _lock_progress_rows(s: Any, chunk: list[str]) -> dict[str, Any]:
    """The progress columns of these jobs, their rows locked first, in id order (as S.lock_job does for one
    job): another supervisor or a push on the same jobs waits here, then reads what this one stored."""
    q = select(*_PROGRESS_COLUMNS).where(Job.id.in_(chunk)).order_by(Job.id)
    if s.get_bind().dialect.name == "sqlite":
        s.execute(
            update(Job)
            .where(Job.id.in_(chunk))
            .values(updated_at=Job.updated_at)
            .execution_options(synchronize_session=False)
        )
    else:
        q = q.with_for_update()
    return {j.id: j for j in s.execute(q).all()}


def _stored_timestamps(
    s: Any, batch: dict[str, list[dict[str, Any]]], chunk: list[str], jobs: dict[str, Any]
) -> dict[tuple[str, int], float]:
    """The timestamps of the stored events the batch could repeat: seqs at or below each job's last stored
    seq, by (job, seq)."""
    low = {
        jid: min(i["seq"] for i in batch[jid])
        for jid in chunk
        if jid in jobs and min(i["seq"] for i in batch[jid]) <= jobs[jid].last_event_seq
    }
    if not low:
        return {}
    ts_col = RunnerEventRecord.payload["timestamp"].as_float()
    q = select(RunnerEventRecord.job_id, RunnerEventRecord.seq, ts_col).where(
        RunnerEventRecord.job_id.in_(sorted(low)), RunnerEventRecord.seq >= min(low.values())
    )
    return {(jid, seq): float(ts or 0.0) for jid, seq, ts in s.execute(q)}


def _still_writable(job: Any, jid: str, verified_by: dict[str, str]) -> bool:
    """Whether the job may still take events: it exists, is not final (its outcome is settled), and the run
    that verified them is still its current one."""
    if job is None or job.state in S.FINAL:
        return False
    return jid not in verified_by or job.run_id == verified_by[jid]


def _fresh_items(
    jid: str, items: list[dict[str, Any]], stored: dict[tuple[str, int], float]
) -> tuple[list[dict[str, Any]], bool]:
    """The items not stored yet, and whether the job needs the exact path instead: an item past the
    stored-events cap, or one that replaces a stored event (a resumed run renumbering). The same event
    again is skipped."""
    fresh = []
    for item in items:
        if item["seq"] >= integrity.MAX_STORED_EVENTS:  # past the cap: the exact path decides
            return [], True
        old = stored.get((jid, item["seq"]))
        if old is None:
            fresh.append(item)
        elif old < item["timestamp"] - 1e-6:  # replaces a stored event: the exact path
            return [], True
    return fresh, False


def _store_batch(
    eng: EngineContext,
    s: Any,
    jobs: dict[str, Any],
    new_by_job: dict[str, list[RunnerEvent]],
    windows: dict[str, str],
    now: float,
) -> bool:
    """Store the new events and the jobs' progress (and read windows) in one commit, with what their runs
    vouch for acknowledged; False when another writer stored some of them first (rolled back)."""
    rows: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for jid, new in new_by_job.items():
        job = jobs[jid]
        if job.run_id and any(e.manifest_sha256 for e in new):  # checkpoints and outputs it vouches for
            runs.acknowledge(s, job, job.run_id, new, output_prefix=_output_prefix(eng, job), now=now)
        rows.extend(_event_row(jid, e, now) for e in new)
        window = windows.get(jid) or job.progress_window
        updates.append(
            {
                "id": jid,
                "last_event_at": now,
                "updated_at": now,
                "progress_window": window,
                **_progress_fields(job, new),
            }
        )
    try:
        if rows:
            rows.sort(key=lambda r: (r["job_id"], r["seq"]))
            s.execute(insert(RunnerEventRecord.__table__), rows)  # type: ignore[attr-defined]
            update_each(s, Job, updates)
        s.commit()
    except IntegrityError:
        s.rollback()
        return False
    return True


def _event_row(jid: str, e: RunnerEvent, now: float) -> dict[str, Any]:
    return {
        "job_id": jid,
        "seq": e.seq,
        "kind": e.kind.value,
        "step": e.step,
        "loss": e.loss,
        "at": now,
        "payload": e.model_dump(mode="json"),
    }


def _announce_batch(
    eng: EngineContext, jobs: dict[str, Any], new_by_job: dict[str, list[RunnerEvent]]
) -> None:
    """``_announce`` for each job's new events; a job whose events carry measurements is read whole first
    (recording them needs the whole row)."""
    for jid, new in new_by_job.items():
        job = jobs[jid]
        if any(e.kind.value in MEASURED and e.metrics for e in new):
            with eng.session() as s:
                job = s.get(Job, jid) or job
        _announce(eng, job, new)


def _in_folder(uri: str | None, job: Job, step: int | None = None) -> bool:
    """A checkpoint the runner announced lies in the checkpoint folder of the job's current run (never
    elsewhere), named by its step when ``step`` is given."""
    folder = (job.checkpoint_uri or "").rstrip("/")
    if step is not None:
        return bool(folder and uri == f"{folder}/checkpoint-{step}")
    return bool(uri and folder and uri.startswith(folder + "/checkpoint-") and ".." not in uri)


def _progress_fields(job: Job, new: list[RunnerEvent]) -> dict[str, Any]:
    """The job's progress columns after these new events (in seq order: the newest information wins)."""
    f: dict[str, Any] = {
        "last_event_seq": max(job.last_event_seq, new[-1].seq),
        "last_step": job.last_step,
        "max_steps": job.max_steps,
        "last_loss": job.last_loss,
        "eta_seconds": job.eta_seconds,
        "output_uri": job.output_uri,
        "outcome": job.outcome,
        "message": job.message,
        "last_checkpoint_uri": job.last_checkpoint_uri,
        "last_checkpoint_step": job.last_checkpoint_step,
    }
    for e in new:
        f["last_step"] = e.step
        # A checkpoint counts once acknowledged: in the current run's folder, with its manifest's digest
        # (bot/engine/record/runs.py records it in the same transaction).
        acked = e.manifest_sha256 is not None and getattr(job, "run_id", None) is not None
        kinds = (EventKind.checkpoint, EventKind.preempted, EventKind.budget)
        if e.kind in kinds and acked and _in_folder(e.checkpoint_uri, job, e.step):
            f["last_checkpoint_uri"], f["last_checkpoint_step"] = e.checkpoint_uri, e.step
        if e.max_steps:
            f["max_steps"] = e.max_steps
        if e.loss is not None:
            f["last_loss"] = e.loss
        if e.eta_seconds is not None:
            f["eta_seconds"] = e.eta_seconds
        if e.output_uri:
            f["output_uri"] = e.output_uri
        if e.kind.value in TERMINAL:
            f["outcome"] = e.kind.value
            note = _outcome_note(e)
            if note:
                f["message"] = note
    return f
