"""Screens of what a team sees in Slack, rendered from the bot's own replies (scripts/blockkit_preview.py):
the App Home of an admin, a job's thread with its card and chart, the training chart, an estimate and the
weekly report. The figures are a made-up but plausible week; the rendering is the bot's code.

    python -m scripts.slack_screens OUT_DIR     # from the repository's root: the screens, as PNGs
"""

from __future__ import annotations

import math
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.chat import cards
from bot.chat.blockkit import to_home_view, to_message
from bot.chat.charts import spend_chart, training_chart
from bot.chat.dashboard import home_reply
from bot.chat.notifier import milestone_text
from bot.chat.weekly import weekly_reply
from bot.engine.api import (
    AuditEntry,
    BudgetView,
    Dashboard,
    FinishedJob,
    JobSeries,
    JobView,
    SpendPace,
    VolumeView,
    WeeklyReport,
)
from bot.engine.events import EngineEvent, EngineEventKind
from scripts.blockkit_preview import message_html, page, screenshot

NAMES = {"UALICE0001": "alice", "UBOB00002": "Bob Stone", "UADMIN003": "ada", "UCARL0004": "carl"}
NOW = datetime(2026, 12, 3, 10, 42, tzinfo=UTC)


def names(user: str) -> str:
    return NAMES.get(user, user)


def job(
    job_id: str, owner: str, model: str, method: str, gpu: str, provider: str, price: float, **kw
) -> JobView:  # noqa: ANN003
    base = dict(
        job_id=job_id,
        owner=owner,
        state="running",
        model=model,
        method=method,
        provider=provider,
        gpu=gpu,
        gpu_count=1,
        interruptible=True,
        price_per_hour=price,
        created_at=NOW - timedelta(hours=3),
        updated_at=NOW,
        channel="C1",
        thread_ts="1.1",
    )
    return JobView(**{**base, **kw})


def series() -> JobSeries:
    rng = random.Random(7)
    steps = range(1, 601)
    train = [(s, 1.15 + 0.95 * math.exp(-s / 90) + rng.gauss(0, 0.045)) for s in steps]
    evals = [(s, 1.22 + 0.9 * math.exp(-s / 95)) for s in range(50, 601, 50)]
    lr = [(s, 2e-4 * (s / 30 if s <= 30 else 0.5 * (1 + math.cos(math.pi * (s - 30) / 570)))) for s in steps]
    return JobSeries(
        job_id="q7b-0412",
        model="Qwen/Qwen2.5-7B",
        method="qlora",
        provider="vast",
        gpu="rtx-4090",
        gpu_count=1,
        interruptible=True,
        step=600,
        max_steps=600,
        train=train,
        eval=evals,
        lr=lr,
        preemptions=[312],
        resumes=[300],
    )


def dashboard() -> Dashboard:
    running = [
        job(
            "q7b-0412",
            "UALICE0001",
            "Qwen/Qwen2.5-7B",
            "qlora",
            "rtx-4090",
            "vast",
            0.34,
            spend=1.21,
            eta_seconds=5400,
            step=312,
            max_steps=600,
            loss=1.41,
        ),
        job(
            "l8b-0413",
            "UBOB00002",
            "meta-llama/Llama-3.1-8B",
            "lora",
            "a100-80gb",
            "runpod",
            1.19,
            spend=3.80,
            eta_seconds=9000,
            step=1200,
            max_steps=4000,
            loss=1.62,
            interruptible=False,
        ),
        job(
            "m7b-0414",
            "UCARL0004",
            "mistralai/Mistral-7B-v0.3",
            "qlora",
            "l40s",
            "tensordock",
            0.62,
            spend=0.45,
            eta_seconds=12600,
            step=90,
            max_steps=2000,
            loss=2.03,
        ),
    ]
    mine = [
        running[0],
        job(
            "q7b-0399",
            "UALICE0001",
            "Qwen/Qwen2.5-7B",
            "qlora",
            "rtx-4090",
            "vast",
            0.33,
            state="succeeded",
            spend=2.07,
            step=600,
            max_steps=600,
            loss=1.18,
        ),
    ]
    people = [
        SpendPace(
            scope="user",
            name="UBOB00002",
            month_to_date=48.10,
            projected_month=402.0,
            budget=300.0,
            per_hour_now=1.19,
        ),
        SpendPace(
            scope="user",
            name="UALICE0001",
            month_to_date=21.35,
            projected_month=176.0,
            budget=250.0,
            per_hour_now=0.34,
        ),
        SpendPace(
            scope="user",
            name="UCARL0004",
            month_to_date=6.02,
            projected_month=61.0,
            budget=None,
            per_hour_now=0.64,
        ),
    ]
    volume = VolumeView(
        provider="runpod",
        volume_id="vol-7f2",
        name="llama-8b-checkpoints",
        size_gb=200,
        price_per_gb_month=0.07,
        cost_per_month=14.0,
        cost_so_far=9.8,
        owner="UBOB00002",
        tracked=True,
        idle_since=NOW - timedelta(days=9),
    )
    return Dashboard(
        user="UADMIN003",
        is_admin=True,
        at=NOW,
        month_start=NOW.replace(day=1),
        days_in_month=31,
        mine=mine,
        running=running,
        per_hour_now=2.17,
        month_to_date=75.47,
        projected_month=639.0,
        people=people,
        teams=[
            SpendPace(
                scope="team",
                name="ml-research",
                month_to_date=75.47,
                projected_month=639.0,
                budget=800.0,
                per_hour_now=2.17,
            )
        ],
        idle_volumes=[volume],
        manageable=["runpod:vol-7f2"],
    )


