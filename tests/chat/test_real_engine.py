"""Slack end to end on the real Engine (SQLite, real planner) with an in-memory cloud provider.

/tune estimate -> Launch cheapest (clicked twice, once as a retry) -> one job, its thread card with the ts
kept in the database -> runner events pushed to /runner/events with the job's token -> a throttled card,
milestones, the loss chart and the finish with its cost in the thread.
"""

from __future__ import annotations

import json
from pathlib import Path

from fakes.runner_events import signed
from fakes.worlds import estimate_id_from, join_finisher, listeners_settled

from bot.chat.blockkit import violations


def test_slack_launch_and_progress_on_the_real_engine(real_stack, tmp_path: Path) -> None:
    stack, engine, cloud = real_stack
    data = tmp_path / "train.jsonl"
    record = {"instruction": "Say hi.", "input": "", "output": "Hi there! " * 20}
    data.write_text("\n".join(json.dumps(record) for _ in range(200)) + "\n")
    cmd = f"estimate Llama-3.1-8B method=qlora epochs=2 dataset={data}"
    ack = stack.command(cmd)  # the ack says the work started; the answer comes later (the ack's timing:
    assert ack.status_code == 200 and "Estimating" in ack.json()["text"]  # test_slack_http, on an event)
    estimate = stack.responses(1)[0]
    assert not violations(estimate) and "vast" in str(estimate["blocks"])
    eid = estimate_id_from(estimate)
    click = stack.action_payload("launch_cheapest", eid)
    stack.click(click)
    stack.click(click, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})
    stack.click(stack.action_payload("launch_cheapest", eid))  # a double click
    replies = [r["text"] for r in stack.responses(4)[1:]]
    assert sum("Launching job" in t for t in replies) == 1, replies
    assert sum("Already launched" in t for t in replies) == 2, replies
    (job,) = engine.list_jobs()
    assert cloud.creates == 1 and job.state == "running"

    listeners_settled()  # the click's task announces the launch after it replied: the card is queued then
    stack.notifier.drain()
    job = engine.get_job(job.job_id)
    assert job.channel == "C1" and job.thread_ts  # the thread's ts is kept in the database
    card = stack.slack.of("chat.postMessage")[0].body
    assert card["channel"] == "C1" and f"Job {job.job_id}" in card["text"]

    spec = json.loads(cloud.launch_requests[0].env["TUNEBOT_JOB_SPEC"])
    token = spec["report"]["token"]
    url = stack.url + "/runner/events"
    assert (
        stack.http.post(
            url,
            json={"job_id": job.job_id, "seq": 0, "kind": "started"},
            headers={"Authorization": "Bearer wrong"},
        ).status_code
        == 401
    )
    events = [{"job_id": job.job_id, "seq": 0, "kind": "started", "max_steps": 20}]
    events += [
        {
            "job_id": job.job_id,
            "seq": i,
            "kind": "progress",
            "step": i,
            "max_steps": 20,
            "loss": 3.0 - i * 0.1,
            "eta_seconds": 20 - i,
        }
        for i in range(1, 20)
    ]
    events += [
        {
            "job_id": job.job_id,
            "seq": 20,
            "kind": "checkpoint",
            "step": 19,
            "max_steps": 20,
            "loss": 1.1,
            "checkpoint_uri": spec["checkpoint"]["uri"] + "/checkpoint-19",
        },
        {
            "job_id": job.job_id,
            "seq": 21,
            "kind": "finished",
            "step": 20,
            "max_steps": 20,
            "loss": 1.0,
            "output_uri": spec["output_uri"],
        },
    ]
    for ev in events:  # as the job's runner sends them: signed with the job's key
        auth = {"Authorization": f"Bearer {token}"}
        assert stack.http.post(url, json=signed(engine, ev), headers=auth).status_code == 200
    engine.tick()
    join_finisher(job.job_id)  # a pushed "finished" may end the job in a thread: it announces after commit
    assert stack.notifier.drain(20)
    job = engine.get_job(job.job_id)
    assert job.state == "succeeded"
    thread = [c.body for c in stack.slack.of("chat.postMessage") if c.body.get("thread_ts") == job.thread_ts]
    text = " | ".join(m["text"] for m in thread)
    assert "Checkpoint saved at step 19" in text and "Finished at step 20" in text
    assert spec["output_uri"] in text
    assert "cost *$" in text
    updates = stack.slack.of("chat.update")
    assert 1 <= len(updates) <= 8  # 21 progress events, throttled, plus milestone edits
    assert "succeeded" in updates[-1].body["text"]
    assert stack.slack.of("files.completeUploadExternal")
    for message in stack.slack.messages():
        assert violations(message) == []


def test_launch_form_and_app_home_on_the_real_engine(real_stack, tmp_path: Path) -> None:
    """The launch form priced by the real planner and launched by the real engine; then App Home from the
    engine's own dashboard for an admin, the owner and another member."""
    from .test_app_home import open_home, text
    from .test_launch_form import ALICE, submission

    stack, engine, cloud = real_stack
    data = tmp_path / "chat.jsonl"
    record = {"instruction": "Say hi.", "input": "", "output": "Hi there! " * 20}
    data.write_text("\n".join(json.dumps(record) for _ in range(100)) + "\n")
    assert stack.command("launch", user=ALICE).status_code == 200
    view = stack.slack.wait_for("views.open")[0].body["view"]
    typed = {"model": "Llama-3.1-8B", "dataset": str(data), "method": "qlora", "seq": "2k", "max_cost": "$20"}
    assert stack.click(submission(view, **typed)).json()["response_action"] == "update"
    estimated = stack.slack.wait_for("views.update", timeout=30)[0].body["view"]
    assert estimated["submit"]["text"] == "Launch" and "vast" in json.dumps(estimated["blocks"])
    stack.click(submission(estimated, **typed, offer="cheapest"))
    done = stack.slack.wait_for("views.update", 2, timeout=30)[1].body["view"]
    assert done["title"]["text"] == "Launched", done
    (job,) = engine.list_jobs()
    assert job.owner == ALICE and job.state == "running" and cloud.creates == 1 and job.max_cost == 20.0
    assert stack.notifier.drain()
    assert stack.slack.of("chat.postMessage")[0].body["channel"] == "C1"

    admin = text(open_home(stack, "U_ADMIN"))
    assert "team dashboard" in admin and f"*{job.job_id}* <@{ALICE}>" in admin and "on vast" in admin
    owner = text(open_home(stack, ALICE))
    assert "*Your running jobs* (1)" in owner and job.job_id in owner
    member = text(open_home(stack, "UBOB00002"))
    assert "*Your running jobs* (0)" in member and job.job_id not in member
