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
    from bot.engine.integrity import MAX_STORED_EVENTS

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
    from bot.engine.integrity import refusal
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
