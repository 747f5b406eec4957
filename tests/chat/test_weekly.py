"""The weekly report in the summary channel: who did what by name, estimates against actuals as a table,
idle volumes, budgets, and the spend-per-day chart (people by name) in its thread."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from fakes.worlds import SlackStack

from bot.chat.blockkit import to_message, violations
from bot.chat.weekly import weekly_reply
from bot.engine.api import AuditEntry, BudgetView, FinishedJob, VolumeView, WeeklyReport
from bot.engine.events import EngineEvent, EngineEventKind

ALICE, BOB, ADMIN = "UALICE0001", "UBOB00002", "UADMIN003"


def report() -> WeeklyReport:
    at = datetime(2026, 12, 2, 14, 3, tzinfo=UTC)
    return WeeklyReport(
        start=datetime(2026, 11, 30, tzinfo=UTC),
        end=datetime(2026, 12, 7, tzinfo=UTC),
        total=42.5,
        days=[f"2026-{d}" for d in ("11-30", "12-01", "12-02", "12-03", "12-04", "12-05", "12-06")],
        daily_by_person={ALICE: [1, 2, 10, 0, 0, 4, 0], BOB: [0, 0, 5, 5, 15.5, 0, 0]},
        actions=[
            AuditEntry(
                at=at,
                actor=ALICE,
                action="launched",
                job_id="j1",
                target="Llama-3.1-8B qlora",
                detail="vast rtx-4090",
                amounts={"estimated": 3.2},
            ),
            AuditEntry(at=at, actor=ADMIN, action="approved", job_id="j2", target="Qwen2.5-72B lora"),
            AuditEntry(at=at, actor=BOB, action="stopped", job_id="j2", target="Qwen2.5-72B lora"),
            AuditEntry(at=at, actor="engine", action="stopped", job_id="j3", detail="budget"),
            AuditEntry(at=at, actor=BOB, action="kept volume", target="runpod:v1", days=7.0),
            AuditEntry(
                at=at, actor=ADMIN, action="set budget", target=f"user {BOB}", amounts={"monthly": 400.0}
            ),
        ],
        finished=[
            FinishedJob(
                job_id="j1",
                owner=ALICE,
                model="Llama-3.1-8B",
                method="qlora",
                state="succeeded",
                estimated_cost=3.2,
                actual_cost=2.9,
                estimated_hours=4.0,
                actual_hours=3.6,
            ),
            FinishedJob(
                job_id="j2",
                owner=BOB,
                model="Qwen2.5-72B",
                method="lora",
                state="stopped",
                stop_reason="user",
                estimated_cost=60.0,
                actual_cost=25.5,
                estimated_hours=20,
                actual_hours=8,
            ),
        ],
        idle_volumes=[
            VolumeView(
                provider="runpod",
                volume_id="v1",
                name="old-ckpts",
                size_gb=200,
                price_per_gb_month=0.07,
                cost_per_month=14.0,
                cost_so_far=3.0,
                owner=BOB,
                tracked=True,
                idle_since=datetime(2026, 11, 20, tzinfo=UTC),
            ),
        ],
        budgets=[
            BudgetView(scope="user", name=BOB, monthly=400.0, spent_month=120.0),
            BudgetView(scope="team", name="ml", monthly=1000.0, spent_month=300.0),
        ],
    )


def test_the_report_reads_as_people_and_fits_block_kit() -> None:
    message = to_message(weekly_reply(report()))
    assert violations(message) == []
    blocks = json.dumps(message["blocks"], ensure_ascii=False)
    assert "Weekly report 2026-11-30 to 2026-12-06: $42.50" in blocks
    assert f"<@{ALICE}> launched `j1` (Llama-3.1-8B qlora): vast rtx-4090, estimated $3.20" in blocks
    assert f"<@{ADMIN}> approved `j2`" in blocks and f"<@{BOB}> stopped `j2`" in blocks
    assert "tunebot stopped `j3`: budget" in blocks  # the engine's own stops
    assert f"<@{BOB}> kept volume runpod:v1: 7 days" in blocks
    assert f"<@{ADMIN}> set budget of <@{BOB}>: monthly $400.00" in blocks
    (table,) = [b for b in message["blocks"] if b["type"] == "table"]  # finished jobs: estimate vs actual
    header = [c["elements"][0]["elements"][0]["text"] for c in table["rows"][0]]
    assert header == ["job", "owner", "model", "state", "estimate", "actual", "Δ", "est. time", "time"]
    j2 = table["rows"][2]
    assert {"type": "user", "user_id": BOB} in j2[1]["elements"][0]["elements"]
    assert [c.get("text") for c in j2[4:7]] == ["$60.00", "$25.50", "-57%"]
    assert "old-ckpts" in blocks and "$14.00/month" in blocks and "Budgets used" in blocks
    assert "$3.20 vs $2.90 (-9%)" in blocks  # estimated vs actual over the jobs that ran to their end


def test_the_notifier_posts_it_with_the_spend_chart_by_name(slack_stack: SlackStack) -> None:
    stack = slack_stack
    data = {"report": report().model_dump(mode="json")}
    stack.engine.bus.publish(EngineEvent(kind=EngineEventKind.weekly_report, data=data))
    assert stack.notifier.drain(20)
    (posted,) = [c.body for c in stack.slack.of("chat.postMessage") if c.body["channel"] == "C_SUMMARY"]
    assert "Weekly report" in posted["text"] and not violations(posted)
    (complete,) = stack.slack.of("files.completeUploadExternal")
    assert complete.body["channel_id"] == "C_SUMMARY" and complete.body.get("thread_ts")
    assert stack.slack.of("upload")[0].raw.startswith(b"\x89PNG")
    assert {c.body.get("user") for c in stack.slack.of("users.info")} >= {ALICE, BOB}  # the legend's names
