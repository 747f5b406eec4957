"""Ending an instance or a job: terminate, confirm gone, then record state and final spend.

An instance is forgotten (``ended_at`` set) only once its provider confirms it is gone; until then
it keeps billing in our books too, and the reaper tries again on every tick. The finish sequence
records the output first, then terminates, then commits the final state with the final spend, so a
crash anywhere in it is finished by the next engine from what the database and provider say.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from bot.engine.crash import crashpoint
from bot.engine.events import EngineEventKind
from bot.engine.record import states as S
from bot.engine.record.spend import job_instances, job_spend, roll_up
from bot.money import money
from store.models import Instance as InstanceRow
from store.models import Job

if TYPE_CHECKING:
    from sqlmodel import Session

    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)


def terminate_instance(eng: EngineContext, row: InstanceRow, *, reason: str, actor: str = "engine") -> bool:
    """Terminate at the provider and, once confirmed gone, close the row; True when closed."""
    if row.ended_at is not None:
        return True
    billed_until = _gone_at_provider(eng, row)
    if billed_until is None:
        return False
    close_instance(eng, row, reason=reason, actor=actor, at=billed_until)
    return True


def _gone_at_provider(eng: EngineContext, row: InstanceRow) -> float | None:
    """Terminate at the provider until it confirms the instance is gone (or the deadline passes): when it
    stopped billing (``billed_end``), None when not confirmed."""
    from bot.providers.lifecycle import ensure_terminated

    provider = eng.supervisable.get(row.provider)
    if provider is None:
        log.error("cannot terminate %s/%s: provider not configured", row.provider, row.provider_instance_id)
        return None
    exited = _process_exit(provider, row)  # before the terminate: afterwards the record is gone
    sent: list[float] = []
    try:
        deadline = eng.limits.terminate_deadline_s
        if not ensure_terminated(
            provider, row.provider_instance_id, deadline_s=deadline, sent=sent, wall=eng.now
        ):
            return None
    except Exception as exc:  # noqa: BLE001 - retried on the next tick; never lose track of the row
        log.warning("terminate %s/%s failed: %s", row.provider, row.provider_instance_id, exc)
        return None
    return billed_end(row, sent[-1] if sent else eng.now(), eng.now(), exited_at=exited)


def _process_exit(provider: object, row: InstanceRow) -> float | None:
    """When an instance that is a process on this machine (the local provider) ended, as its provider knows
    it; None for anything else (a cloud machine bills until it is terminated, whatever its runner did)."""
    if getattr(getattr(provider, "capabilities", None), "kind", None) != "process":
        return None
    try:
        inst = provider.status(row.provider_instance_id)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - no exit time: billed until the terminate call
        return None
    exited = getattr(inst, "exited_at", None)
    return exited.timestamp() if exited is not None else None


def billed_end(
    row: InstanceRow, terminate_sent: float, confirmed: float, *, exited_at: float | None = None
) -> float:
    """When a terminated instance stopped billing, as the books record it: the provider bills until the
    terminate call it confirmed (Vast: start to destroy), not until its confirmation reached us (a poll
    later: seconds more); a process on this machine (``exited_at``, from its provider) until it ended.
    Bounded by what was observed: never before the instance was last seen running (or launched), never after
    the confirmation. Pure."""
    seen_running = row.last_seen_at if row.status == "running" and row.last_seen_at else row.launched_at
    end = terminate_sent if exited_at is None else min(exited_at, terminate_sent)
    return min(confirmed, max(end, seen_running, row.launched_at))


def close_instance(
    eng: EngineContext, row: InstanceRow, *, reason: str, actor: str = "engine", at: float | None = None
) -> None:
    now = eng.now() if at is None else at
    with eng.session() as s:
        job = S.lock_job(s, row.job_id) if row.job_id else None  # in turn with its final transition
        closed = _close_row(s, row, reason=reason, actor=actor, at=now)
        if closed and job is not None and job.state in S.FINAL:  # it billed until now: the job's spend has it
            s.execute(update(Job).where(Job.id == job.id).values(spend=job_spend(s, job.id, eng.now())))
        s.commit()


def _close_row(s: Session, row: InstanceRow, *, reason: str, actor: str, at: float) -> bool:
    """Mark the row gone (once: True for the call that did it) with its audit record; commits nothing.
    The caller holds the row's job lock (S.lock_job), as the final transition does."""
    res = s.execute(
        update(InstanceRow)
        .where(InstanceRow.id == row.id, InstanceRow.ended_at.is_(None))
        .values(ended_at=at, status="terminated", end_reason=reason)
    )
    if res.rowcount != 1:
        return False
    S.audit(
        s,
        actor=actor,
        action="instance-gone",
        job_id=row.job_id,
        at=at,
        provider=row.provider,
        instance_id=row.provider_instance_id,
        reason=reason,
    )
    row.ended_at = at
    return True


