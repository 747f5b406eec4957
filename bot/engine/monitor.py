"""Follow a running job: runner events by push and by pull, the instance's status, heartbeats, caps.

Push: the runner POSTs each RunnerEvent with the job's bearer token (checked in constant time
against the stored hash). Pull: the runner also writes every event to ``progress.json`` beside its
checkpoints, which the bot reads with fsspec (a bot in Socket Mode has no public URL). Both paths go
through ``ingest``, which keeps an event once per (job, seq), under the job's row lock (processes too).

Whatever the path, an event counts only when the job's own key signed it (bot/engine/integrity.py:
another job's host that can write this job's progress object forges nothing), only while the job is not
final, within the size caps, and with its links pointing where this job's may; what is refused is told
once in the job's thread.

Preemption is read from the provider's status (preempted, stopped, exited with 75, gone) and, as a
fallback, from missing heartbeats: a running instance with no event for ``heartbeat_timeout_s``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from bot.engine import integrity
from bot.engine import states as S
from bot.engine.events import EngineEventKind
from bot.engine.launch import storage_root, token_hash
from bot.providers.base import Instance, InstanceStatus, NotFoundError, ProviderError
from runner.integrity import EVENT, verify
from runner.spec import (
    EXIT_CREDENTIALS,
    EXIT_OK,
    EXIT_PREEMPTED,
    EventKind,
    RunnerEvent,
    parse_progress,
    progress_uri,
    readable_events,
)
from store.db import update_each, update_in
from store.models import Instance as InstanceRow
from store.models import Job, RunnerEventRecord

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

try:  # a first read parses every object whole: orjson does it in a quarter of json's time
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; plain json still works
    _loads = json.loads

log = logging.getLogger(__name__)

# 75: the runner saved and exited on SIGTERM; 77: it saved and exited before its storage credentials
# expired (not renewed; a relaunch gets fresh ones); 143/137: killed by SIGTERM/SIGKILL from outside (a
# reclaim that came before the runner's handler was installed, or after its grace) - all worth a relaunch.
PREEMPTED_EXIT_CODES = frozenset({EXIT_PREEMPTED, EXIT_CREDENTIALS, 128 + 15, 128 + 9})
TERMINAL = {EventKind.finished.value, EventKind.plateau.value, EventKind.failed.value,
            EventKind.out_of_memory.value}
MEASURED = {EventKind.finished.value, EventKind.plateau.value}  # runs whose metrics teach the planner


def token_ok(job: Job, token: str | None) -> bool:
    if not token or not job.token_hash:
        return False
    return hmac.compare_digest(token_hash(token), job.token_hash)


def receive_pushed(eng: EngineContext, job: Job, payload: dict[str, Any] | bytes | str) -> bool:
    """A pushed event of a job whose token matched: stored when the job is not final and the job's key
    signed it; False otherwise (what was refused is told once in the thread)."""
    if job.state in S.FINAL:
        return False
    if not isinstance(payload, dict):
        try:
            payload = json.loads(payload)
        except ValueError:
            return False
    events, refused = integrity.signed_events(integrity.job_key(eng, job.id), job.id, [payload])
    integrity.report_refused(eng, job.id, refused)
    if not events:
        return False
    ingest(eng, job.id, events)
    return True


def ingest(eng: EngineContext, job_id: str, events: Iterable[RunnerEvent]) -> int:
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
    refused: Counter[str] = Counter()
    with eng.session() as s:
        # Two supervisors (or a push and a pull) on one job take turns from here to the commit: the
        # second one reads the first one's rows as known, so it stores and posts nothing twice.
        job = S.lock_job(s, job_id)
        if job is None or job.state in S.FINAL:
            return 0  # a final job's outcome is settled: nothing a runner says changes it
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


def _bounded(eng: EngineContext, job: Any, events: list[RunnerEvent]) -> tuple[list[RunnerEvent], int]:
    """The events cut to their caps, with every link that does not point where this job's may dropped;
    how many links were dropped."""
    expected = None  # most events carry no link: where this job's may point is worked out on the first
    out, dropped = [], 0
    for e in events:
        e = integrity.cap_event(e)
        if e.output_uri or e.checkpoint_uri or e.wandb_url or e.hub_url:
            if expected is None:
                expected = integrity.expected_of(eng, job, f"{storage_root(eng, job.id)}/output")
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
    notes = [f"Pushed to the Hub: {e.hub_url}"] if e.hub_url else []
    if e.message and not e.message.startswith("stopped: the loss"):
        notes.append(e.message)
    return "; ".join(notes)[:1000] or None


def read_progress(uri: str) -> list[RunnerEvent]:
    """Read the runner's progress object (missing or half-written = nothing new this time)."""
    raw = read_raw(uri)
    if raw is None:
        return []
    try:
        return parse_progress(raw)
    except ValueError:
        return []


