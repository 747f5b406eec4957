"""Reporting a run to the bot: push RunnerEvents to the callback URL and keep a progress object beside
the checkpoints.

Training never waits on the bot. ``emit`` only numbers the event and hands it to two background
threads: a sender that POSTs it (bearer token, short timeout, a few retries with backoff, then the
event is dropped; while the receiver is down each event gets a single try) and a writer that rewrites
``<checkpoint uri>/progress.json`` (throttled for ``progress`` events, at once for the others). The
progress object is what a bot without a public URL pulls, so it is the durable record: on a resume
the writer first reads the old object back and keeps its events (only those signed with this job's key).
Every event pushed or written carries its MAC (runner/contract/integrity.py): the bot ignores what this job's
key did not sign, whoever could write the object. The token and the key never appear in logs, exceptions or
reprs.

The writer also rewrites the object every ``report.heartbeat_seconds``, whether or not there is anything to
report, with a fresh signed heartbeat at its head (runner/contract/heartbeat.py): the bot tells a live runner
from a dead one by that, never by the report cadence (TUNEBOT_REPORT_EVERY may be an hour), and the beat goes
on from this thread while the training thread is in a long eval or a checkpoint upload.

At each beat the writer also looks for the bot's stop request beside the checkpoints (runner/contract/stop.py:
one small read, signed with this run's key): a cloud has no signal path to the runner, so that request is how
the bot asks it to save, report and exit before it terminates the instance. A request this run's key did not
sign, or one for another job or run, is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import fsspec
import httpx
from fsspec.implementations.local import LocalFileSystem

from runner.contract import heartbeat, stop
from runner.contract.integrity import EVENT, key_from_env, sign, verify
from runner.contract.spec import (
    MAX_PROGRESS_BYTES,
    EventKind,
    JobSpec,
    RunnerEvent,
    progress_uri,
    readable_events,
    report_events,
)
from runner.redact import scrub, secret_values

log = logging.getLogger(__name__)

KEEP_EVENTS = 200  # x MAX_EVENT_BYTES (and a MAC each): within MAX_PROGRESS_BYTES


class Reporter:
    """Numbers, sends and records the events of one job; ``seq`` continues from ``start_seq``."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        start_seq: int = 0,
        timeout: float = 3.0,
        retries: int = 3,
        backoff: float = 0.25,
        max_queue: int = 1000,
        progress_every_seconds: float | None = None,
        transport: httpx.BaseTransport | None = None,
        activity: Callable[[], object] | None = None,
        on_stop: Callable[[str], object] | None = None,
    ) -> None:
        """``activity``: what the runner is at (the trainer passes its step); a beat after it changed says
        the runner made progress. Every event counts as progress too. ``on_stop``: called once, with the
        reason, when the bot's signed stop request for this run is found (runner/contract/stop.py)."""
        self.job_id = spec.job_id
        self.run_id = spec.run_id
        self.progress_uri = progress_uri(spec.checkpoint.uri)
        self.delivered = 0  # events the receiver accepted
        self.dropped = 0  # events given up on (receiver down, refused, or queue full)
        self._seq = start_seq
        self._start_seq = start_seq
        self._url = spec.report.callback_url
        self._secrets = secret_values(extra=[spec.report.token])  # never in a message (runner/redact.py)
        self._key = key_from_env()  # signs every event (runner/contract/integrity.py)
        self._retries = max(1, retries)
        self._backoff = backoff
        # progress.json follows the job's own reporting cadence, at most every 5 s by default.
        self._progress_every = (
            min(5.0, spec.report.every_seconds) if progress_every_seconds is None else progress_every_seconds
        )
        self._lock = threading.Lock()
        self._events: deque[RunnerEvent] = deque(maxlen=KEEP_EVENTS)
        self._dirty = self._urgent = False
        self._last_write = 0.0
        self._wake = threading.Condition(self._lock)
        # The heartbeat: its cadence, this process's start, the beats written, and the progress it reports.
        self._beat_every = spec.report.heartbeat_seconds
        self._next_beat = time.monotonic() + self._beat_every  # a write of any kind carries a beat
        self._born = time.time()
        self._beats = 0
        self._activity = activity
        self._last_activity: object = None
        self._active_at = time.monotonic()
        # The bot's stop request: looked for once a beat (a cloud has no other way to ask the runner to stop).
        self._on_stop = on_stop
        self._stop_uri = stop.request_uri(spec.checkpoint.uri)
        self._next_stop_look = 0.0
        self.stop_reason: str | None = None
        self.stops_ignored = 0  # looks that found a request this run must not obey (forged, another run's)
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._outbox: queue.Queue[RunnerEvent] = queue.Queue(maxsize=max_queue)
        self._receiver_down = False
        self._client: httpx.Client | None = None
        if self._url:
            headers = {"Authorization": f"Bearer {spec.report.token}"} if spec.report.token else {}
            self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self._threads = [threading.Thread(target=self._write_loop, name="tunebot-progress", daemon=True)]
        if self._client is not None:
            self._threads.append(threading.Thread(target=self._send_loop, name="tunebot-report", daemon=True))
        for thread in self._threads:
            thread.start()

    def __repr__(self) -> str:
        return f"Reporter(job_id={self.job_id!r}, seq={self.seq}, callback={'set' if self._url else 'none'})"

    def advance_to(self, seq: int) -> None:
        """Continue at ``seq`` at least (a resumed checkpoint's saved seq, known only after the reporter
        started so that early failures could be reported)."""
        with self._lock:
            self._seq = max(self._seq, seq)

    @property
    def seq(self) -> int:
        """The seq the next event gets; save it in checkpoints and pass it back as ``start_seq``."""
        with self._lock:
            return self._seq

    def emit(self, kind: EventKind, **fields: Any) -> RunnerEvent:
        """Number and queue a report; returns at once whatever the state of the receiver. A report too big
        for one event (MAX_EVENT_BYTES: many chart points) goes as several
        (runner.contract.spec.report_events); the last one, returned, is the report itself."""
        if fields.get("message"):
            fields["message"] = scrub(fields["message"], self._secrets)
        with self._lock:
            self._active_at = time.monotonic()  # an event is progress (an eval's end, a checkpoint, ...)
            events = report_events(self.job_id, self._seq, EventKind(kind), fields)
            self._seq += len(events)
            self._events.extend(events)
            self._dirty = True
            self._urgent = self._urgent or events[-1].kind is not EventKind.progress
            self._wake.notify_all()
        for event in events:
            if self._client is None or self._closing.is_set():
                break
            try:
                self._outbox.put_nowait(event)
            except queue.Full:
                self.dropped += 1
                log.warning("report queue full: event %d not sent (the progress object has it)", event.seq)
        return events[-1]

    def touch(self) -> None:
        """Progress that is neither a step nor an event (a batch of a long eval): the next beat says so."""
        with self._lock:
            self._active_at = time.monotonic()

    def events(self) -> list[RunnerEvent]:
        """The events the progress object holds (the last 200)."""
        with self._lock:
            return list(self._events)

    def close(self, timeout: float = 5.0) -> None:
        """Send and write what can be within ``timeout`` seconds, then stop the threads."""
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        with self._lock:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sender ----------------------------------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            try:
                event = self._outbox.get(timeout=0.05)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if self._closing.is_set() and time.monotonic() >= self._deadline:
                self._drop_rest()
                return
            self._deliver(event)

    def _deliver(self, event: RunnerEvent) -> None:
        assert self._client is not None and self._url is not None
        attempts = 1 if self._receiver_down else self._retries
        body = sign(self._key, EVENT, event.model_dump(mode="json"))
        problem = ""
        for attempt in range(attempts):
            if attempt:
                pause = self._backoff * 2 ** (attempt - 1)
                if self._closing.is_set() and time.monotonic() + pause >= self._deadline:
                    break
                self._pause(pause)
            try:
                response = self._client.post(self._url, json=body)
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
                continue
            if response.is_success:
                self.delivered += 1
                self._receiver_down = False
                return
            problem = f"HTTP {response.status_code}"
            if response.status_code < 500 and response.status_code not in (408, 429):
                break  # refused (bad token, unknown job): retrying will not help
        self.dropped += 1
        self._receiver_down = True
        log.warning("event %d (%s) not delivered to the callback: %s", event.seq, event.kind.value, problem)

    def _pause(self, seconds: float) -> None:
        if self._closing.is_set():
            time.sleep(max(0.0, min(seconds, self._deadline - time.monotonic())))
        else:
            self._closing.wait(seconds)  # a close() cuts the pause short

    def _drop_rest(self) -> None:
        while True:
            try:
                self._outbox.get_nowait()
            except queue.Empty:
                return
            self.dropped += 1

    # ---- progress object -------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        self._load_previous()
        while True:
            with self._lock:
                while True:
                    closing = self._closing.is_set()
                    now = time.monotonic()
                    wait = self._last_write + self._progress_every - now
                    if self._dirty and (self._urgent or closing or wait <= 0):
                        break
                    if closing:
                        return
                    beat_wait = self._next_beat - now
                    if beat_wait <= 0:
                        break  # a heartbeat is due, with or without anything to report
                    self._wake.wait(timeout=min(wait, beat_wait) if self._dirty else beat_wait)
                snapshot = list(self._events)
                last_seq = self._seq - 1
                self._dirty = self._urgent = False
            self._write(snapshot, last_seq)
            self._last_write = time.monotonic()
            self._next_beat = self._last_write + self._beat_every
            if self._on_stop is not None and self._last_write >= self._next_stop_look:
                self._next_stop_look = self._last_write + self._beat_every
                self._look_for_stop()

    def _look_for_stop(self) -> None:
        """Read the bot's stop request (one small GET; absent almost always) and, when it is this run's and
        signed with its key, tell the trainer once (it saves, reports and exits as on SIGTERM)."""
        if self.stop_reason is not None or self._on_stop is None:
            return
        try:
            fs, path = fsspec.core.url_to_fs(self._stop_uri)
            raw = fs.cat_file(path, start=0, end=stop.MAX_REQUEST_BYTES + 1)
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001 - storage trouble: looked for again at the next beat
            log.debug("could not read the stop request: %s", type(exc).__name__)
            return
        reason = stop.asked(raw, self._key, self.job_id, self.run_id)
        if reason is None:
            if not self.stops_ignored:
                log.warning("a stop request this run's key did not sign, or not for this run: ignored")
            self.stops_ignored += 1
            return
        self.stop_reason = reason
        try:
            self._on_stop(reason)
        except Exception:  # noqa: BLE001 - the trainer's flag; never stops the beat
            log.exception("the stop request's handler failed")

    def _beat(self) -> dict[str, Any]:
        """The next heartbeat, signed: this process, its beat number, the step, the seconds idle."""
        step = 0
        if self._activity is not None:
            try:
                at = self._activity()
            except Exception:  # noqa: BLE001 - a probe that fails reports no progress, never stops the beat
                at = self._last_activity
            if at != self._last_activity:
                self._last_activity, self._active_at = at, time.monotonic()
            step = at if isinstance(at, int) and not isinstance(at, bool) else 0
        with self._lock:
            stalled = time.monotonic() - self._active_at
            beat = heartbeat.Beat(self.job_id, self._born, self._beats, max(0, step), stalled)
            self._beats += 1
        return beat.signed(self._key)

    def _load_previous(self) -> None:
        """On a resume, keep the events already in the progress object (those before ``start_seq``)."""
        if self._start_seq == 0:
            return
        items = read_signed_events(self.progress_uri, self._key)
        if items is None:
            return
        previous = [e for e in readable_events(items) if e.seq < self._start_seq]
        with self._lock:
            merged = previous + list(self._events)
            self._events = deque(merged[-KEEP_EVENTS:], maxlen=KEEP_EVENTS)

    def _write(self, events: list[RunnerEvent], last_seq: int) -> None:
        # The beat first (the bot reads it without parsing the rest), then what changes with every write, then
        # what changes only with the events (the bot's digest of an object starts at "last_seq").
        payload = {
            heartbeat.FIELD: self._beat(),
            "updated": time.time(),
            "job_id": self.job_id,
            "last_seq": last_seq,
            "events": [sign(self._key, EVENT, e.model_dump(mode="json")) for e in events],
        }
        data = json.dumps(payload).encode()
        try:
            write_atomically(self.progress_uri, data)
        except Exception as exc:  # noqa: BLE001 - reporting never stops training
            log.warning("could not write the progress object: %s: %s", type(exc).__name__, exc)


