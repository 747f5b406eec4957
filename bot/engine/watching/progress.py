"""Pull: reading the progress object each runner writes beside its checkpoints (``progress.json``).

A bot in Socket Mode has no public URL, so it reads every event the runner wrote with fsspec. Each read is
remembered as a window (digest, first and last seq, newest timestamp, stored in ``jobs.progress_window``): an
unchanged object is not parsed again, a grown one only from its tail. What is new goes to
bot/engine/watching/runner_events.py like a pushed event. The object's head is the runner's heartbeat
(rewritten every few seconds, whether or not there are events): every read counts it (``note_beat``,
below: liveness), and the digest covers only what follows it, so a beat alone changes no window."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy import func, select

from bot.engine.launching import integrity
from bot.engine.watching.runner_events import ingest, ingest_many, valid_events
from runner.contract import heartbeat
from runner.contract.spec import (
    RunnerEvent,
    parse_progress,
    progress_uri,
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
    """Ingest what the job's current run wrote to its progress object; an object this process has already
    ingested byte for byte is not parsed or looked up again (at 10,000 running jobs most are unchanged)."""
    uri = job.checkpoint_uri
    if not uri:
        return 0
    return pull_raw(eng, job.id, read_raw(progress_uri(uri)), run_id=job.run_id)


def pull_raw(eng: EngineContext, job_id: str, raw: bytes | None, *, run_id: str | None = None) -> int:
    """Ingest one progress object's bytes (already-ingested objects and events are skipped); only what the
    key of the job's current run (``run_id``, else read from the database) signed counts."""
    current = integrity.current_key(eng, job_id, run_id)
    if current is None:
        return 0  # no current run: nothing is accepted from anyone
    note_beat(eng, job_id, current[0], current[1], raw)
    refused: Counter[str] = Counter()
    parsed = _new_events(eng, job_id, raw, refused=refused, key=current[1])
    integrity.report_refused(eng, job_id, refused)
    if parsed is None:
        return 0
    items, window = parsed
    events = valid_events(job_id, items)
    new = ingest(eng, job_id, events, run_id=current[0]) if events else 0
    eng.memory.progress_seen[job_id] = window
    return new


Window = tuple[str, int, int, float]  # (digest, first seq, last seq, newest runner timestamp) of a read


def window_text(window: Window) -> str:
    """The window as stored in ``jobs.progress_window``."""
    return f"{window[0]} {window[1]} {window[2]} {window[3]!r}"


def object_digest(raw: bytes) -> str:
    """The digest a window records of the object's bytes from its ``"last_seq"`` on (the heartbeat and the
    write time before it change with every beat, the events never do): SHA-256's first 16 bytes in hex (CPUs
    hash SHA-256 in hardware: twice blake2b's speed on a 10 KB object; every object is hashed on a restart's
    first tick and once a minute). A window recorded with another digest reads as changed: its object is
    read from the tail once."""
    start = raw.find(b'"last_seq"', 0, 2048)
    return hashlib.sha256(raw[start:] if start > 0 else raw).hexdigest()[:32]


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
    key: bytes,
    held: Window | None = None,
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
    With no read recorded (the first read after the upgrade that added windows), ``held`` stands for
    one: the window of the job's stored events (``held_windows``), when the object starts inside it.

    Only items the key of the job's current run (``key``) signed count, for the window too
    (bot/engine/launching/integrity.py): a forged item with a huge seq or a future timestamp would otherwise
    hide the job's real events; the others are counted in ``refused``."""
    if raw is None:
        return None
    refused = Counter() if refused is None else refused
    if len(raw) > integrity.MAX_PROGRESS_BYTES:
        refused["object_too_large"] += 1
        return None
    digest = object_digest(raw)
    seen = eng.memory.progress_seen.get(job_id) or parse_window(stored)
    if seen is not None and seen[0] == digest:
        eng.memory.progress_seen[job_id] = seen
        return None
    text = raw.decode("utf-8", errors="replace") if seen is not None or held is not None else ""
    if seen is None and held is not None and _starts_within(text, held):
        seen = held  # never read, but its events are stored: only the events after them are parsed
    items = _tail(text, seen, key) if seen is not None else None
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