def read_raw(uri: str) -> bytes | None:
    """The progress object's bytes, or None when it is not there (yet). A plain path is read without
    fsspec: a tick reads one object per running job, and fsspec's per-call overhead is most of it."""
    limit = integrity.MAX_PROGRESS_BYTES + 1  # a larger object is not the runner's: not read further
    if "://" not in uri or uri.startswith("file://"):
        try:
            with open(uri.removeprefix("file://"), "rb") as fh:
                return fh.read(limit)
        except OSError:
            return None
    import fsspec

    try:
        with fsspec.open(uri, "rb") as fh:
            return fh.read(limit)
    except (FileNotFoundError, OSError):
        return None


def pull(eng: EngineContext, job: Job) -> int:
    """Ingest what the runner wrote to its progress object; an object this process has already ingested
    byte for byte is not parsed or looked up again (at 10,000 running jobs most are unchanged)."""
    uri = job.checkpoint_uri
    if not uri:
        return 0
    return pull_raw(eng, job.id, read_raw(progress_uri(uri)))


def pull_raw(eng: EngineContext, job_id: str, raw: bytes | None) -> int:
    """Ingest one progress object's bytes (already-ingested objects and events are skipped)."""
    refused: Counter[str] = Counter()
    parsed = _new_events(eng, job_id, raw, refused=refused)
    integrity.report_refused(eng, job_id, refused)
    if parsed is None:
        return 0
    items, window = parsed
    events = _valid_events(job_id, items)
    new = ingest(eng, job_id, events) if events else 0
    eng.memory.progress_seen[job_id] = window
    return new


Window = tuple[str, int, int, float]  # (digest, first seq, last seq, newest runner timestamp) of a read


def window_text(window: Window) -> str:
    """The window as stored in ``jobs.progress_window``."""
    return f"{window[0]} {window[1]} {window[2]} {window[3]!r}"


def parse_window(text: str | None) -> Window | None:
    try:
        digest, first, last, newest = (text or "").split(" ")
        return digest, int(first), int(last), float(newest)
    except ValueError:
        return None  # none stored, or not ours: the object is read whole and checked


