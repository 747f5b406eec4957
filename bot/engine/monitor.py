"""Follow a running job: runner events by push and by pull, the instance's status, heartbeats, caps.

Push: the runner POSTs each RunnerEvent with the job's bearer token (checked in constant time
against the stored hash). Pull: the runner also writes every event to ``progress.json`` beside its
checkpoints, which the bot reads with fsspec (a bot in Socket Mode has no public URL). Both paths go
through ``ingest``, which keeps an event once per (job, seq), under the job's row lock (processes too).

Preemption is read from the provider's status (preempted, stopped, exited with 75, gone) and, as a
fallback, from missing heartbeats: a running instance with no event for ``heartbeat_timeout_s``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from bot.engine import states as S
from bot.engine.events import EngineEventKind
from bot.engine.launch import token_hash
from bot.providers.base import InstanceStatus, NotFoundError, ProviderError
from runner.spec import EXIT_OK, EXIT_PREEMPTED, EventKind, RunnerEvent, parse_progress, progress_uri
from store.models import Instance as InstanceRow
from store.models import Job, RunnerEventRecord

if TYPE_CHECKING:
    from bot.engine.service import Engine

log = logging.getLogger(__name__)

# 75: the runner saved and exited on SIGTERM; 143/137: killed by SIGTERM/SIGKILL from outside (a reclaim
# that came before the runner's handler was installed, or after its grace) - both worth a relaunch.
PREEMPTED_EXIT_CODES = frozenset({EXIT_PREEMPTED, 128 + 15, 128 + 9})
TERMINAL = {EventKind.finished.value, EventKind.plateau.value, EventKind.failed.value}


def token_ok(job: Job, token: str | None) -> bool:
    if not token or not job.token_hash:
        return False
    return hmac.compare_digest(token_hash(token), job.token_hash)


def ingest(eng: Engine, job_id: str, events: Iterable[RunnerEvent]) -> int:
    """Store new events (dedupe by seq), update the job's progress and publish; returns how many were new."""
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
    with eng.session() as s:
        # Two supervisors (or a push and a pull) on one job take turns from here to the commit: the
        # second one reads the first one's rows as known, so it stores and posts nothing twice.
        job = S.lock_job(s, job_id)
        if job is None:
            return 0
        known = _known(s, job_id, seqs)
        for e in events:
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
        fields: dict[str, Any] = {"last_event_at": now, "updated_at": now}
        fields["last_event_seq"] = max(job.last_event_seq, new[-1].seq)
        for e in new:  # in seq order: the newest information wins
            fields["last_step"] = e.step
            if e.max_steps:
                fields["max_steps"] = e.max_steps
            if e.loss is not None:
                fields["last_loss"] = e.loss
            if e.eta_seconds is not None:
                fields["eta_seconds"] = e.eta_seconds
            if e.output_uri:
                fields["output_uri"] = e.output_uri
            if e.kind.value in TERMINAL:
                fields["outcome"] = e.kind.value
                note = _outcome_note(e)
                if note:
                    fields["message"] = note
        s.execute(update(Job).where(Job.id == job_id).values(**fields))
        try:
            s.commit()
        except IntegrityError:  # a concurrent push/pull stored the same seq: the other one publishes
            s.rollback()
            return 0
        owner_job = job
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
        if e.kind.value in TERMINAL and e.metrics:
            from bot.engine.calibration import record_run

            try:
                record_run(eng, owner_job, e)  # what this run measured teaches the planner (issue 11)
            except Exception as exc:  # noqa: BLE001 - a measurement must never stop the job's bookkeeping
                log.warning("job %s: measurements not recorded: %s", job_id, exc)
        kind = {
            EventKind.progress: EngineEventKind.progress,
            EventKind.checkpoint: EngineEventKind.checkpoint,
            EventKind.plateau: EngineEventKind.plateau,
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
    return len(new)


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
    notes = [f"Pushed to the Hub: {e.hub_url}"] if e.hub_url else []
    if e.message and not e.message.startswith("stopped: the loss"):
        notes.append(e.message)
    return "; ".join(notes)[:1000] or None


def read_progress(uri: str) -> list[RunnerEvent]:
    """Read the runner's progress object (missing or half-written = nothing new this time)."""
    import fsspec

    try:
        with fsspec.open(uri, "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, OSError):
        return []
    try:
        return parse_progress(raw)
    except ValueError:
        return []


def pull(eng: Engine, job: Job) -> int:
    uri = job.checkpoint_uri
    if not uri:
        return 0
    return ingest(eng, job.id, read_progress(progress_uri(uri)))


def observe(eng: Engine, row: InstanceRow) -> tuple[str, int | None]:
    """Ask the provider: (verdict, exit code), verdict running|provisioning|unknown|preempted|exited|gone.

    Provider trouble (down, rate limited) returns "error": nothing is decided on a failed call.
    """
    provider = eng.providers.get(row.provider)
    if provider is None:
        return "error", None  # not configured in this process: decide nothing
    now = eng.now()
    try:
        inst = provider.status(row.provider_instance_id)
    except NotFoundError:
        return "gone", None
    except ProviderError as exc:
        log.warning("status of %s/%s failed: %s", row.provider, row.provider_instance_id, exc)
        return "error", None
    with eng.session() as s:
        s.execute(
            update(InstanceRow)
            .where(InstanceRow.id == row.id)
            .values(
                status=str(inst.status),
                raw_status=inst.raw_status,
                exit_code=inst.exit_code,
                last_seen_at=now,
            )
        )
        s.commit()
    st = inst.status
    if st == InstanceStatus.terminated:
        return "gone", inst.exit_code
    if st == InstanceStatus.preempted:
        return "preempted", inst.exit_code
    if st == InstanceStatus.exited:
        if inst.exit_code in PREEMPTED_EXIT_CODES:
            return "preempted", inst.exit_code
        return "exited", inst.exit_code
    if st == InstanceStatus.stopped:
        return "preempted", inst.exit_code  # a stop we did not ask for (Vast outbid pauses the instance)
    if st == InstanceStatus.provisioning:
        return "provisioning", None
    if st == InstanceStatus.running:
        return "running", None
    return "unknown", None


__all__ = ["EXIT_OK", "ingest", "observe", "pull", "read_progress", "token_ok", "S"]