def open_instances(eng: EngineContext, job_id: str) -> list[InstanceRow]:
    with eng.session() as s:
        return _open_rows(s, job_id)


def _open_rows(s: Session, job_id: str) -> list[InstanceRow]:
    return list(
        s.execute(
            select(InstanceRow)
            .where(InstanceRow.job_id == job_id, InstanceRow.ended_at.is_(None))
            .order_by(InstanceRow.id)
        ).scalars()
    )


def finish(
    eng: EngineContext,
    job_id: str,
    final: str,
    *,
    reason: str | None,
    actor: str = "engine",
    message: str | None = None,
) -> bool:
    """Finish the job: record output, terminate and confirm, final state + spend. True when final."""
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state in S.FINAL:
            return False
    result = _result_fields(eng, job, final, reason)  # reads storage: before any lock is taken
    rows = _record_decision(eng, job_id, final, reason, message, result)
    if rows is None:
        return False
    crashpoint("finish.before_terminate")
    # Terminate and confirm at the provider first; each row is closed as soon as its instance is confirmed
    # gone, at the moment its provider stopped billing, and the final state is committed below. A crash in
    # between leaves closed rows: the restarted engine's finish bills nothing more for them (issue 38: it
    # found the instance gone and billed the seconds the bot was down).
    gone: list[tuple[InstanceRow, float]] = []
    for row in rows:
        billed_until = _gone_at_provider(eng, row)
        if billed_until is not None:
            close_instance(eng, row, reason=_end_reason(final, reason), actor=actor, at=billed_until)
            gone.append((row, billed_until))
    all_gone = len(gone) == len(rows)
    crashpoint("finish.after_terminate")
    if all_gone and (final == S.SUCCEEDED or (final == S.STOPPED and reason == "plateau")):
        # The bot pushes the output its run signed (bot/engine/outcome/hub_push.py), before the job is final
        # (its thread hears how the push went with the finish). Another finisher pushing it now: the next
        # tick.
        from bot.engine.outcome import hub_push

        if not hub_push.push(eng, job_id):
            return False
    ended = _commit_final(eng, job_id, final, reason, actor, message, gone, all_gone)
    if ended is None:
        return False
    owner_job, spend = ended
    crashpoint("finish.after_commit")
    if owner_job.output_uri and final in (S.SUCCEEDED, S.STOPPED):  # the card says what the ledger billed
        from bot.engine.outcome.billed_card import record_billed_cost

        record_billed_cost(owner_job.output_uri, spend)
    _announce_finish(eng, job_id, owner_job, final, reason, message, spend)
    return True


def _record_decision(
    eng: EngineContext,
    job_id: str,
    final: str,
    reason: str | None,
    message: str | None,
    result: dict[str, object],
) -> list[InstanceRow] | None:
    """Record the decision (and the output) before touching the instance, so that an engine restarted after
    a crash in this sequence finishes the same way instead of "recovering"; the job's open instance rows,
    None when the job is gone or already final."""
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.state in S.FINAL:
            return None
        fields: dict[str, object] = dict(result)
        outcome = {S.SUCCEEDED: "finished", S.FAILED: "failed"}.get(final)
        if final == S.STOPPED and reason == "plateau":
            outcome = "plateau"
        if outcome and job.outcome is None:
            fields["outcome"] = outcome
        if final == S.STOPPED and outcome is None and job.stop_requested_at is None:
            fields.update(stop_requested_at=eng.now(), stop_reason=reason)
        if message and not job.message:
            fields["message"] = message
        if fields:
            s.execute(update(Job).where(Job.id == job_id).values(**fields))
        rows = _open_rows(s, job_id)
        if fields:
            s.commit()
    return rows


def _commit_final(
    eng: EngineContext,
    job_id: str,
    final: str,
    reason: str | None,
    actor: str,
    message: str | None,
    gone: list[tuple[InstanceRow, float]],
    all_gone: bool,
) -> tuple[Job, float] | None:
    """Close the rows of the instances confirmed gone and, when all are, move the job to ``final`` with its
    spend and ledger lines, in one transaction under the job's row lock; (the job, its spend), or None when
    the job stays active (the next tick tries again)."""
    end_reason = _end_reason(final, reason)
    now = eng.now()
    with eng.session() as s, s.no_autoflush:  # the audit rows go in one INSERT at the commit
        job = S.lock_job(s, job_id)  # in turn with close_instance and every other transition
        closed = [_close_row(s, row, reason=end_reason, actor=actor, at=at) for row, at in gone]
        if job is None or not all_gone or job.state not in S.TRANSITIONS or not S.allowed(job.state, final):
            # not confirmed gone: the job stays active and the next tick tries again
            if any(closed) and job is not None and job.state in S.FINAL:  # it billed until now
                s.execute(update(Job).where(Job.id == job_id).values(spend=job_spend(s, job_id, now)))
            s.commit()
            return None
        insts = job_instances(s, job_id)  # the row is locked: no instance of it closes meanwhile
        spend = job_spend(s, job_id, now, insts)
        fields: dict[str, object] = {"finished_at": now, "claim_id": None}
        if final == S.STOPPED:
            fields["stop_reason"] = reason
        if message:
            fields["message"] = message
        if not S.transition(
            s,
            job_id,
            job.state,
            final,
            actor=actor,
            now=now,
            reason=reason,
            commit=False,
            spend=spend,
            **fields,
        ):
            s.rollback()
            return None
        roll_up(s, now, since=0.0, job_id=job_id, job_rows=(job, insts))  # this job's lines: O(its instances)
        s.commit()
    return job, spend


