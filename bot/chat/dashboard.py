"""App Home as the team's dashboard: the engine's Dashboard view -> a Reply (pure).

What is running now (owner, GPU, $/h, spend so far, ETA), spend per hour right now, the month to date and
its projection by person and team against budgets, idle volumes with their monthly cost and Delete /
Keep buttons, and the person's own jobs. App Home takes 100 blocks and no table blocks: lists are lines
of mrkdwn (people as mentions, which render as names there).
"""

from __future__ import annotations

from bot.chat.cards import STATE_EMOJI, duration, job_line, volume_buttons
from bot.chat.escaping import esc, mention
from bot.chat.replies import Button, Buttons, Context, Divider, Fields, Header, Reply, Table, Text
from bot.engine.api import Dashboard, JobView, SpendPace
from bot.money import money

MAX_RUNNING = 20
MAX_VOLUMES = 8
MAX_PEOPLE = 25


def used(amount: float, budget: float | None) -> str:
    return f"{amount / budget:.0%}" if budget else "-"


def running_line(job: JobView) -> str:
    """One running job: state, id, owner, model and method, GPU and cloud, $/h, spend so far, ETA, step."""
    where = "not placed yet"
    if job.provider:
        kind = "spot" if job.interruptible else "on-demand"
        where = esc(f"{job.gpu or '?'} x{job.gpu_count or 1} on {job.provider}") + f" ({kind})"
    price = f"{money(job.price_per_hour)}/h" if job.price_per_hour is not None else "-/h"
    step = f"step {job.step}" + (f"/{job.max_steps}" if job.max_steps else "")
    return (
        f"{STATE_EMOJI.get(job.state, '')} *{esc(job.job_id)}* {mention(job.owner)} · "
        f"{esc(job.model)} {esc(job.method)} · {where} · {price} · {money(job.spend)} so far · "
        f"ETA {duration(job.eta_seconds)} · {step}"
    )


def _pace_rows(paces: list[SpendPace], *, people: bool) -> list[list[str]]:
    return [
        [
            mention(p.name) if people else esc(p.name),
            money(p.month_to_date),
            money(p.projected_month),
            money(p.budget) if p.budget else "-",
            used(p.projected_month, p.budget),
            f"{money(p.per_hour_now)}/h",
        ]
        for p in paces[:MAX_PEOPLE]
    ]


def home_reply(d: Dashboard) -> Reply:
    reply = Reply(fallback="tunebot: your jobs and the team's spend")
    team = d.is_admin or d.team_view  # admins, and every member with TUNEBOT_TEAM_READ
    reply.add(Header("tunebot · team dashboard" if team else "tunebot"))
    scope = "Team" if team else "Your"
    mine = next((p for p in d.people if p.name == d.user), None)
    fields = [
        (f"{scope} spend now", f"{money(d.per_hour_now)}/h"),
        (f"{scope} month to date", money(d.month_to_date)),
        (f"{scope} projected month", money(d.projected_month)),
    ]
    if mine and mine.budget:
        fields.append(
            ("Your monthly budget", f"{money(mine.budget)} ({used(mine.month_to_date, mine.budget)} used)")
        )
    reply.add(Fields(fields))
    reply.add(
        Context(
            [f"projected: month to date + the last 7 days' daily pace for the {d.days_in_month}-day month"]
        )
    )
    reply.add(
        Buttons(
            [Button("Launch a fine-tune", "open_launch_modal", "home", style="primary")]
            + ([Button("Set a budget", "open_budget_modal", "budget")] if d.is_admin else [])
        )
    )
    reply.add(Divider())
    title = "Running now" if team else "Your running jobs"
    reply.add(Text(f"*{title}* ({len(d.running)})"))
    for job in d.running[:MAX_RUNNING]:
        reply.add(Text(running_line(job)))
    if len(d.running) > MAX_RUNNING:
        reply.add(Context([f"{len(d.running) - MAX_RUNNING} more running; `/tune jobs all` lists them"]))
    if not d.running:
        reply.add(Context(["Nothing is running."]))
    if team:
        reply.add(Divider())
        columns = ["month to date", "projected", "budget", "projected/budget", "now"]
        if d.people:
            reply.add(
                Table(["person", *columns], _pace_rows(d.people, people=True), title="This month by person")
            )
        if d.teams:
            reply.add(
                Table(["team", *columns], _pace_rows(d.teams, people=False), title="This month by team")
            )
    if d.idle_volumes:
        reply.add(Divider())
        total = sum(v.cost_per_month for v in d.idle_volumes)
        reply.add(Text(f"*Idle volumes* ({len(d.idle_volumes)}, {money(total)}/month)"))
        for volume in d.idle_volumes[:MAX_VOLUMES]:
            since = f"idle since {volume.idle_since:%Y-%m-%d}" if volume.idle_since else "idle"
            owner = f" · {mention(volume.owner)}" if volume.owner else ""
            reply.add(
                Text(
                    f":floppy_disk: *{esc(volume.name)}* on {esc(volume.provider)}{owner} · "
                    f"{volume.size_gb:g} GB · *{money(volume.cost_per_month)}/month* · {since}"
                )
            )
            if f"{volume.provider}:{volume.volume_id}" in d.manageable:
                reply.add(volume_buttons(volume))
        if len(d.idle_volumes) > MAX_VOLUMES:
            reply.add(Context([f"{len(d.idle_volumes) - MAX_VOLUMES} more idle volumes; `/tune volumes`"]))
    reply.add(Divider())
    reply.add(Text(f"*Your jobs* (latest {len(d.mine)})"))
    for job in d.mine:
        reply.add(Text(job_line(job)))
    if not d.mine:
        reply.add(
            Text("No jobs yet. Try `/tune estimate Llama-3.1-8B method=qlora` or *Launch a fine-tune*.")
        )
    reply.add(Context([f"updated {d.at:%Y-%m-%d %H:%M} UTC · `/tune help` for commands"]))
    return reply
