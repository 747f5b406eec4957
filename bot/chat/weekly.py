"""The weekly report as people read it: the engine's WeeklyReport -> a Reply (pure). Its spend chart is
drawn by charts.spend_chart and posted next to it by the notifier."""

from __future__ import annotations

from bot.chat.cards import hours
from bot.chat.escaping import esc, mention
from bot.chat.replies import Context, Fields, Header, Reply, Table, Text
from bot.engine.api import AuditEntry, FinishedJob, WeeklyReport
from bot.engine.permissions import ENGINE
from bot.money import money

MAX_ACTION_LINES = 30
MAX_FINISHED = 40


def who(actor: str) -> str:
    return "tunebot" if actor in (ENGINE, "monitor", "scheduler", "reconciler") else mention(actor)


def action_line(entry: AuditEntry) -> str:
    """'Tue 12-02 14:03 @alice launched `j1` (Llama-3.1-8B qlora): vast rtx-4090, estimated $3.20'"""
    if entry.job_id:
        target = f" `{esc(entry.job_id)}`" + (f" ({esc(entry.target)})" if entry.target else "")
    elif entry.action == "set budget" and (entry.target or "").startswith("user "):
        target = f" of {mention((entry.target or '')[5:])}"
    else:
        target = f" {esc(entry.target)}" if entry.target else ""
    said = [entry.detail] if entry.detail else []
    said += [f"{k} {money(v)}" for k, v in entry.amounts.items()]
    if entry.days is not None:
        said.append(f"{entry.days:g} days")
    detail = f": {esc(', '.join(said))}" if said else ""
    return f"{entry.at:%a %m-%d %H:%M} {who(entry.actor)} {entry.action}{target}{detail}"


def _delta(estimate: float | None, actual: float) -> str:
    if not estimate:
        return "-"
    return f"{(actual - estimate) / estimate:+.0%}"


def _finished_row(job: FinishedJob) -> list[str]:
    state = job.state + (f" ({job.stop_reason})" if job.stop_reason else "")
    return [
        esc(job.job_id),
        mention(job.owner),
        esc(f"{job.model} {job.method}"),
        esc(state),
        money(job.estimated_cost) if job.estimated_cost is not None else "-",
        money(job.actual_cost),
        _delta(job.estimated_cost, job.actual_cost),
        hours(job.estimated_hours),
        hours(job.actual_hours),
    ]


def weekly_reply(report: WeeklyReport) -> Reply:
    first, last = report.days[0], report.days[-1]
    title = f"Weekly report {first} to {last}: {money(report.total)}"
    reply = Reply(fallback=title, public=True)
    reply.add(Header(title))
    done = [j for j in report.finished if j.state == "succeeded" and j.estimated_cost is not None]
    estimated = sum(j.estimated_cost or 0.0 for j in done)  # jobs that ran to their end: comparable
    actual = sum(j.actual_cost for j in done)
    idle_cost = sum(v.cost_per_month for v in report.idle_volumes)
    fields = [
        ("Spent", money(report.total)),
        ("Jobs finished", str(len(report.finished))),
        (
            "Estimated vs actual (completed)",
            f"{money(estimated)} vs {money(actual)} ({_delta(estimated, actual)})" if done else "-",
        ),
        ("Idle volumes", f"{len(report.idle_volumes)} ({money(idle_cost)}/month)"),
    ]
    reply.add(Fields(fields))
    if report.finished:
        rows = [_finished_row(j) for j in report.finished[:MAX_FINISHED]]
        columns = ["job", "owner", "model", "state", "estimate", "actual", "Δ", "est. time", "time"]
        reply.add(Table(columns, rows, title="Finished jobs: estimate against actual cost and time"))
        if len(report.finished) > MAX_FINISHED:
            reply.add(Context([f"{len(report.finished) - MAX_FINISHED} more finished jobs"]))
    reply.add(Text("*Who launched, approved and stopped what*"))
    lines = [action_line(a) for a in report.actions[-MAX_ACTION_LINES:]]
    reply.add(Text("\n".join(lines) if lines else "Nothing was launched, approved or stopped."))
    if len(report.actions) > MAX_ACTION_LINES:
        reply.add(Context([f"{len(report.actions) - MAX_ACTION_LINES} earlier actions not shown"]))
    if report.budgets:
        rows = [
            [
                esc(b.scope),
                mention(b.name) if b.scope == "user" else esc(b.name),
                money(b.monthly) if b.monthly else "-",
                money(b.spent_month),
                f"{b.spent_month / b.monthly:.0%}" if b.monthly else "-",
            ]
            for b in report.budgets[:25]
        ]
        reply.add(Table(["scope", "name", "monthly", "this month", "used"], rows, title="Budgets used"))
    if report.idle_volumes:
        lines = [
            f":floppy_disk: *{esc(v.name)}* on {esc(v.provider)}"
            + (f" ({mention(v.owner)})" if v.owner else "")
            + f": {v.size_gb:g} GB, *{money(v.cost_per_month)}/month*"
            + (f", idle since {v.idle_since:%Y-%m-%d}" if v.idle_since else "")
            for v in report.idle_volumes[:15]
        ]
        reply.add(Text("*Idle volumes*\n" + "\n".join(lines)))
    reply.add(
        Context(["Spend per day by person: the chart below. `/tune volumes` deletes or keeps volumes."])
    )
    return reply