def _end_reason(final: str, reason: str | None) -> str:
    """An instance row's end reason when its job ends in ``final``."""
    return final if final != S.STOPPED else f"stopped:{reason}"


def _announce_finish(
    eng: EngineContext,
    job_id: str,
    job: Job,
    final: str,
    reason: str | None,
    message: str | None,
    spend: float,
) -> None:
    """Tell the job's thread how it ended: its output and spend, or why it stopped or failed and the
    checkpoint it can resume from."""
    kind = {S.SUCCEEDED: EngineEventKind.finished, S.FAILED: EngineEventKind.failed}.get(final)
    if final == S.STOPPED:
        kind = EngineEventKind.plateau if reason == "plateau" else EngineEventKind.stopped
    assert kind is not None
    note = f" {job.message}." if job.message and kind in _DONE else ""
    output = f" Output: {job.output_uri}." if job.output_uri else ""
    left = "" if kind in _DONE else _checkpoint_sentence(job)
    text = {
        EngineEventKind.finished: f"Job {job_id} finished.{output} Spend {money(spend)}.{note}",
        EngineEventKind.plateau: f"Job {job_id} stopped on a loss plateau.{output} "
        f"Spend {money(spend)}.{note}",
        EngineEventKind.failed: f"Job {job_id} failed: {message or reason}. Spend {money(spend)}.{left}",
        EngineEventKind.stopped: f"Job {job_id} stopped ({reason}). Spend {money(spend)}.{left}",
    }[kind]
    eng.publish(
        kind,
        job_id,
        text,
        job=job,
        spend=round(spend, 6),
        reason=reason,
        output_uri=job.output_uri,
        checkpoint_uri=job.last_checkpoint_uri,
        checkpoint_step=job.last_checkpoint_step,
        state=final,
        note=job.message if kind in _DONE else None,
    )


def _result_fields(eng: EngineContext, job: Job, final: str, reason: str | None) -> dict[str, object]:
    """What the job leaves, confirmed on its storage: the output folder the runner reported (or, when its
    event was missed, the usual one if it is there), and the newest complete checkpoint. Never a folder
    that does not exist: a stopped or failed job has no output, its checkpoint is its result."""
    from bot.engine.record import results, runs

    fields: dict[str, object] = {}
    if job.output_uri is None and (final == S.SUCCEEDED or (final == S.STOPPED and reason == "plateau")):
        from bot.engine.launching.launch import storage_root

        last = runs.latest(eng, job.id)
        root = storage_root(eng, job.id)
        default = runs.output_folder(runs.run_root(root, last.id)) if last is not None else f"{root}/output"
        usual = (job.plan or {}).get("output_uri") or default
        if results.exists(usual):
            fields["output_uri"] = usual
    # Only a checkpoint the bot acknowledged from the run that wrote it (bot/engine/record/runs.py), still
    # there.
    newest = runs.newest_acknowledged(eng, job.id)
    if newest is not None:
        fields.update(last_checkpoint_uri=newest.uri, last_checkpoint_step=newest.step)
    elif job.last_checkpoint_uri and not results.exists(job.last_checkpoint_uri):
        fields.update(last_checkpoint_uri=None, last_checkpoint_step=None)  # announced, then pruned or lost
    return fields


def _checkpoint_sentence(job: Job) -> str:
    """' Latest checkpoint: URI (step N): a loadable adapter; `resume JOB` continues from it.' or ''."""
    if not job.last_checkpoint_uri:
        return " No checkpoint was saved."
    what = "a loadable model" if (job.request or {}).get("method") == "full" else "a loadable PEFT adapter"
    return (
        f" Latest checkpoint: {job.last_checkpoint_uri} (step {job.last_checkpoint_step}), {what}; "
        f"`resume {job.id}` continues from it."
    )


_DONE = (EngineEventKind.finished, EngineEventKind.plateau)