def _new_events(
    eng: EngineContext,
    job_id: str,
    raw: bytes | None,
    stored: str | None = None,
    *,
    refused: Counter[str] | None = None,
) -> tuple[list[dict[str, Any]], Window] | None:
    """The event objects of a progress object that have not been stored yet as far as the last read
    knows, and the object's window to remember once they are stored. None: nothing to do (no object,
    the same bytes as last time, or half-written). The items are not validated here: most of a first
    read repeats stored events, and ``ingest_many`` validates only the ones it will store.

    The last read is this process's, else the one recorded in ``jobs.progress_window`` (``stored``)
    by whichever process stored it. The runner keeps its last 200 events in the object; an event
    whose seq lies inside the last read's window and is not newer than that read's newest event was
    in that read, which was stored: skipped here. A resumed run renumbering from its checkpoint
    writes *newer* events under known seqs; those pass and are checked against the stored ones.

    Only items this job's key signed count, for the window too (bot/engine/integrity.py): a forged item
    with a huge seq or a future timestamp would otherwise hide the job's real events; the others are
    counted in ``refused``."""
    if raw is None:
        return None
    refused = Counter() if refused is None else refused
    if len(raw) > integrity.MAX_PROGRESS_BYTES:
        refused["object_too_large"] += 1
        return None
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    seen = eng.memory.progress_seen.get(job_id) or parse_window(stored)
    if seen is not None and seen[0] == digest:
        eng.memory.progress_seen[job_id] = seen
        return None
    key = integrity.job_key(eng, job_id)
    items = _tail(raw, seen, key) if seen is not None else None
    whole = items is None
    if items is None:
        try:
            obj = _loads(raw)
            items = obj["events"]
            if not isinstance(items, list):
                raise TypeError
        except (ValueError, TypeError, KeyError):
            return None
    signed: list[dict[str, Any]] = []
    for item in items:  # each item's MAC checked once, here
        if not isinstance(item, dict):
            continue
        why = integrity.refusal(key, item)
        if why:
            refused[why] += 1
        elif _plain(item):
            signed.append(item)  # (signed, but not the runner's plain shape: nothing a runner writes)
    if whole:
        first, last = min((i["seq"] for i in signed), default=0), -1
    else:  # the object slid forward from the previous read: its older events were in that read
        first, last = seen[1], seen[2]  # type: ignore[index]
    newest = seen[3] if seen is not None else 0.0
    out: list[dict[str, Any]] = []
    for item in signed:
        seq, ts = item["seq"], item["timestamp"]
        last, newest = max(last, seq), max(newest, float(ts))
        if seen is not None and seen[1] <= seq <= seen[2] and ts <= seen[3]:
            continue  # in the previous read, which was stored
        out.append(item)
    if last < 0 and seen is not None:
        last = seen[2]
    out.sort(key=lambda i: i["seq"])
    return out, (digest, first, last, newest)


def _plain(item: dict[str, Any]) -> bool:
    seq, ts = item.get("seq"), item.get("timestamp")
    return isinstance(seq, int) and not isinstance(seq, bool) and isinstance(ts, int | float) and seq >= 0


def _valid_events(job_id: str, items: list[dict[str, Any]]) -> list[RunnerEvent]:
    """This job's readable events among the items, in seq order."""
    return [e for e in readable_events(items) if e.job_id == job_id]


_EVENT_START = '{"version": '  # how the runner's json.dumps writes each event object's first key


def _tail(raw: bytes, seen: tuple, key: bytes) -> list[dict[str, Any]] | None:
    """The events after the last one the previous read had, parsed from the end of the object without
    decoding the rest (a long run's object holds 200 events, ~70 KB; usually one or two are new).
    None when the object does not look as expected: the caller parses all of it."""
    text = raw.decode("utf-8", errors="replace")
    if not text.rstrip().endswith("]}"):
        return None
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    end = text.rstrip()[:-2].rstrip()
    limit = len(end)
    pos = text.rfind(_EVENT_START, 0, limit)
    while pos != -1 and len(out) <= 50:
        try:
            item, stop = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        if not isinstance(item, dict) or text[stop:limit].strip(" ,\n") != "":
            return None  # not contiguous with the event after it: not the shape expected
        seq, ts = item.get("seq"), item.get("timestamp")
        if (
            isinstance(seq, int)
            and isinstance(ts, int | float)
            and seen[1] <= seq <= seen[2]
            and ts <= seen[3]
            and verify(key, EVENT, item)  # only the job's own event marks where the last read ended
        ):
            out.reverse()
            return out  # this one and everything before it were in the previous read
        out.append(item)
        limit = pos
        pos = text.rfind(_EVENT_START, 0, limit)
    return None


