"""Reporter: events reach the bot in order with the job's token; a dead bot never slows training."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest

from runner.contract.spec import (
    CheckpointSpec,
    DatasetSpec,
    EventKind,
    JobSpec,
    ReportSpec,
    parse_progress,
    progress_uri,
)
from runner.report import Reporter

TOKEN = "s3cret-job-token"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.status = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests.append((self.headers.get("Authorization", ""), json.loads(body)))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/runner/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/runner/events"  # nothing listens there any more


def make_spec(checkpoint_uri: str | Path, url: str | None, *, heartbeat_seconds: float = 30.0) -> JobSpec:
    return JobSpec(
        job_id="job-7",
        base_model="tiny",
        dataset=DatasetSpec(uri="/tmp/d.jsonl"),
        checkpoint=CheckpointSpec(uri=str(checkpoint_uri)),
        output_uri="/tmp/out",
        report=ReportSpec(callback_url=url, token=TOKEN, heartbeat_seconds=heartbeat_seconds),
    )


def read_progress(checkpoint_uri: str | Path) -> dict:
    with fsspec.open(progress_uri(str(checkpoint_uri)), "rb") as handle:
        return json.loads(handle.read())


def wait_for(condition, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_events_reach_the_receiver_in_order_with_the_token(receiver, tmp_path):
    reporter = Reporter(make_spec(tmp_path, receiver.url), start_seq=3)
    reporter.emit(EventKind.started)
    for step in range(1, 21):
        reporter.emit(EventKind.progress, step=step, loss=3.0 / step)
    reporter.emit(EventKind.finished, step=20, output_uri="/tmp/out")
    reporter.close(timeout=5)
    assert reporter.delivered == 22 and reporter.dropped == 0
    auths = {auth for auth, _ in receiver.requests}
    assert auths == {f"Bearer {TOKEN}"}
    seqs = [body["seq"] for _, body in receiver.requests]
    assert seqs == list(range(3, 25))
    assert [body["kind"] for _, body in receiver.requests][::21] == ["started", "finished"]
    assert all(body["job_id"] == "job-7" for _, body in receiver.requests)


def in_thread(fn) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_silent_receiver_does_not_block_the_caller(tmp_path):
    """The receiver takes connections and never answers: a caller that waited on it (3 s a request, retries,
    100 events) would still be emitting; the emits and the close return while it has answered nothing."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/runner/events"
        reporter = Reporter(make_spec(tmp_path, url), backoff=0.05)
        emits = in_thread(lambda: [reporter.emit(EventKind.progress, step=s, loss=1.0) for s in range(100)])
        emits.join(60)
        assert not emits.is_alive(), "emit waited on the receiver"
        closing = in_thread(lambda: reporter.close(timeout=1.0))
        closing.join(60)
        assert not closing.is_alive(), "close waited on the receiver past its timeout"
        assert reporter.delivered == 0
    finally:
        silent.close()
    assert [e.seq for e in parse_progress(json.dumps(read_progress(tmp_path)))] == list(range(100))


def test_a_dead_receiver_does_not_block_the_caller(tmp_path):
    reporter = Reporter(make_spec(tmp_path, dead_url()), backoff=0.05)
    emits = in_thread(lambda: [reporter.emit(EventKind.progress, step=s, loss=1.0) for s in range(100)])
    emits.join(60)
    assert not emits.is_alive()
    closing = in_thread(lambda: reporter.close(timeout=1.0))
    closing.join(60)
    assert not closing.is_alive()  # close is bounded too
    assert reporter.delivered == 0 and reporter.dropped > 0
    # the progress object is the durable record even when the push failed
    assert [e.seq for e in parse_progress(json.dumps(read_progress(tmp_path)))] == list(range(100))


