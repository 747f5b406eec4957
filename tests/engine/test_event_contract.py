"""The runner's events fit the bot's limits by construction (issue 27, item 2).

On eac3cff the runner sent up to 512 chart points in one event (about 50 bytes each) while the bot refused
any event over 16 KB: when a few hundred steps passed between two reports, the report was refused and the
job's status froze (one 500-step job stopped at step 81). Now the limit is written once
(runner/contract/spec.py, the contract the bot imports) and the runner's Reporter splits a report into as many
events as it takes. Here the largest report a runner can make goes through the runner's own Reporter, over the
wire (a signed JSON body per event), into the bot's acceptance path (/runner/events' ``record_runner_event``):
every event is accepted, and the job's view and chart have every step.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from runner.contract.spec import (
    MAX_EVENT_BYTES,
    MAX_EVENT_POINTS,
    MAX_PROGRESS_BYTES,
    MAX_REPORT_POINTS,
    EventKind,
    JobSpec,
    thin_points,
)

from .conftest import estimate_for, request

WORST = -2.2250738585072014e-308  # the longest float repr there is (24 characters)


def _wire(spec: JobSpec) -> tuple[Any, list[dict[str, Any]]]:
    """A Reporter that posts to a mock receiver, and the JSON bodies it posted."""
    from runner.report import Reporter

    bodies: list[dict[str, Any]] = []

    def receive(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        return httpx.Response(200, json={"ok": True})

    wired = spec.model_copy(
        update={"report": spec.report.model_copy(update={"callback_url": "http://bot.test/runner/events"})}
    )
    from bot.engine.launching.integrity import MAX_STORED_EVENTS

    first = MAX_STORED_EVENTS - 50  # the longest seq the bot still keeps a row (and chart points) for
    return Reporter(wired, start_seq=first, transport=httpx.MockTransport(receive)), bodies


def test_the_largest_report_a_runner_can_send_is_accepted_whole(engine, fake, monkeypatch) -> None:
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    env = fake.launch_requests[-1].env
    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    monkeypatch.setenv("TUNEBOT_JOB_KEY", env["TUNEBOT_JOB_KEY"])  # the runner signs with its job's key
    reporter, bodies = _wire(spec)
    last = 10**9  # the largest step numbers a run could reach, the longest floats, NaN losses
    steps = range(last - 3 * MAX_REPORT_POINTS + 1, last + 1)  # more than one report may keep
    points = thin_points([(s, WORST if s % 7 else float("nan"), WORST) for s in steps])
    evals = thin_points([(s, WORST) for s in steps if s % 3 == 0])
    assert len(points) == MAX_REPORT_POINTS and points[-1][0] == last  # what the trainer hands the reporter
    longest = "\U0001f600" * 2000  # 2,000 characters, each 12 bytes of escaped JSON
    try:
        reporter.emit(
            EventKind.finished,
            step=last,
            max_steps=last,
            epoch=1e300,
            loss=WORST,
            learning_rate=WORST,
            tokens_per_second=WORST,
            tokens_seen=2**62,
            eta_seconds=WORST,
            points=points,
            evals=evals,
            message=longest,
            output_uri=f"{spec.output_uri}/" + "\u00e9" * 900,
            checkpoint_uri=f"{spec.checkpoint.uri}/checkpoint-{last}",
            wandb_note=longest,
            metrics={f"metric_{i:02d}": WORST for i in range(40)},
        )
    finally:
        reporter.close(timeout=30)
    assert len(bodies) > 1 and reporter.dropped == 0
    from runner.contract.integrity import canonical

    sizes = [len(canonical(b)) for b in bodies]
    assert max(sizes) <= MAX_EVENT_BYTES, sizes
    assert all(len(b.get("points") or []) <= MAX_EVENT_POINTS for b in bodies)
    # The bot's acceptance path, as /runner/events calls it: every event is accepted.
    for body in bodies:
        assert engine.record_runner_event(job.job_id, spec.report.token, body), body["seq"]
    view = engine.get_job(job.job_id)
    assert view.step == last and view.max_steps == last
    series = engine.series(job.job_id)
    assert [s for s, _ in series.train] == [p[0] for p in points if not math.isnan(p[1])]  # NaN: no dot
    assert [s for s, _ in series.lr] == [p[0] for p in points]  # every step, in order, the last exact
    assert bodies[-1]["kind"] == "finished" and bodies[-1]["output_uri"]

    # The bot keeps refusing anything bigger than the contract.
    from bot.engine.launching.integrity import refusal
    from runner.contract.integrity import EVENT, sign

    key = bytes.fromhex(env["TUNEBOT_JOB_KEY"])
    too_big = dict(bodies[-1])
    too_big.pop("mac")
    too_big["message"] = "x" * MAX_EVENT_BYTES
    assert refusal(key, sign(key, EVENT, too_big)) == "too_large"


def test_a_progress_object_of_the_largest_events_is_still_read() -> None:
    """The runner keeps its last 200 events in progress.json: even all at the limit, the bot reads it."""
    from runner.report import KEEP_EVENTS

    per_event = MAX_EVENT_BYTES + len(',"mac":""') + 64 + 2  # the MAC beside the fields, a comma between
    assert KEEP_EVENTS * per_event + 200 <= MAX_PROGRESS_BYTES


@pytest.mark.parametrize("count", [0, 1, MAX_EVENT_POINTS, MAX_EVENT_POINTS + 1, 5000])
def test_a_report_is_split_in_step_order_and_nothing_is_lost(count: int) -> None:
    from runner.contract.spec import event_bytes, report_events

    points = [(s, 1.0 / s, 1e-4) for s in range(1, count + 1)]
    evals = [(s, 2.0) for s in range(10, count + 1, 10)]
    events = report_events(
        "job-1", 7, EventKind.progress, {"step": count, "points": points, "evals": evals, "loss": 0.5}
    )
    assert [e.seq for e in events] == list(range(7, 7 + len(events)))
    assert all(event_bytes(e) <= MAX_EVENT_BYTES for e in events)
    assert [tuple(p) for e in events for p in e.points or []] == points
    assert [tuple(v) for e in events for v in e.evals or []] == evals
    assert [e.step for e in events] == sorted(e.step for e in events)
    assert events[-1].step == count and events[-1].loss == 0.5  # the report itself comes last


# ---- one event at the caps: the runner's largest is what the bot's ingest takes, one more is not ----------
KEY = bytes(range(32))


def _ingest(*bodies: dict[str, Any]) -> tuple[list[Any], dict[str, int]]:
    """The bot's ingest of signed bodies (bot/engine/launching/integrity.signed_events: the size cap, the MAC,
    the contract's own validation), as (accepted events, refused counts)."""
    from bot.engine.launching.integrity import signed_events
    from runner.contract.integrity import EVENT, sign

    events, refused = signed_events(KEY, "job-1", [sign(KEY, EVENT, b) for b in bodies])
    return events, dict(refused)