def held_windows(eng: EngineContext, job_ids: list[str]) -> dict[str, Window]:
    """For jobs with no read recorded: the window of their stored events, as if one read had held them
    all (no digest; the first and the last stored seq; the last one's runner timestamp), where the
    store holds every seq between the two. A read stores all it finds new at once, in seq order, so
    an event of the object inside that window and not newer than the last stored one is stored. Jobs
    with a gap in their stored events get none (their object is read whole). A few queries on the
    events' (job, seq) index; one timestamp read per job."""
    ev = RunnerEventRecord
    out: dict[str, Window] = {}
    with eng.session() as s:
        for k in range(0, len(job_ids), 500):
            spans = (
                select(
                    ev.job_id,
                    func.count().label("n"),
                    func.min(ev.seq).label("lo"),
                    func.max(ev.seq).label("hi"),
                )
                .where(ev.job_id.in_(job_ids[k : k + 500]))
                .group_by(ev.job_id)
                .subquery()
            )
            # The last event's timestamp, looked up per job on the (job, seq) index: a join here was
            # planned by PostgreSQL as a scan of every stored event, once per 500 jobs.
            last = (
                select(ev.payload["timestamp"].as_float())
                .where(ev.job_id == spans.c.job_id, ev.seq == spans.c.hi)
                .scalar_subquery()
            )
            q = select(spans.c.job_id, spans.c.n, spans.c.lo, spans.c.hi, last)
            for jid, n, lo, hi, ts in s.execute(q):
                if n == hi - lo + 1 and ts is not None:
                    out[jid] = ("", lo, hi, float(ts))
    return out


def _starts_within(text: str, held: Window) -> bool:
    """Whether the object's first event lies at or after the first stored one (else the events before
    the stored ones are read too: the object is parsed whole)."""
    if held[1] == 0:
        return True  # stored from seq 0: no event lies before them
    pos = text.find(_EVENT_START)
    if pos == -1:
        return False
    try:
        item, _ = _DECODER.raw_decode(text, pos)
    except ValueError:
        return False
    seq = item.get("seq") if isinstance(item, dict) else None
    return isinstance(seq, int) and seq >= held[1]


def _plain(item: dict[str, Any]) -> bool:
    seq, ts = item.get("seq"), item.get("timestamp")
    return isinstance(seq, int) and not isinstance(seq, bool) and isinstance(ts, int | float) and seq >= 0


_EVENT_START = '{"version": '  # how the runner's json.dumps writes each event object's first key
_DECODER = json.JSONDecoder()  # one for every read (making one per object was a tenth of a tail read)


def _tail(text: str, seen: tuple, key: bytes) -> list[dict[str, Any]] | None:
    """The events after the last one the previous read had, parsed from the end of the object without
    decoding the rest (a long run's object holds 200 events, ~70 KB; usually one or two are new).
    None when the object does not look as expected: the caller parses all of it."""
    if not text.rstrip().endswith("]}"):
        return None
    out: list[dict[str, Any]] = []
    end = text.rstrip()[:-2].rstrip()
    limit = len(end)
    pos = text.rfind(_EVENT_START, 0, limit)
    while pos != -1 and len(out) <= 50:
        try:
            item, stop = _DECODER.raw_decode(text, pos)
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
            and integrity.signed_event(key, item)  # only the job's own event marks where the last read ended
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


def _fetch_remote(uris: dict[str, str]) -> dict[str, bytes | None]:
    """The remote objects' bytes (every object not on this machine), fetched concurrently."""
    remote = [jid for jid, u in uris.items() if "://" in u and not u.startswith("file://")]
    if len(remote) <= 1:
        return {jid: read_raw(uris[jid]) for jid in remote}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
        return dict(zip(remote, pool.map(read_raw, [uris[j] for j in remote]), strict=True))


def _changed_files(
    eng: EngineContext, uris: dict[str, str], raws: dict[str, bytes | None]
) -> dict[str, tuple[int, int]]:
    """The files on this machine to read, each with its (mtime, size) stamp: one stat each, and a file
    with the stamp of its last read is not read again (at 10,000 running jobs nearly all are unchanged),
    though at least once a minute in case two writes shared an mtime; a file not there yet has nothing
    to read."""
    stats = eng.memory.progress_stat
    now = time.monotonic()
    out: dict[str, tuple[int, int]] = {}
    for jid, uri in uris.items():
        if jid in raws:
            continue  # remote: fetched already
        stamp = _stat(uri)
        if stamp is None:
            continue
        known = stats.get(jid)
        if known is None or known[0] != stamp or now - known[1] >= 60:
            out[jid] = stamp
    return out