def test_progress_object_round_trips_through_parse_progress(tmp_path):
    reporter = Reporter(make_spec(tmp_path / "ckpt", None))
    reporter.emit(EventKind.started, max_steps=10)
    reporter.emit(EventKind.progress, step=5, loss=1.25, tokens_per_second=1000.0, eta_seconds=12.0)
    reporter.emit(EventKind.checkpoint, step=5, checkpoint_uri="/x/checkpoint-5")
    reporter.emit(EventKind.finished, step=10, loss=0.5)
    reporter.close()
    raw = (tmp_path / "ckpt" / "progress.json").read_bytes()
    obj = json.loads(raw)
    assert obj["job_id"] == "job-7" and obj["last_seq"] == 3 and obj["updated"] > 0
    events = parse_progress(raw)
    assert [(e.seq, e.kind) for e in events] == [
        (0, EventKind.started),
        (1, EventKind.progress),
        (2, EventKind.checkpoint),
        (3, EventKind.finished),
    ]
    assert events[1].loss == 1.25 and events[1].eta_seconds == 12.0
    assert events == reporter.events()
    assert not list((tmp_path / "ckpt").glob("*.tmp"))  # the temp file was moved into place


def test_seq_continues_from_start_seq_and_keeps_earlier_events(tmp_path):
    first = Reporter(make_spec(tmp_path, None))
    for _ in range(5):
        first.emit(EventKind.progress)
    assert first.seq == 5
    first.close()
    resumed = Reporter(make_spec(tmp_path, None), start_seq=first.seq)
    event = resumed.emit(EventKind.started, message="resumed")
    assert event.seq == 5 and resumed.seq == 6
    resumed.emit(EventKind.finished)
    resumed.close()
    events = parse_progress((tmp_path / "progress.json").read_text())
    assert [e.seq for e in events] == list(range(7))