def thread_html(chart: Path) -> str:
    card_job = job(
        "q7b-0412",
        "UALICE0001",
        "Qwen/Qwen2.5-7B",
        "qlora",
        "rtx-4090",
        "vast",
        0.34,
        spend=2.11,
        estimated_cost=2.02,
        max_cost=5.0,
        step=600,
        max_steps=600,
        loss=1.16,
        preemptions=1,
        state="succeeded",
        output_uri="s3://team-bucket/tunebot/q7b-0412/output",
    )
    card = message_html(to_message(cards.job_card(card_job), names=names)["blocks"], names, when="08:51")
    replies = []
    events = [
        (EngineEventKind.job_started, {}, "08:53"),
        (EngineEventKind.checkpoint, {"step": 150, "loss": 1.52}, "09:14"),
        (EngineEventKind.preempted, {"step": 312}, "09:38"),
        (EngineEventKind.recovered, {"step": 300}, "09:44"),
        (EngineEventKind.finished, {"step": 600, "loss": 1.16, "spend": 2.11}, "10:41"),
    ]
    for kind, data, when in events:
        message = (
            "the spot instance was reclaimed; relaunching on vast rtx-4090 and resuming"
            if kind == EngineEventKind.preempted
            else ""
        )
        text = milestone_text(EngineEvent(kind=kind, job_id="q7b-0412", data=data, message=message), card_job)
        replies.append(
            message_html([{"type": "section", "text": {"type": "mrkdwn", "text": text}}], names, when=when)
        )
    replies.append(message_html([{"type": "image", "image_url": chart.as_uri()}], names, when="10:41"))
    return card + '<div class="thread">' + "".join(replies) + "</div>"