def _body(event: Any) -> dict[str, Any]:
    return event.model_dump(mode="json")


def test_the_largest_single_event_a_runner_sends_holds_the_point_cap_and_is_accepted() -> None:
    """MAX_EVENT_POINTS points with the widest step numbers that still fit MAX_EVENT_BYTES, beside every
    other field at its longest: the runner sends them in one event, the bot takes it whole."""
    from runner.contract.integrity import canonical
    from runner.contract.spec import (
        MAX_EVENT_METRICS,
        MAX_METRIC_NAME,
        MAX_URI_CHARS,
        event_bytes,
        report_events,
    )

    last = 10**6
    points = [(s, 0.5, None) for s in range(last - MAX_EVENT_POINTS + 1, last + 1)]
    fields = {
        "step": last,
        "max_steps": last,
        "loss": 0.5,
        "points": points,
        "output_uri": "s3://b/" + "o" * (MAX_URI_CHARS - len("s3://b/")),
        "metrics": {f"{i:02d}".ljust(MAX_METRIC_NAME, "m"): 1.0 for i in range(MAX_EVENT_METRICS)},
    }
    events = report_events("job-1", 0, EventKind.finished, fields)
    assert len(events) == 1, [event_bytes(e) for e in events]  # all of it in one event
    (largest,) = events
    assert len(largest.points or []) == MAX_EVENT_POINTS and len(largest.output_uri or "") == MAX_URI_CHARS
    assert len(largest.metrics or {}) == MAX_EVENT_METRICS
    assert event_bytes(largest) <= MAX_EVENT_BYTES and len(canonical(_body(largest))) == event_bytes(largest)
    accepted, refused = _ingest(_body(largest))
    assert refused == {} and len(accepted) == 1
    assert accepted[0].points == largest.points and accepted[0].output_uri == largest.output_uri
    assert accepted[0].metrics == largest.metrics  # within the bot's caps: nothing cut

    # One point more: the runner splits it into two events, which the bot takes, every point kept.
    more = [(last - MAX_EVENT_POINTS, 0.5, None), *points]
    split = report_events("job-1", 0, EventKind.finished, {**fields, "points": more})
    assert len(split) == 2 and all(len(e.points or []) <= MAX_EVENT_POINTS for e in split)
    accepted, refused = _ingest(*map(_body, split))
    assert refused == {} and [tuple(p) for e in accepted for p in e.points or []] == more

    # One point more in one event (not the runner's): signed and small enough, yet the bot does not take it.
    over = {**_body(largest), "points": [list(p) for p in more], "output_uri": None, "metrics": None}
    assert len(canonical(over)) <= MAX_EVENT_BYTES
    assert _ingest(over)[0] == []


def test_an_event_of_exactly_the_byte_cap_is_accepted_and_one_byte_more_is_refused() -> None:
    from runner.contract.integrity import canonical
    from runner.contract.spec import RunnerEvent

    base = _body(RunnerEvent(job_id="job-1", seq=3, kind=EventKind.progress, step=5, timestamp=1.0))
    pad = MAX_EVENT_BYTES - len(canonical({**base, "message": ""}))
    at_cap = {**base, "message": "x" * pad}
    assert len(canonical(at_cap)) == MAX_EVENT_BYTES
    accepted, refused = _ingest(at_cap)
    assert refused == {} and [e.seq for e in accepted] == [3]
    accepted, refused = _ingest({**base, "message": "x" * (pad + 1)})
    assert accepted == [] and refused == {"too_large": 1}