def read_signed_events(uri: str, key: bytes | None) -> list[dict[str, Any]] | None:
    """The event objects of a progress object that this job's key signed (all of them without a key);
    None when there is none or it cannot be read."""
    try:
        with fsspec.open(uri, "rb") as handle:
            raw = handle.read(MAX_PROGRESS_BYTES + 1)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - an unreadable old object must not stop the run
        log.warning("could not read the previous progress object: %s", type(exc).__name__)
        return None
    if len(raw) > MAX_PROGRESS_BYTES:
        log.warning(
            "the previous progress object is over %d bytes: not this runner's; ignored", MAX_PROGRESS_BYTES
        )
        return None
    try:
        obj = json.loads(raw)
        items = obj["events"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(items, list):
        return None
    return [i for i in items if isinstance(i, dict) and (key is None or verify(key, EVENT, i))]


def next_seq_in_progress(spec: JobSpec) -> int:
    """The seq after the newest signed event of the progress object (0 when there is none): a run killed
    after its newest checkpoint may have reported events after it."""
    items = read_signed_events(progress_uri(spec.checkpoint.uri), key_from_env())
    seqs = [i["seq"] for i in items or [] if isinstance(i.get("seq"), int) and i.get("job_id") == spec.job_id]
    return max(seqs, default=-1) + 1


def write_atomically(uri: str, data: bytes) -> None:
    """Replace the object at ``uri``: temp file + rename on local disks, one PUT on object stores."""
    fs, path = fsspec.core.url_to_fs(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if isinstance(fs, LocalFileSystem):
        os.makedirs(parent or ".", exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent or ".", prefix=".progress-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    if parent:
        try:
            fs.makedirs(parent, exist_ok=True)
        except Exception:  # noqa: BLE001 - object stores have no real folders
            pass
    fs.pipe_file(path, data)  # a single PUT replaces an object atomically on S3-like stores