def weekly() -> WeeklyReport:
    at = NOW - timedelta(days=2)
    return WeeklyReport(
        start=NOW - timedelta(days=9),
        end=NOW - timedelta(days=2),
        total=68.4,
        days=[(NOW - timedelta(days=9 - i)).strftime("%Y-%m-%d") for i in range(7)],
        daily_by_person={
            "UBOB00002": [3, 7.5, 9, 4, 11, 0, 2],
            "UALICE0001": [2.1, 0, 4.4, 6, 3, 1, 0],
            "UCARL0004": [0, 0, 1.2, 3.1, 5.6, 3.4, 2.0],
        },
        actions=[
            AuditEntry(
                at=at,
                actor="UALICE0001",
                action="launched",
                job_id="q7b-0399",
                target="Qwen/Qwen2.5-7B qlora",
                detail="vast rtx-4090, estimated $2.02",
            ),
            AuditEntry(
                at=at,
                actor="UBOB00002",
                action="launched",
                job_id="l70-0402",
                target="meta-llama/Llama-3.1-70B qlora",
                detail="runpod h100-80gb, estimated $61.40",
            ),
            AuditEntry(
                at=at,
                actor="UADMIN003",
                action="approved",
                job_id="l70-0402",
                target="meta-llama/Llama-3.1-70B qlora",
            ),
            AuditEntry(
                at=at,
                actor="UBOB00002",
                action="stopped",
                job_id="l70-0402",
                target="meta-llama/Llama-3.1-70B qlora",
            ),
            AuditEntry(
                at=at,
                actor="engine",
                action="stopped",
                job_id="m7b-0405",
                target="Mistral-7B qlora",
                detail="budget",
            ),
            AuditEntry(
                at=at,
                actor="UADMIN003",
                action="set budget",
                target="user UBOB00002",
                detail="monthly $300.00",
            ),
        ],
        finished=[
            FinishedJob(
                job_id="q7b-0399",
                owner="UALICE0001",
                model="Qwen/Qwen2.5-7B",
                method="qlora",
                state="succeeded",
                estimated_cost=2.02,
                actual_cost=2.07,
                estimated_hours=5.9,
                actual_hours=6.1,
            ),
            FinishedJob(
                job_id="l70-0402",
                owner="UBOB00002",
                model="meta-llama/Llama-3.1-70B",
                method="qlora",
                state="stopped",
                stop_reason="user",
                estimated_cost=61.4,
                actual_cost=22.9,
                estimated_hours=23.0,
                actual_hours=8.6,
            ),
        ],
        idle_volumes=[dashboard().idle_volumes[0]],
        budgets=[
            BudgetView(scope="user", name="UBOB00002", monthly=300.0, spent_month=48.1),
            BudgetView(scope="team", name="ml-research", monthly=800.0, spent_month=75.5),
        ],
    )


def main(out: Path) -> int:
    from bot.chat.cards import estimate_reply
    from bot.engine.launching.offers import snapshot_estimate as plan
    from bot.planner.request import EstimateRequest

    out.mkdir(parents=True, exist_ok=True)
    chart = training_chart(series(), out / "chart-training.png")
    home = to_home_view(home_reply(dashboard()), names=names)
    (out / "app-home.html").write_text(
        page(
            '<div style="display:flex;gap:16px;color:#616061;font-weight:700;margin-bottom:8px">'
            "<span style='color:#1d1c1d;border-bottom:2px solid #1d1c1d'>Home</span><span>About</span></div>"
            + blocks_only(home["blocks"]),
            "tunebot · App Home (an admin)",
        )
    )
    screenshot(out / "app-home.html", out / "app-home.png", height=1080)
    (out / "job-thread.html").write_text(page(thread_html(chart), "#ml-research · thread"))
    screenshot(out / "job-thread.html", out / "job-thread.png", height=1160)
    priced = plan(
        EstimateRequest(model="Qwen2.5-7B", method="qlora", tokens=20_000_000)
    )  # the dated snapshot
    estimate = to_message(estimate_reply(priced, estimate_id="e1", launching=True), names=names)
    (out / "estimate.html").write_text(
        page(message_html(estimate["blocks"], names), "#ml-research (only you)")
    )
    screenshot(out / "estimate.html", out / "estimate.png", height=1250)
    report = weekly()
    spend = spend_chart(
        out / "chart-spend.png",
        [d[5:] for d in report.days],
        report.daily_by_person,
        names=names,
        budget_per_day=800 / 30,
        title="Spend per day: $68.40",
    )
    body = message_html(to_message(weekly_reply(report), names=names)["blocks"], names, when="09:00")
    body += (
        '<div class="thread">'
        + message_html([{"type": "image", "image_url": spend.as_uri()}], names)
        + "</div>"
    )
    (out / "weekly-report.html").write_text(page(body, "#ml-spend"))
    screenshot(out / "weekly-report.html", out / "weekly-report.png", height=1180)
    for name in ("app-home", "job-thread", "estimate", "weekly-report"):
        (out / f"{name}.html").unlink()
    print("\n".join(str(p) for p in sorted(out.glob("*.png"))))
    return 0


def blocks_only(blocks: list) -> str:
    from scripts.blockkit_preview import blocks_html

    return blocks_html(blocks, names)


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "screens")))