def _stat(uri: str) -> tuple[int, int] | None:
    try:
        st = os.stat(uri.removeprefix("file://"))
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def pull_many(eng: EngineContext, jobs: list[Job]) -> set[str]:
    """Pull every job's progress object (remote objects fetched concurrently) and store what is new in
    one transaction; returns the ids of the jobs that got new events. Each stored read's window goes
    to ``jobs.progress_window`` too, so that a restarted bot starts where this one stopped."""
    uris = {j.id: progress_uri(j.checkpoint_uri) for j in jobs if j.checkpoint_uri}
    stored_windows = {j.id: getattr(j, "progress_window", None) for j in jobs}
    remote = [jid for jid, u in uris.items() if "://" in u and not u.startswith("file://")]
    raws: dict[str, bytes | None] = {}
    if len(remote) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
            raws.update(zip(remote, pool.map(read_raw, [uris[j] for j in remote]), strict=True))
    batch: dict[str, list[dict[str, Any]]] = {}
    windows: dict[str, Window] = {}
    stats = eng.memory.progress_stat
    now = time.monotonic()
    for jid, uri in uris.items():
        if jid not in raws:  # a file on this machine: unchanged (same size and mtime) is not read again,
            stamp = _stat(uri)  # though at least once a minute in case two writes shared an mtime
            known = stats.get(jid)
            if stamp is not None and known is not None and known[:2] == stamp and now - known[2] < 60:
                continue
        raw = raws[jid] if jid in raws else read_raw(uri)
        refused: Counter[str] = Counter()
        parsed = _new_events(eng, jid, raw, stored_windows.get(jid), refused=refused)
        integrity.report_refused(eng, jid, refused)
        if parsed is not None:
            batch[jid], windows[jid] = parsed
        if jid not in raws and stamp is not None:
            stats[jid] = (*stamp, now)
    texts = {jid: window_text(w) for jid, w in windows.items()}
    try:
        changed, written = ingest_many(eng, {k: v for k, v in batch.items() if v}, texts)
    except Exception:  # noqa: BLE001 - the batch failed as a whole: store job by job (exact, slower)
        log.exception("storing runner events in one batch failed; storing them job by job")
        changed, written = set(), set()
        for jid, items in batch.items():
            try:
                events = _valid_events(jid, items)
                if events and ingest(eng, jid, events):
                    changed.add(jid)
            except Exception:  # noqa: BLE001 - one unreadable job never stops the others
                log.exception("job %s: storing runner events failed", jid)
                windows.pop(jid, None)
                stats.pop(jid, None)
    eng.memory.progress_seen.update(windows)
    unrecorded = {j: texts[j] for j in windows if j not in written and texts[j] != stored_windows.get(j)}
    _store_windows(eng, unrecorded)
    return changed


def forget_all_but(eng: EngineContext, running: set[str]) -> None:
    """Drop what this process remembers of the progress objects of jobs no longer running (a
    long-lived bot would otherwise keep an entry for every job it ever followed)."""
    mem = eng.memory
    for table in (mem.progress_seen, mem.progress_stat):
        for jid in table.keys() - running:
            del table[jid]


def _store_windows(eng: EngineContext, texts: dict[str, str]) -> None:
    """Record reads whose events are all stored (nothing new in them, or stored job by job)."""
    if not texts:
        return
    try:
        with eng.session() as s:
            update_each(s, Job, [{"id": jid, "progress_window": w} for jid, w in sorted(texts.items())])
            s.commit()
    except Exception as exc:  # noqa: BLE001 - only a restart's shortcut is lost: it re-reads these objects
        log.warning("recording %d progress windows failed: %s", len(texts), exc)


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
)


