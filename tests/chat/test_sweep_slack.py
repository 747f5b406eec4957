"""A sweep in Slack on the real engine and planner with an in-memory cloud: `/tune sweep` prices it, one
click launches it, and the channel gets one thread (the sweep's card, each run a line in it, edited in
place), not a thread per run: the stage decisions and the end (the runs compared, the chart, the winner) are
replies in it. `/tune compare` answers with the table and uploads its chart where it was typed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakes.worlds import estimate_id_from

from bot.chat.blockkit import violations
from runner.contract.spec import EventKind, RunnerEvent, RunResults


def _feed(
    engine: Any,
    job_id: str,
    seq: int,
    step: int,
    loss: float,
    *,
    last: bool = False,
    output: str | None = None,
) -> None:
    """The job's runner's reports: its eval at ``step``; ``last``: its results and the end (``output``: the
    output folder its run signed)."""
    from bot.engine.watching.runner_events import ingest

    events = [RunnerEvent(job_id=job_id, seq=seq, kind=EventKind.progress, step=step, evals=[(step, loss)])]
    if last:
        results = RunResults(eval_before=3.0, eval_after=loss, result_step=step, last_step=step)
        events.append(
            RunnerEvent(job_id=job_id, seq=seq + 1, kind=EventKind.results, step=step, results=results)
        )
        signed = {"output_uri": output, "manifest_sha256": "cd" * 32} if output else {}
        events.append(RunnerEvent(job_id=job_id, seq=seq + 2, kind=EventKind.finished, step=step, **signed))
    ingest(engine.ctx, job_id, events)


def _spec(cloud: Any, job_id: str) -> Any:
    from runner.contract.spec import JobSpec

    specs = [JobSpec.model_validate_json(r.env["TUNEBOT_JOB_SPEC"]) for r in cloud.launch_requests]
    return [s for s in specs if s.job_id == job_id][-1]


def test_one_thread_for_the_sweep_each_run_a_line(real_stack, tmp_path: Path) -> None:
    stack, engine, cloud = real_stack
    cloud.machines = 2  # the winner's output is measured again on another machine than its own
    data = tmp_path / "train.jsonl"
    record = {"instruction": "Say hi.", "input": "", "output": "Hi there! " * 20}
    data.write_text("\n".join(json.dumps(record) for _ in range(200)) + "\n")
    cmd = f"sweep Llama-3.1-8B method=qlora steps=16 dataset={data} lr=1e-4,2e-4 r=8,16 max_cost=$20"
    assert stack.command(cmd).status_code == 200
    priced = stack.responses(1)[0]
    assert not violations(priced) and "Sweep of 4 configurations" in priced["text"], priced
    assert "launch_sweep" in json.dumps(priced["blocks"])
    stack.click(stack.action_payload("launch_sweep", estimate_id_from(priced)))
    launched = stack.responses(2)[1]
    assert "Sweep *sw-" in launched["text"] and "launched: 4 runs" in launched["text"], launched
    jobs = engine.list_jobs()
    assert len(jobs) == 4 and cloud.creates == 4 and all(j.sweep_id for j in jobs)
    sweep_id = jobs[0].sweep_id
    runs = [r.job.job_id for r in engine.get_sweep(sweep_id).runs if r.job]
    # Stage 1 (step 4): two go on; stage 2 (step 8): one; it finishes at step 16 and wins.
    for i, job_id in enumerate(runs):
        _feed(engine, job_id, 1, 4, [2.0, 1.0, 3.0, 1.5][i])
    engine.tick()
    _feed(engine, runs[1], 2, 8, 0.9)
    _feed(engine, runs[3], 2, 8, 1.2)
    engine.tick()
    _feed(engine, runs[1], 3, 16, 0.8, last=True, output=_spec(cloud, runs[1]).output_uri)
    engine.tick()
    engine.tick()
    # Before it is named, the winner's output is measured again by a job that trains nothing.
    (checker,) = [j.job_id for j in engine.list_jobs() if j.job_id not in runs]
    assert _spec(cloud, checker).verify.job_id == runs[1]
    _feed(engine, checker, 1, 0, 0.81, last=True)
    engine.tick()
    engine.tick()
    assert engine.get_sweep(sweep_id).state == "done"
    assert stack.notifier.drain(30)

    sweep = engine.get_sweep(sweep_id)
    posts = [c.body for c in stack.slack.of("chat.postMessage")]
    roots = [p for p in posts if not p.get("thread_ts")]
    assert len(roots) == 1 and f"Sweep {sweep_id}" in roots[0]["text"], [p["text"] for p in roots]
    assert sweep.thread_ts and all(j.thread_ts is None for j in engine.list_jobs())  # no thread per run
    replies = [p["text"] for p in posts if p.get("thread_ts") == sweep.thread_ts]
    assert sum("stage 1 of 3" in t for t in replies) == 1 and sum("stage 2 of 3" in t for t in replies) == 1
    assert any(f"Winner: job {runs[1]}" in t for t in replies), replies
    assert any("measured again on the held-out split" in t and checker in t for t in replies), replies
    assert len(posts) <= 7  # the card, the two stages, the check, the end: not a line per step of every run
    card = stack.slack.of("chat.update")[-1].body
    assert card["ts"] == sweep.thread_ts and "done" in card["text"]
    assert all(job_id in json.dumps(card["blocks"]) for job_id in runs)  # each run a line of the card
    uploads = stack.slack.of("files.completeUploadExternal")
    assert uploads and any(sweep.thread_ts in json.dumps(u.body) for u in uploads)
    for message in stack.slack.messages():
        assert violations(message) == []

    # compare, typed in the channel: the table answers the person, the chart goes to the channel
    before = len(stack.slack.of("files.completeUploadExternal"))
    assert stack.command(f"compare {runs[1]} {runs[3]}").status_code == 200
    compared = stack.responses(3)[2]
    assert "2 runs side by side" in compared["text"] and not violations(compared)
    assert len(stack.slack.wait_for("files.completeUploadExternal", before + 1, timeout=30)) == before + 1
