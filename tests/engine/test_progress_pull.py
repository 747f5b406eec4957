"""Pulling the runner's progress object on every tick: each event stored and announced once, however
often the object is read, across engine restarts, resumed runs and layouts."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fakes.runner_events import signed_all
from sqlalchemy import select

from runner.contract.spec import RunnerEvent, progress_uri
from store.models import Job, RunnerEventRecord

from .conftest import Recorder, estimate_for, request


def write(engine, path: Path, job_id: str, events: list[dict], **dumps) -> None:  # type: ignore[no-untyped-def]
    """The object as runner/report.py writes it (json.dumps of this payload, each event signed with the
    job's key), atomically."""
    payload = {
        "job_id": job_id,
        "updated": time.time(),
        "last_seq": events[-1]["seq"],
        "events": signed_all(engine, events),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, **dumps))
    tmp.replace(path)


def ev(job_id: str, seq: int, kind: str = "progress", ts: float | None = None) -> dict:
    e = RunnerEvent(
        job_id=job_id, seq=seq, kind=kind, step=seq * 10, loss=3.0 - seq / 10, timestamp=ts or 1000.0 + seq
    )
    return e.model_dump(mode="json")


def progress_path(engine, job_id: str) -> Path:  # type: ignore[no-untyped-def]
    with engine.session() as s:
        uri = s.get(Job, job_id).checkpoint_uri
    path = Path(progress_uri(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def stored(engine, job_id: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    with engine.session() as s:
        q = select(RunnerEventRecord.seq, RunnerEventRecord.kind).where(RunnerEventRecord.job_id == job_id)
        return sorted(s.execute(q).all())


def two_running_jobs(engine, fake):  # type: ignore[no-untyped-def]
    # Two jobs, so that the tick takes its batched path (one listing, events stored in one batch).
    return [engine.create_job(request(), user="alice", estimate=estimate_for(fake)).job_id for _ in range(2)]


def test_each_event_is_stored_and_announced_once_across_reads_and_restarts(engine, make_engine, fake):
    rec = Recorder(engine.bus)
    job_id, other = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    events = [ev(job_id, q) for q in range(5)]
    write(engine, path, job_id, events)
    engine.tick()
    engine.tick()  # the same object again: nothing new
    assert [q for q, _ in stored(engine, job_id)] == [0, 1, 2, 3, 4] and stored(engine, other) == []
    events += [ev(job_id, 5), ev(job_id, 6)]
    write(engine, path, job_id, events)
    engine.tick()
    assert [q for q, _ in stored(engine, job_id)] == list(range(7))
    view = engine.get_job(job_id)
    assert view.step == 60 and abs(view.loss - 2.4) < 1e-9
    assert [e.data["step"] for e in rec.events if e.kind == "progress"] == [0, 10, 20, 30, 40, 50, 60]
    restarted = make_engine()  # a new process: starts from the reads recorded in jobs.progress_window
    rec2 = Recorder(restarted.bus)
    restarted.tick()
    assert [q for q, _ in stored(restarted, job_id)] == list(range(7))
    assert [e for e in rec2.events if e.kind == "progress"] == []


def test_the_log_tells_a_burst_of_progress_by_its_newest_step(engine, fake):
    """A runner that reports hourly writes its steps in one burst, cut into bounded events; each is announced,
    and `tunebot serve`'s log printed the first ("step 192/1200" right before "Finished at step 1200"). It
    prints the newest: a line older than the step the job has recorded is not news."""
    import io

    from bot.chat.console import ConsoleNotifier
    from bot.chat.terminal import cli_console

    out = io.StringIO()
    ConsoleNotifier(engine, cli_console(out), progress_every_s=30.0).attach(engine.bus)
    job_id, _ = two_running_jobs(engine, fake)
    write(engine, progress_path(engine, job_id), job_id, [ev(job_id, q) for q in range(1, 5)])
    engine.tick()
    printed = [line for line in out.getvalue().splitlines() if f"[{job_id}] step" in line]
    assert len(printed) == 1 and "step 40" in printed[0], out.getvalue()


def test_a_resumed_run_renumbering_in_its_object_is_not_lost(engine, fake):
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    old = [ev(job_id, q, ts=100.0 + q) for q in range(1, 6)]
    write(engine, path, job_id, old)
    engine.tick()
    # The resumed runner keeps the events before its checkpoint (seq 3) and numbers again from there.
    resumed = [ev(job_id, 3, "started", ts=200.0), ev(job_id, 4, "finished", ts=201.0)]
    write(engine, path, job_id, old[:2] + resumed)
    engine.tick()
    assert stored(engine, job_id) == [
        (1, "progress"),
        (2, "progress"),
        (3, "started"),
        (4, "finished"),
        (5, "progress"),
    ]
    assert engine.get_job(job_id).state == "succeeded"


def test_an_object_in_another_layout_is_read_whole(engine, fake):
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    events = [ev(job_id, q) for q in range(3)]
    write(engine, path, job_id, events)
    engine.tick()
    events.append(ev(job_id, 3))
    write(engine, path, job_id, events, indent=2)  # not the runner's own layout: no tail shortcut
    engine.tick()
    assert [q for q, _ in stored(engine, job_id)] == [0, 1, 2, 3]


def _statements(engine) -> list[str]:  # type: ignore[no-untyped-def]
    from sqlalchemy import event

    seen: list[str] = []
    event.listen(engine.ctx.db, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_a_restarted_engine_does_not_check_what_it_had_read_again_and_misses_nothing(
    engine, make_engine, fake
):
    job_id, other = two_running_jobs(engine, fake)
    path, path2 = progress_path(engine, job_id), progress_path(engine, other)
    events = [ev(job_id, q) for q in range(30)]
    write(engine, path, job_id, events)
    write(engine, path2, other, [ev(other, q) for q in range(3)])
    engine.tick()
    with engine.session() as s:
        assert all(s.get(Job, j).progress_window for j in (job_id, other))

    restarted = make_engine()  # a new process, the objects unchanged since the last read
    rec = Recorder(restarted.bus)
    sql = _statements(restarted)
    restarted.tick()
    assert not [q for q in sql if "runner_events" in q], "an unchanged object was checked against the store"
    assert [e for e in rec.events if e.kind == "progress"] == []

    # The runner went on while no bot was up: after the next restart only those events are new.
    events += [ev(job_id, 30), ev(job_id, 31)]
    write(engine, path, job_id, events)
    again = make_engine()
    rec = Recorder(again.bus)
    again.tick()
    assert [q for q, _ in stored(again, job_id)] == list(range(32))
    assert [e.data["step"] for e in rec.events if e.kind == "progress"] == [300, 310]

    # A resumed run renumbering from its checkpoint, read first by yet another process, is not lost.
    write(
        engine,
        path,
        job_id,
        events[:20] + [ev(job_id, 20, "started", ts=5000.0), ev(job_id, 21, "finished", ts=5001.0)],
    )
    last = make_engine()
    last.tick()
    assert (20, "started") in stored(last, job_id) and (21, "finished") in stored(last, job_id)
    assert last.get_job(job_id).state == "succeeded"


def test_a_stored_window_that_is_not_ours_means_reading_the_object_whole(engine, fake):
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    write(engine, path, job_id, [ev(job_id, q) for q in range(3)])
    with engine.session() as s:
        s.get(Job, job_id).progress_window = "garbage from an older bot"
        s.commit()
    engine.tick()
    assert [q for q, _ in stored(engine, job_id)] == [0, 1, 2]


def test_the_engine_forgets_the_progress_objects_of_jobs_that_ended(engine, fake):
    job_id, other = two_running_jobs(engine, fake)
    for j in (job_id, other):
        write(engine, progress_path(engine, j), j, [ev(j, 0, "started")])
    engine.tick()
    assert {job_id, other} <= engine.ctx.memory.progress_seen.keys()
    engine.stop(job_id, user="alice")
    for _ in range(3):
        engine.tick()
    assert engine.get_job(job_id).state in ("stopped", "succeeded", "failed")
    mem = engine.ctx.memory
    assert job_id not in mem.progress_seen and job_id not in mem.progress_stat
    assert other in mem.progress_seen


def _forget_reads(engine, job_id: str) -> None:  # type: ignore[no-untyped-def]
    """As after the upgrade that added windows: the events are stored, no read of the object is recorded."""
    with engine.session() as s:
        s.get(Job, job_id).progress_window = None
        s.commit()


def _drop_stored(engine, job_id: str, seqs: list[int]) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import delete

    with engine.session() as s:
        s.execute(
            delete(RunnerEventRecord).where(
                RunnerEventRecord.job_id == job_id, RunnerEventRecord.seq.in_(seqs)
            )
        )
        s.commit()


def test_a_first_read_of_stored_events_parses_only_the_events_after_them(
    engine, make_engine, fake, monkeypatch
):
    from bot.engine.watching import progress

    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    events = [ev(job_id, q) for q in range(10)]
    write(engine, path, job_id, events)
    engine.tick()
    _forget_reads(engine, job_id)
    events += [ev(job_id, 10), ev(job_id, 11)]
    write(engine, path, job_id, events)
    fresh = make_engine()
    rec = Recorder(fresh.bus)
    wholes: list[bytes] = []
    monkeypatch.setattr(progress, "_loads", lambda raw: wholes.append(raw) or json.loads(raw))
    fresh.tick()
    assert [q for q, _ in stored(fresh, job_id)] == list(range(12))
    assert [e.data["step"] for e in rec.events if e.kind == "progress" and e.job_id == job_id] == [100, 110]
    assert wholes == [], "the object was parsed whole though its first ten events are stored"
    with fresh.session() as s:
        assert s.get(Job, job_id).progress_window.split(" ")[1:3] == ["0", "11"]


def test_a_first_read_of_stored_events_with_a_gap_or_older_events_reads_the_object_whole(
    engine, make_engine, fake
):
    job_id, other = two_running_jobs(engine, fake)
    for j in (job_id, other):
        write(engine, progress_path(engine, j), j, [ev(j, q) for q in range(10)])
    engine.tick()
    _drop_stored(engine, job_id, [5])  # a gap: seq 5 is not stored
    _drop_stored(engine, other, [0, 1, 2])  # the object starts before the stored events
    for j in (job_id, other):
        _forget_reads(engine, j)
        write(engine, progress_path(engine, j), j, [ev(j, q) for q in range(11)])
    fresh = make_engine()
    fresh.tick()
    for j in (job_id, other):
        assert [q for q, _ in stored(fresh, j)] == list(range(11))


def test_a_first_read_of_stored_events_keeps_a_resumed_runs_renumbered_events(engine, make_engine, fake):
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    old = [ev(job_id, q, ts=100.0 + q) for q in range(1, 6)]
    write(engine, path, job_id, old)
    engine.tick()
    _forget_reads(engine, job_id)
    resumed = [ev(job_id, 3, "started", ts=200.0), ev(job_id, 4, "finished", ts=201.0)]
    write(engine, path, job_id, old[:2] + resumed)
    fresh = make_engine()
    fresh.tick()
    assert stored(fresh, job_id) == [
        (1, "progress"),
        (2, "progress"),
        (3, "started"),
        (4, "finished"),
        (5, "progress"),
    ]
    assert fresh.get_job(job_id).state == "succeeded"


def test_a_first_read_of_stored_events_still_refuses_a_forged_newer_event(engine, make_engine, fake):
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    events = [ev(job_id, q) for q in range(5)]
    write(engine, path, job_id, events)
    engine.tick()
    _forget_reads(engine, job_id)
    payload = json.loads(path.read_text())
    forged = {**payload["events"][-1], "seq": 5, "kind": "finished", "timestamp": 2000.0}
    payload["events"].append(forged)  # the MAC of seq 4's event: not this one's
    path.write_text(json.dumps(payload))
    fresh = make_engine()
    fresh.tick()
    assert [q for q, _ in stored(fresh, job_id)] == list(range(5))
    assert fresh.get_job(job_id).state == "running"


def test_a_window_recorded_with_another_digest_reads_the_object_from_its_tail(engine, make_engine, fake):
    import hashlib

    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    events = [ev(job_id, q) for q in range(5)]
    write(engine, path, job_id, events)
    engine.tick()
    with engine.session() as s:  # as an older bot recorded it (blake2b)
        job = s.get(Job, job_id)
        old = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
        job.progress_window = " ".join([old, *job.progress_window.split(" ")[1:]])
        s.commit()
    events.append(ev(job_id, 5))
    write(engine, path, job_id, events)
    fresh = make_engine()
    rec = Recorder(fresh.bus)
    fresh.tick()
    assert [q for q, _ in stored(fresh, job_id)] == list(range(6))
    assert [e.data["step"] for e in rec.events if e.kind == "progress" and e.job_id == job_id] == [50]


def test_a_tick_with_no_object_changed_reads_none_and_asks_the_store_nothing_for_them(
    engine, fake, monkeypatch
):
    """An unchanged object on this machine, or one not written yet, costs one stat (at 10,000 running jobs
    nearly all are unchanged): not read, no run key or stored window looked up; a write is read at once."""
    from bot.engine.watching import progress

    job_id, other = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    write(engine, path, job_id, [ev(job_id, q) for q in range(3)])
    engine.tick()
    reads: list[str] = []
    real_read = progress.read_raw
    monkeypatch.setattr(progress, "read_raw", lambda uri: reads.append(uri) or real_read(uri))
    sql = _statements(engine)
    engine.tick()
    assert reads == [] and not [q for q in sql if "runner_events" in q or "job_runs" in q]
    write(engine, path, job_id, [ev(job_id, q) for q in range(5)])
    engine.tick()
    assert reads == [str(path)]
    assert [q for q, _ in stored(engine, job_id)] == [0, 1, 2, 3, 4]


def test_the_log_tells_each_report_while_the_heartbeat_runs_ahead_of_it(engine, fake):
    """`status` shows the step a runner's heartbeat claims where it is ahead of the reports; the serve log
    still tells each report as it comes (a report at step 40 is news though the beat says 500)."""
    import io

    from fakes.runner_events import job_key

    from bot.chat.console import ConsoleNotifier
    from bot.chat.terminal import cli_console
    from runner.contract import heartbeat

    out = io.StringIO()
    ConsoleNotifier(engine, cli_console(out), progress_every_s=0.0).attach(engine.bus)
    job_id, _ = two_running_jobs(engine, fake)
    path = progress_path(engine, job_id)
    for seq, beat_step in ((1, 100), (4, 500)):
        events = [{**ev(job_id, q), "max_steps": 1200} for q in range(1, seq + 1)]
        payload = {
            heartbeat.FIELD: heartbeat.Beat(job_id, 1000.0, seq, beat_step, 0.0).signed(
                job_key(engine, job_id)
            ),
            "job_id": job_id,
            "updated": time.time(),
            "last_seq": events[-1]["seq"],
            "events": signed_all(engine, events),
        }
        path.write_text(json.dumps(payload))
        engine.tick()
        assert engine.get_job(job_id).step == beat_step  # the beat, ahead of the report
        assert engine.get_job(job_id).reported_step == seq * 10
    printed = [line for line in out.getvalue().splitlines() if f"[{job_id}] step" in line]
    assert any("step 10/" in line for line in printed) and any("step 40/" in line for line in printed), (
        printed
    )