def ingest_many(
    eng: EngineContext, batch: dict[str, list[dict[str, Any]]], windows: dict[str, str] | None = None
) -> tuple[set[str], set[str]]:
    """``ingest`` for many jobs' progress items at once: one read of the jobs and of the stored events
    the batch could repeat, one executemany for the new events and one for the jobs' progress (and
    ``windows``, each job's read, recorded with its events), one commit. Only the items that will be
    stored are validated. A job whose events would replace stored ones (a resumed run renumbering)
    goes through ``ingest``. Returns (jobs with new events, jobs whose window was recorded)."""
    if not batch:
        return set(), set()
    windows = windows or {}
    now = eng.now()
    single: dict[str, list[RunnerEvent]] = {}
    new_by_job: dict[str, list[RunnerEvent]] = {}
    links: dict[str, int] = {}  # links dropped per job
    jobs: dict[str, Any] = {}  # plain rows of the progress columns
    with eng.session() as s:
        ids = sorted(batch)
        for k in range(0, len(ids), 500):
            chunk = ids[k : k + 500]
            # The jobs' rows are locked first, in id order (as S.lock_job does for one job): another
            # supervisor or a push on the same jobs waits here, then reads what this one stored.
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
            for j in s.execute(q).all():
                jobs[j.id] = j
            # Stored events the batch could repeat: seqs at or below each job's last stored seq.
            low = {
                jid: min(i["seq"] for i in batch[jid])
                for jid in chunk
                if jid in jobs and min(i["seq"] for i in batch[jid]) <= jobs[jid].last_event_seq
            }
            stored: dict[tuple[str, int], float] = {}
            if low:
                ts_col = RunnerEventRecord.payload["timestamp"].as_float()
                q = select(RunnerEventRecord.job_id, RunnerEventRecord.seq, ts_col).where(
                    RunnerEventRecord.job_id.in_(sorted(low)), RunnerEventRecord.seq >= min(low.values())
                )
                stored = {(jid, seq): float(ts or 0.0) for jid, seq, ts in s.execute(q)}
            for jid in chunk:
                job = jobs.get(jid)
                if job is None or job.state in S.FINAL:
                    continue  # a final job's outcome is settled
                fresh = []
                for item in batch[jid]:
                    if item["seq"] >= integrity.MAX_STORED_EVENTS:  # past the cap: the exact path decides
                        single[jid] = _valid_events(jid, batch[jid])
                        break
                    old = stored.get((jid, item["seq"]))
                    if old is None:
                        fresh.append(item)
                    elif old < item["timestamp"] - 1e-6:
                        # replaces a stored event: the exact path
                        single[jid] = _valid_events(jid, batch[jid])
                        break
                if jid not in single and fresh:
                    events, dropped = _bounded(eng, job, _valid_events(jid, fresh))
                    links[jid] = dropped
                    if events:
                        new_by_job[jid] = events
        rows: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        for jid, new in new_by_job.items():
            job = jobs[jid]
            rows.extend(
                {
                    "job_id": jid,
                    "seq": e.seq,
                    "kind": e.kind.value,
                    "step": e.step,
                    "loss": e.loss,
                    "at": now,
                    "payload": e.model_dump(mode="json"),
                }
                for e in new
            )
            f = _progress_fields(job, new)
            window = windows.get(jid) or job.progress_window
            updates.append(
                {"id": jid, "last_event_at": now, "updated_at": now, "progress_window": window, **f}
            )
        try:
            if rows:
                rows.sort(key=lambda r: (r["job_id"], r["seq"]))
                s.execute(insert(RunnerEventRecord.__table__), rows)  # type: ignore[attr-defined]
                update_each(s, Job, updates)
            s.commit()
        except IntegrityError:  # another supervisor or a push stored some of them: the exact path, job by job
            s.rollback()
            single.update({jid: new_by_job[jid] for jid in new_by_job})
            new_by_job = {}
    changed = set(new_by_job)
    written = {jid for jid in new_by_job if windows.get(jid)}
    for jid, n in links.items():
        if jid in new_by_job:
            integrity.report_refused(eng, jid, Counter(link=n))
    for jid, new in new_by_job.items():
        job = jobs[jid]
        if any(e.kind.value in MEASURED and e.metrics for e in new):
            with eng.session() as s:
                job = s.get(Job, jid) or job  # the measurements need the whole row
        _announce(eng, job, new)
    for jid, events in single.items():
        if events and ingest(eng, jid, events):
            changed.add(jid)
    return changed, written


def _in_folder(uri: str | None, job: Job) -> bool:
    """A checkpoint the runner announced lies in the job's own checkpoint folder (never elsewhere)."""
    folder = (job.checkpoint_uri or "").rstrip("/")
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
        if e.kind in (EventKind.checkpoint, EventKind.preempted) and _in_folder(e.checkpoint_uri, job):
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