def test_progress_writes_are_throttled_but_other_kinds_are_written_at_once(tmp_path, monkeypatch):
    """No sleep to see that nothing was written: the writer thread is watched going to sleep with the progress
    event pending (a timed wait on its condition), and every write it made is recorded in order."""
    import runner.report as report

    written: list[int] = []  # the last_seq of every write of the progress object, in order
    real_write = report.write_atomically

    def write(uri: str, data: bytes) -> None:
        real_write(uri, data)
        written.append(json.loads(data)["last_seq"])

    held: list[float] = []  # the writer went to sleep with events pending: for how long at most
    holding = threading.Event()

    class Condition(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            # with nothing pending the writer waits for the next heartbeat (an hour here): not a held event
            if timeout is not None and timeout <= 60:
                held.append(timeout)
                holding.set()
            return super().wait(timeout)

    spy = types.SimpleNamespace(**{**vars(threading), "Condition": Condition})  # the reporter's module alone
    monkeypatch.setattr(report, "write_atomically", write)
    monkeypatch.setattr(report, "threading", spy)
    reporter = Reporter(make_spec(tmp_path, None, heartbeat_seconds=3600), progress_every_seconds=60)
    reporter.emit(EventKind.started)
    assert wait_for(lambda: written == [0]), written
    assert not holding.is_set()  # a started event is written at once
    reporter.emit(EventKind.progress, step=1)
    assert holding.wait(10), "the writer never held the progress event back"
    assert 0 < held[-1] <= 60 and written == [0], (held, written)
    assert read_progress(tmp_path)["last_seq"] == 0  # a progress event waits for the next write
    reporter.emit(EventKind.checkpoint, step=1)
    assert wait_for(lambda: read_progress(tmp_path)["last_seq"] == 2)
    assert written == [0, 2], written  # the checkpoint took the progress event with it: never written alone
    reporter.emit(EventKind.progress, step=2)
    reporter.close()
    assert read_progress(tmp_path)["last_seq"] == 3  # close flushes
    assert written == [0, 2, 3], written


def test_refused_events_are_not_retried_and_the_token_stays_secret(receiver, tmp_path, caplog):
    receiver.status = 401
    caplog.set_level(logging.DEBUG)
    reporter = Reporter(make_spec(tmp_path, receiver.url), backoff=0.01)
    reporter.emit(EventKind.started)
    reporter.close(timeout=3)
    assert len(receiver.requests) == 1
    assert reporter.dropped == 1
    assert "HTTP 401" in caplog.text
    assert TOKEN not in caplog.text and TOKEN not in repr(reporter)


def test_server_errors_are_retried_then_delivery_resumes(receiver, tmp_path):
    receiver.status = 503
    reporter = Reporter(make_spec(tmp_path, receiver.url), retries=3, backoff=0.01)
    reporter.emit(EventKind.progress, step=1)
    assert wait_for(lambda: reporter.dropped == 1)
    assert len(receiver.requests) == 3
    receiver.status = 200
    reporter.emit(EventKind.progress, step=2)
    reporter.close(timeout=3)
    assert reporter.delivered == 1
    assert receiver.requests[-1][1]["seq"] == 1


def test_progress_goes_to_any_fsspec_uri():
    reporter = Reporter(make_spec("memory://ckpts/job-7", None))
    reporter.emit(EventKind.failed, message="out of memory")
    reporter.close()
    (event,) = parse_progress(json.dumps(read_progress("memory://ckpts/job-7")))
    assert event.kind is EventKind.failed and event.message == "out of memory"


def test_parse_progress_rejects_what_is_not_a_progress_object():
    with pytest.raises(ValueError, match="not a tunebot progress object"):
        parse_progress(b"[1, 2]")
    assert parse_progress('{"events": [{"job_id": "j", "seq": 0, "kind": "from-the-future"}]}') == []


def test_the_heartbeat_goes_on_without_reports_and_while_training_is_busy(tmp_path, monkeypatch):
    """Issue 38: with reports hourly, the runner still beats on its own cadence, from the writer thread, while
    the training thread is busy (a long eval, an upload): each beat signed with the run's key, newer than the
    last, with the step and how long the runner has gone without progress; the bot reads it from the head of
    the object without parsing the events."""
    import runner.report as report
    from runner.contract import heartbeat

    key = b"k" * 32
    monkeypatch.setenv("TUNEBOT_JOB_KEY", key.hex())
    beats: list[heartbeat.Beat] = []
    real_write = report.write_atomically

    def write(uri: str, data: bytes) -> None:
        real_write(uri, data)
        parsed = heartbeat.parse(heartbeat.head(data), key, "job-7")
        assert parsed is not None, data[:300]
        beats.append(parsed)

    monkeypatch.setattr(report, "write_atomically", write)
    spec = make_spec(tmp_path, None, heartbeat_seconds=0.2)
    spec.report.every_seconds = 3600.0
    step = [0]
    reporter = Reporter(spec, activity=lambda: step[0])
    try:
        reporter.emit(EventKind.started)
        assert wait_for(lambda: len(beats) >= 1)
        first = len(beats)
        deadline = time.monotonic() + 30
        while len(beats) < first + 3 and time.monotonic() < deadline:  # busy: never sleeps, never reports
            sum(range(1000))
        assert len(beats) >= first + 3, "no beat while the training thread was busy"
        assert all(b.step == 0 for b in beats) and beats[-1].stalled_s > beats[first].stalled_s
        step[0] = 5  # a step: the next beat says so, and that the runner just made progress
        assert wait_for(lambda: beats[-1].step == 5)
        assert beats[-1].stalled_s < beats[-2].stalled_s
        orders = [b.order for b in beats]
        assert orders == sorted(orders) and len(set(orders)) == len(orders)  # each beat newer than the last
    finally:
        reporter.close()
    obj = read_progress(tmp_path)
    assert next(iter(obj)) == heartbeat.FIELD and [e["kind"] for e in obj["events"]] == ["started"]


def test_a_long_eval_is_progress_for_the_heartbeat(tmp_path, monkeypatch):
    """A batch of an eval is neither a step nor an event: ``touch`` makes the next beat say the runner just
    made progress, so a long eval is not idleness (the trainer touches once per eval batch)."""
    import runner.report as report
    from runner.contract import heartbeat

    key = b"k" * 32
    monkeypatch.setenv("TUNEBOT_JOB_KEY", key.hex())
    beats: list[heartbeat.Beat] = []
    real_write = report.write_atomically

    def write(uri: str, data: bytes) -> None:
        real_write(uri, data)
        beats.append(heartbeat.parse(heartbeat.head(data), key, "job-7"))  # type: ignore[arg-type]

    monkeypatch.setattr(report, "write_atomically", write)
    reporter = Reporter(make_spec(tmp_path, None, heartbeat_seconds=0.1), activity=lambda: 7)
    try:
        assert wait_for(lambda: len(beats) >= 3 and beats[-1].stalled_s > beats[0].stalled_s)
        stalled = beats[-1].stalled_s
        reporter.touch()
        assert wait_for(lambda: beats[-1].stalled_s < stalled)
        assert beats[-1].step == 7
    finally:
        reporter.close()