class Followed(Protocol):
    """What the pull reads of a running job (supervise.JobFacts carries these columns)."""

    @property
    def id(self) -> str: ...
    @property
    def checkpoint_uri(self) -> str | None: ...
    @property
    def progress_window(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...


def pull_many(eng: EngineContext, jobs: list[Followed]) -> set[str]:
    """Pull every job's progress object (remote objects fetched concurrently) and store what is new in
    one transaction; returns the ids of the jobs that got new events. Each stored read's window goes
    to ``jobs.progress_window`` too, so that a restarted bot starts where this one stopped."""
    uris = {j.id: progress_uri(j.checkpoint_uri) for j in jobs if j.checkpoint_uri}
    raws = _fetch_remote(uris)
    stamps = _changed_files(eng, uris, raws)
    if not stamps and not raws:
        return set()  # a quiet tick: not one object changed
    jobs = [j for j in jobs if j.id in stamps or j.id in raws]
    stored_windows = {j.id: j.progress_window for j in jobs}
    run_ids = {j.id: j.run_id for j in jobs}  # read with the rows: no query per job
    batch: dict[str, list[dict[str, Any]]] = {}
    windows: dict[str, Window] = {}
    verified_by: dict[str, str] = {}
    stats = eng.memory.progress_stat
    now = time.monotonic()
    integrity.load_run_keys(eng, run_ids)  # one query, not one per job
    seen = eng.memory.progress_seen
    never_read = [j for j in run_ids if j not in seen and parse_window(stored_windows.get(j)) is None]
    held = held_windows(eng, never_read) if never_read else {}
    for jid in run_ids:
        raw = raws[jid] if jid in raws else read_raw(uris[jid])
        current = integrity.current_key(eng, jid, run_ids.get(jid))
        if current is None:
            continue  # no current run (it just ended): nothing is accepted from anyone
        note_beat(eng, jid, current[0], current[1], raw)
        verified_by[jid] = current[0]
        refused: Counter[str] = Counter()
        parsed = _new_events(
            eng, jid, raw, stored_windows.get(jid), refused=refused, key=current[1], held=held.get(jid)
        )
        integrity.report_refused(eng, jid, refused)
        if parsed is not None:
            batch[jid], windows[jid] = parsed
        if jid in stamps:
            stats[jid] = (stamps[jid], now)
    texts = {jid: window_text(w) for jid, w in windows.items()}
    try:
        changed, written = ingest_many(eng, {k: v for k, v in batch.items() if v}, texts, verified_by)
    except Exception:  # noqa: BLE001 - the batch failed as a whole: store job by job (exact, slower)
        log.exception("storing runner events in one batch failed; storing them job by job")
        changed, written = set(), set()
        for jid, items in batch.items():
            try:
                events = valid_events(jid, items)
                if events and ingest(eng, jid, events, run_id=verified_by.get(jid)):
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
    for table in (mem.progress_seen, mem.progress_stat, mem.heartbeats):
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


# -- liveness: the heartbeat at the head of the object ---------------------------------------------------
#
# Liveness: whether a running job's runner lives, from its heartbeat, whatever its report cadence.
#
# A runner writes a signed beat at the head of its progress object every few seconds
# (runner/contract/heartbeat.py), from its own thread, through long evals and uploads, and whether or not it
# has anything to report; its progress reports may come once an hour (TUNEBOT_REPORT_EVERY). Issue 38: with
# reports hourly, a runner at step 647 was declared dead by the heartbeat timeout and relaunched from step 0.
#
# Each progress read hands the object's head to note_beat. A beat counts when the key of the job's current run
# signed it and it is newer than the last one counted (a later runner process, else a later beat: a beat
# written again, or an older one put back, proves nothing). The runner is then *heard* now, on the bot's clock
# (the host's clock is never compared with ours), and its last progress is ``stalled_s`` (the beat's own
# claim, bounded by now) before that. This process keeps what it heard in its memory: after a restart the
# first read hears each runner again (benefit of the doubt: the newest beat is in the object).
#
# supervise.decide reads it through the Observation: the heartbeat timeout runs from the last word heard (a
# beat or an event), the idle rule from the last progress (a step or an event). A host's beats are a bounded
# claim: they keep a silent-but-beating runner from being relaunched, never a job past its spend cap, and the
# provider's own verdict (gone, exited, preempted) ends it whatever the beats say.


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


def note_beat(ctx: EngineContext, job_id: str, run_id: str, key: bytes, raw: bytes | None) -> bool:
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


def step_heard(ctx: EngineContext, job: Job) -> int | None:
    """The step the newest beat of a running job's current run claims: what this process heard, else the
    beat at the head of its progress object read now, counted only when the run's key signed it. Bounded by
    the job's max_steps (None before the runner said it). For display only (``views.job_view``): between a
    rare runner's reports, the step it is at, in any process, not only in the supervising one."""
    if job.state != "running" or not job.checkpoint_uri or job.run_id is None or not job.max_steps:
        return None  # max_steps: from the runner's own first event; a claim is never shown unbounded
    known = heard(ctx, job.id, job.run_id)
    if known is not None:
        step = known.step
    else:
        current = integrity.current_key(ctx, job.id, job.run_id)
        raw = read_raw(progress_uri(job.checkpoint_uri)) if current is not None else None
        obj = heartbeat.head(raw) if raw else None
        beat = heartbeat.parse(obj, current[1], job.id) if obj is not None and current is not None else None
        if beat is None:
            return None
        step = beat.step
    return max(0, min(step, job.max_steps))


def heard(ctx: EngineContext, job_id: str, run_id: str | None) -> Heard | None:
    """The newest beat heard from the job's current run, None before its first one (or without a run)."""
    known = ctx.memory.heartbeats.get(job_id)
    return known if known is not None and run_id is not None and known.run_id == run_id else None