def observe(eng: EngineContext, row: InstanceRow) -> tuple[str, int | None]:
    """Ask the provider: (verdict, exit code), verdict running|provisioning|unknown|preempted|exited|gone.

    Provider trouble (down, rate limited) returns "error": nothing is decided on a failed call.
    """
    seen = observe_many(eng, [row])
    return seen[row.id]  # type: ignore[index]


def observe_many(eng: EngineContext, rows: list[InstanceRow]) -> dict[int, tuple[str, int | None]]:
    """The verdicts of many instance rows: one listing per provider, a per-instance ``status`` only for
    a provider without a listing and for a row its listing does not show (just launched, or gone: the
    status call says which). Refreshed statuses are written in one transaction."""
    now = eng.now()
    out: dict[int, tuple[str, int | None]] = {}
    by_provider: dict[str, list[InstanceRow]] = {}
    for r in rows:
        by_provider.setdefault(r.provider, []).append(r)
    seen: dict[int, Instance] = {}
    listings = _listings(eng, {n: g for n, g in by_provider.items() if len(g) > 1})
    for name, group in by_provider.items():
        provider = eng.providers.get(name)
        if provider is None:
            out.update({r.id: ("error", None) for r in group})  # type: ignore[misc]
            continue  # not configured in this process: decide nothing
        listed = listings.get(name)
        if isinstance(listed, ProviderError):
            log.warning("listing %s failed: %s; deciding nothing for its %d jobs", name, listed, len(group))
            out.update({r.id: ("error", None) for r in group})  # type: ignore[misc]
            continue
        for r in group:
            inst = listed.get(r.provider_instance_id) if listed is not None else None
            if inst is None or inst.status == InstanceStatus.terminated:
                try:
                    inst = provider.status(r.provider_instance_id)
                except NotFoundError:
                    out[r.id] = ("gone", None)  # type: ignore[index]
                    continue
                except ProviderError as exc:
                    log.warning("status of %s/%s failed: %s", r.provider, r.provider_instance_id, exc)
                    out[r.id] = ("error", None)  # type: ignore[index]
                    continue
            seen[r.id] = inst  # type: ignore[index]
            out[r.id] = verdict(inst)  # type: ignore[index]
    if seen:
        _record_seen(eng, {r.id: r for r in rows}, seen, now)  # type: ignore[misc]
    return out


def _listings(eng: EngineContext, groups: dict[str, list[Any]]) -> dict[str, Any]:
    """Each provider's listing by instance id, asked concurrently (a slow cloud does not delay the
    others); a ProviderError where the listing failed; absent where the provider has no listing."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> Any:
        provider = eng.providers.get(name)
        if provider is None:
            return None
        try:
            return {i.instance_id: i for i in provider.list_instances()}
        except NotImplementedError:
            return None
        except ProviderError as exc:
            return exc

    names = [n for n in groups if n in eng.providers]
    if len(names) <= 1:
        return {n: one(n) for n in names}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


SEEN_EVERY_S = 30.0  # an unchanged instance's last-seen time is rewritten at most this often


def _record_seen(
    eng: EngineContext, rows: dict[int, InstanceRow], seen: dict[int, Instance], now: float
) -> None:
    changed = []
    same = []
    for rid, inst in seen.items():
        r = rows[rid]
        values = (str(inst.status), inst.raw_status, inst.exit_code)
        if (r.status, r.raw_status, r.exit_code) != values:
            changed.append(
                {
                    "id": rid,
                    "status": values[0],
                    "raw_status": values[1],
                    "exit_code": values[2],
                    "last_seen_at": now,
                }
            )
        elif now - (r.last_seen_at or 0.0) >= SEEN_EVERY_S:
            same.append(rid)
    with eng.session() as s:
        update_each(s, InstanceRow, changed)
        update_in(s, InstanceRow, same, last_seen_at=now)
        s.commit()


def verdict(inst: Instance) -> tuple[str, int | None]:
    """A provider's normalized status as the supervisor reads it (pure)."""
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


__all__ = [
    "EXIT_OK",
    "ingest",
    "observe",
    "observe_many",
    "pull",
    "pull_many",
    "read_progress",
    "token_ok",
    "verdict",
    "S",
]
