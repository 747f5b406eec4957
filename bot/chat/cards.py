"""Replies built from the engine's view models: estimates, job cards, spend, volumes, budgets, help.

Every function here is pure (view model in, neutral Reply out), so Slack, the console and the
tests render exactly the same content.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from bot.chat.escaping import esc, mention
from bot.chat.grammar import COMMAND_USAGE, KEYS_HELP, usage_for
from bot.chat.replies import (
    Button,
    Buttons,
    Confirm,
    Context,
    Fields,
    Header,
    Image,
    Part,
    Reply,
    Table,
    Text,
    text_reply,
)
from bot.engine.api import (
    BudgetView,
    CalibrationView,
    CompareView,
    JobView,
    PriceList,
    SpendLine,
    SpendReport,
    SweepEstimate,
    SweepRunView,
    SweepView,
    VolumeView,
)
from bot.engine.record.jobstate import ACTIVE, OPEN, resumable
from bot.engine.record.results import how_to_load
from bot.money import money
from bot.planner.gpus import GPUS
from bot.planner.offer import Offer
from bot.planner.ranges import top_coverage
from bot.planner.result import Estimate, RankedOffer, SpeedEstimate
from bot.planner.training import describe as describe_plan
from runner.contract.phases import LABELS as PHASE_LABELS
from runner.contract.phases import PHASES
from runner.contract.spec import RunResults

MAX_OFFER_ROWS = 15
MAX_JOB_ROWS = 40
MAX_VOLUME_ROWS = 40
OFFER_COLUMNS = ["#", "provider", "gpu", "memory", "type", "$/h", "hours", "total", "label"]
# Rejections that only say the offer is not what was asked (another GPU count, type or class): the
# detailed view counts them instead of listing them.
ASKED_FILTERS = ("gpu_count", "gpu", "class")
STATE_EMOJI = {
    "pending_approval": ":hourglass:",
    "approved": ":hourglass:",
    "launching": ":rocket:",
    "running": ":zap:",
    "recovering": ":warning:",
    "succeeded": ":white_check_mark:",
    "failed": ":x:",
    "cancelled": ":octagonal_sign:",
    "stopped": ":octagonal_sign:",
}


def gigabytes(gb: float) -> str:
    if gb >= 0.1 or gb == 0:
        return f"{gb:.1f} GB"
    return f"{gb * 1000:.1f} MB" if gb >= 0.0001 else f"{gb * 1e6:.0f} KB"


def hours(h: float | None) -> str:
    if h is None:
        return "-"
    if h < 1:
        return f"{h * 60:.0f} min" if h * 60 >= 1 else f"{h * 3600:.0f} s"
    return f"{h:.1f} h"


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else hours(seconds / 3600)


def count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def span(point: str, bounds: list[float] | None, fmt) -> str:
    """'7.9 GB (7.3-8.6)': a point estimate with its range when it has one."""
    if not bounds:
        return point
    return f"{point} ({fmt(bounds[0])}-{fmt(bounds[1])})"


def cost_span(o: RankedOffer) -> str:
    return span(money(o.total_cost), o.total_cost_range, money)


def _kind(o: RankedOffer) -> str:
    return "spot" if o.interruptible else "on-demand"


def memory_margin(o: RankedOffer) -> str:
    """'needs 18-22 GB of 24' per GPU (the memory range against the card), flagged when the top is within 10%
    of the card: the runner would then back off (smaller micro-batches) or move to a bigger GPU."""
    if not o.memory_need_gb:
        return "-"
    low, high = o.memory_need_gb
    text = f"needs {low:.1f}-{high:.1f} GB of {o.memory_capacity_gb or o.gpu_memory_gb:.1f}"
    return text + " :warning: tight" if o.memory_tight else text


def _offer_row(i: int, o: RankedOffer) -> list[str]:
    return [
        str(i),
        esc(o.provider),
        esc(f"{o.gpu} x{o.gpu_count}"),
        memory_margin(o),
        _kind(o),
        money(o.price_per_hour),
        hours(o.hours),
        cost_span(o),
        esc(_offer_note(o)),
    ]


def _offer_note(o: RankedOffer) -> str:
    """Labels of a launchable pick; what it takes to launch a fitting offer elsewhere; or why not."""
    if o.labels:
        return ", ".join(o.labels)
    if not o.fits:
        return f"no: {o.reason}"
    return o.reason if o.reason.startswith("fits; set ") else ""


def labelled(estimate: Estimate, label: str) -> RankedOffer | None:
    """The offer carrying ``label`` (labels go only to offers this bot can launch), or None."""
    return next((o for o in estimate.offers if o.fits and label in o.labels), None)


def shown_offers(estimate: Estimate) -> list[RankedOffer]:
    """The rows of the offer table: fitting offers first, then rejected ones, at most MAX_OFFER_ROWS, and
    always every labelled (launchable) offer, so each launch button points at a row people can see."""
    fitting = [o for o in estimate.offers if o.fits]
    rows = (fitting + [o for o in estimate.offers if not o.fits])[:MAX_OFFER_ROWS]
    extra = [o for o in fitting if o.labels and all(o is not r for r in rows)]
    return rows[: MAX_OFFER_ROWS - len(extra)] + extra if extra else rows


def estimate_reply(
    estimate: Estimate, *, estimate_id: str | None, launching: bool = False, detailed: bool = False
) -> Reply:
    """Header, memory breakdown, ranked offers, assumptions, and the launch buttons.

    ``detailed`` is the command line's view of the same estimate, with room for more: exact parameter
    counts, the memory breakdown as a table, the step time and the whole calibration note, fitting and
    rejected offers apart (offers the ask itself filtered out only counted), and every assumption.
    """
    m = estimate.model
    reply = Reply(fallback=_estimate_fallback(estimate))
    reply.add(Header(f"{esc(m.name)} · {estimate.method} · {count(m.parameters)} params"))
    if detailed:
        reply.add(Text(_model_line(estimate)))
    reply.add(Fields(_estimate_fields(estimate)))
    for warning in estimate.warnings:
        reply.add(Text(f":warning: {esc(warning)}"))
    if detailed:
        reply.add(_memory_table(estimate), Text(_speed_line(estimate)))
        if estimate.speed.calibration:
            reply.add(Text(esc(estimate.speed.calibration)))
    else:
        breakdown = " · ".join(f"{esc(k)} {gigabytes(v)}" for k, v in estimate.memory.breakdown_gb.items())
        reply.add(Text(f"*Memory breakdown:* {breakdown}" if breakdown else "*Memory breakdown:* -"))
    if estimate.training is not None:
        plan = " · ".join(f"{esc(k)} {esc(v)}" for k, v in describe_plan(estimate.training))
        reply.add(Text(f"*Training:* {plan}"))
    fitting = [o for o in estimate.offers if o.fits]
    shown = shown_offers(estimate)
    if detailed:
        reply.add(*_offer_tables(estimate))
    elif shown:
        reply.add(
            Table(
                OFFER_COLUMNS,
                [_offer_row(i + 1, o) for i, o in enumerate(shown)],
                title=f"Offers ranked by expected total cost ({len(fitting)} fit)",
            )
        )
        if len(estimate.offers) > len(shown):
            reply.add(Context([f"{len(estimate.offers) - len(shown)} more offers not shown"]))
    else:
        reply.add(Text(":warning: No offers to show."))
    tight = tight_warning(estimate)
    if tight:
        reply.add(Context([tight]))
    if not fitting and estimate.suggestions:
        reply.add(Text("*Nothing fits. Try:*\n" + "\n".join(f"• {esc(s)}" for s in estimate.suggestions[:8])))
    reply.add(*_assumptions(estimate, detailed=detailed))
    buttons = launch_buttons(estimate, estimate_id, shown) if estimate_id else []
    if len(buttons) > 1:  # more than Cancel
        reply.add(Buttons(buttons))
        if launching:
            reply.add(Context(["Pick an offer to launch, or Cancel."]))
    elif fitting and launching:
        reply.add(Context(["No offer here can be launched by this bot: " + esc(_offer_note(fitting[0]))]))
    return reply


def tight_warning(estimate: Estimate) -> str | None:
    """A warning when a recommended offer's memory range tops out within 10% of its GPU's memory."""
    picks = [o for o in estimate.offers if o.fits and o.labels and o.memory_tight and o.memory_need_gb]
    if not picks:
        return None
    o = picks[0]
    return (
        f":warning: {esc(o.gpu)} ({', '.join(o.labels)}) is tight: the job needs up to "
        f"{o.memory_need_gb[1]:.1f} of its {o.memory_capacity_gb or o.gpu_memory_gb:.1f} GB. If it runs out, "
        "the runner halves the micro-batch (same results, slower) and, failing that, the job moves to a GPU "
        "with more memory."
    )


def _estimate_fields(estimate: Estimate) -> list[tuple[str, str]]:
    m, mem, t, s = estimate.model, estimate.memory, estimate.time, estimate.speed
    return [
        (
            "Memory (host RAM)" if s.gpu == "cpu" else "Memory per GPU",
            _memory_span(estimate) + f" on {mem.gpus} GPU(s), sharding {mem.sharding}",
        ),
        (
            "Compute time",
            span(hours(t.hours), t.hours_range, hours) + f" on {esc(s.gpu)} x{s.gpus}"
            if s.fits
            else f"none: it does not fit {esc(s.gpu)} x{s.gpus} (if it did: {hours(t.hours)}); see what fits",
        ),
        (
            "Tokens",
            f"{count(t.tokens)} x {t.epochs:.3g} epoch(s) = {t.steps} steps ({esc(t.token_source)})"
            + (f"; {t.evaluations} eval passes ({hours(t.eval_hours)})" if t.evaluations else ""),
        ),
        (
            "Throughput",
            span(f"{count(s.tokens_per_second)} tokens/s", s.tokens_per_second_range, count)
            + f", {_mfu(s)}"
            + ("" if s.fits else " (if it fitted)")
            + (f"; {esc(_calibrated(estimate))}" if s.calibration else ""),
        ),
        ("Trainable", f"{count(m.trainable_parameters)} of {count(m.parameters)} parameters"),
        *([("Disk", _disk_line(estimate))] if estimate.disk is not None else []),
    ]


def _memory_span(estimate: Estimate) -> str:
    """'7.9 GB (7.1-9.7; the top covers 97% of measured runs)': the top is what fitting is judged on, and a
    promise: the share of published runs held under it, each source left out whole (bot/planner/ranges.py).
    On the CPU (host RAM) no run measured it: the range alone."""
    mem = estimate.memory
    point, bounds = f"{mem.per_gpu_gb:.1f} GB", mem.per_gpu_gb_range
    if not bounds or estimate.speed.gpu == "cpu":
        return span(point, bounds, lambda v: f"{v:.1f}")
    return f"{point} ({bounds[0]:.1f}-{bounds[1]:.1f}; the top {top_coverage()})"


def _disk_line(estimate: Estimate) -> str:
    """'200 GB asked: weights 141.1 · image 12 · checkpoints 2.5 · ...' (bot/planner/disk.py)."""
    assert estimate.disk is not None
    parts = sorted(estimate.disk.breakdown_gb.items(), key=lambda kv: -kv[1])
    return f"{estimate.disk.gb:.0f} GB asked of each host: " + " · ".join(
        f"{esc(k)} {v:.1f}" for k, v in parts if v >= 0.05
    )


def _model_line(estimate: Estimate) -> str:
    """'*Qwen/Qwen2.5-7B* (qwen2): 7,615,616,512 parameters; qlora: 40,370,176 trainable' (exact counts)."""
    m = estimate.model
    active = f", {m.active_parameters:,} active" if m.active_parameters != m.parameters else ""
    return (
        f"*{esc(m.name)}* ({esc(m.architecture)}): {m.parameters:,} parameters{active}; "
        f"{estimate.method}: {m.trainable_parameters:,} trainable"
    )


def _memory_table(estimate: Estimate) -> Table:
    """Peak memory per GPU by component, in GB with two decimals, and the total."""
    mem = estimate.memory
    low_high = mem.per_gpu_gb_range
    title = f"Peak memory per GPU: {mem.per_gpu_gb:.1f} GB" + (
        f" ({low_high[0]:.1f}-{low_high[1]:.1f})" if low_high else ""
    )
    rows = [[esc(k), f"{v:.2f}"] for k, v in mem.breakdown_gb.items() if v]
    rows.append(["total", f"{mem.per_gpu_gb:.2f}"])
    return Table(["component", "GB"], rows, title=title)


def _speed_line(estimate: Estimate) -> str:
    """Tokens per second, MFU and the optimizer step time; the steps and hours they add up to."""
    s, t = estimate.speed, estimate.time
    tps = s.tokens_per_second_range
    tps_span = f" ({tps[0]:,.0f}-{tps[1]:,.0f})" if tps else ""
    hours_span = f" ({t.hours_range[0]:.2f}-{t.hours_range[1]:.2f})" if t.hours_range else ""
    return (
        f"*Speed* on {esc(s.gpu)} x{s.gpus}"
        + ("" if s.fits else " if the job fitted (it does not)")
        + f": {s.tokens_per_second:,.0f} tokens/s{tps_span}, {_mfu(s)}, "
        f"{s.step_seconds:.2f} s per optimizer step; {t.steps:,} steps for {t.tokens:,} tokens "
        f"x {t.epochs:.3g} epochs = {t.hours:.2f} h{hours_span}"
    )


def _mfu(s: SpeedEstimate) -> str:
    """'MFU 43% of peak (54% of measured matmul)': MFU against the GPU's dense bf16 peak, as MFU is defined;
    the roofline's share of the measured matmul rate named for what it is."""
    share = f" ({s.matmul_share:.0%} of measured matmul)" if s.matmul_share is not None else ""
    return f"MFU {s.mfu:.0%} of peak{share}"


def _offer_tables(estimate: Estimate) -> list[Part]:
    """Offers that fit (with their checkpoint interval), offers rejected on their merits with why, and a
    count of those the ask itself filtered out (another GPU count, GPU type or capacity class)."""
    fitting = [o for o in estimate.offers if o.fits]
    shown = fitting[:MAX_OFFER_ROWS] + [o for o in fitting[MAX_OFFER_ROWS:] if o.labels]
    rejected = [o for o in estimate.offers if not o.fits and o.rejected_by not in ASKED_FILTERS]
    filtered = len(estimate.offers) - len(fitting) - len(rejected)
    parts: list[Part] = []
    if shown:
        rows = [_offer_row(i + 1, o) + [_checkpoint(o)] for i, o in enumerate(shown)]
        parts.append(Table(OFFER_COLUMNS + ["ckpt"], rows, title="Offers that fit, by expected total cost"))
        parts.extend(_not_shown(len(fitting) - len(shown), "fitting offers"))
    if rejected:
        rows = [
            [esc(o.provider), esc(f"{o.gpu} x{o.gpu_count}"), _kind(o), esc(o.reason)]
            for o in rejected[:MAX_OFFER_ROWS]
        ]
        parts.append(Table(["provider", "gpu", "type", "why"], rows, title="Rejected offers"))
        parts.extend(_not_shown(len(rejected) - MAX_OFFER_ROWS, "rejected offers"))
    if not (shown or rejected or filtered):
        parts.append(Text(":warning: No offers to show."))
    if filtered:
        parts.append(
            Context(
                [
                    f"{filtered} offer groups with another GPU count, GPU type or capacity class than asked "
                    "are not shown (gpus=, gpu=, interruptible=; --json has all)"
                ]
            )
        )
    return parts


def _not_shown(n: int, what: str) -> list[Part]:
    return [Context([f"{n} more {what} not shown (--json has all)"])] if n > 0 else []


def _checkpoint(o: RankedOffer) -> str:
    return f"every {o.checkpoint_minutes:.0f} min" if o.checkpoint_minutes else "-"


def _assumptions(estimate: Estimate, *, detailed: bool) -> list[Part]:
    """The assumptions and where the prices come from (all of them, under a heading, when detailed)."""
    when = estimate.prices_as_of.strftime("%Y-%m-%d") if estimate.prices_as_of else "unknown date"
    source = f"prices: {esc(estimate.prices_source)} as of {when}"
    if detailed:
        notes = [esc(a) for a in estimate.assumptions] + [source]
    else:  # a Slack context holds 10 elements: the first planner notes, then every cloud's price source
        prices = [a.removeprefix("prices: ") for a in estimate.assumptions if a.startswith("prices: ")]
        others = [a for a in estimate.assumptions if not a.startswith("prices: ")]
        notes = [esc(a) for a in others[:7]]
        notes.append(esc(source + (" (" + "; ".join(prices) + ")" if prices else "")))
    return [Text("*Assumptions:*"), Context(notes)] if detailed else [Context(notes)]


def _calibrated(estimate: Estimate) -> str:
    """'calibrated from 6 runs on rtx-4090' (the details are in the assumptions)."""
    text = estimate.speed.calibration or ""
    return text.split(" (", 1)[0]


def _estimate_fallback(estimate: Estimate) -> str:
    best = labelled(estimate, "cheapest") or next((o for o in estimate.offers if o.fits), None)
    tail = (
        f"cheapest {esc(best.provider)} {esc(best.gpu)} x{best.gpu_count} {cost_span(best)}"
        if best
        else "nothing fits"
    )
    return (
        f"{esc(estimate.model.name)} {estimate.method}: {estimate.memory.per_gpu_gb:.1f} GB per GPU, "
        f"{hours(estimate.time.hours)}; {tail}"
    )


def launch_buttons(
    estimate: Estimate, estimate_id: str, rows: list[RankedOffer] | None = None
) -> list[Button]:
    """Launch buttons for the labelled offers; each names its table row, offer and total, as the row does."""
    rows = shown_offers(estimate) if rows is None else rows
    buttons: list[Button] = []
    for label, style in (("cheapest", "primary"), ("safest", None)):
        offer = labelled(estimate, label)
        if offer is None:
            continue
        kind = "spot" if offer.interruptible else "on-demand"
        row = next((i + 1 for i, r in enumerate(rows) if r is offer), None)
        where = f"#{row} " if row else ""
        buttons.append(
            Button(
                f"Launch {label}: {where}{esc(offer.provider)} {esc(offer.gpu)} x{offer.gpu_count} "
                f"({money(offer.total_cost)})",
                f"launch_{label}",
                estimate_id,
                style=style,  # type: ignore[arg-type]
                confirm=Confirm(
                    f"Launch on the {label} offer?",
                    f"{esc(offer.provider)} {esc(offer.gpu)} x{offer.gpu_count} ({kind}) at "
                    f"{money(offer.price_per_hour)}/h, about {hours(offer.hours)} "
                    f"and {money(offer.total_cost)} in total.",
                    ok="Launch",
                ),
            )
        )
    buttons.append(Button("Cancel", "cancel_estimate", estimate_id))
    return buttons


def job_fields(job: JobView) -> list[tuple[str, str]]:
    where = (
        esc(f"{job.provider or '-'} {job.gpu or ''} x{job.gpu_count or 1}")
        if job.provider
        else "not placed yet"
    )
    if job.provider:
        where += " (spot)" if job.interruptible else " (on-demand)"
    progress = f"{job.step}/{job.max_steps}" if job.max_steps else str(job.step)
    if job.max_steps:
        progress += f" ({job.step / max(job.max_steps, 1):.0%})"
    spend = money(job.spend) + (f" of max {money(job.max_cost)}" if job.max_cost else "")
    if job.estimated_cost is not None:
        spend += f" (estimate {money(job.estimated_cost)})"
    fields = [
        ("Model", f"{esc(job.model)} · {esc(job.method)}"),
        ("Where", where),
        ("Price", f"{money(job.price_per_hour)}/h" if job.price_per_hour is not None else "-"),
        ("Step", progress),
        ("Loss", f"{job.loss:.4f}" if job.loss is not None else "-"),
        ("ETA", duration(job.eta_seconds) if job.state in OPEN else "-"),
        ("Spend", spend),
        ("Preemptions", str(job.preemptions)),
    ]
    fields += result_fields(job)
    if job.output_uri:
        fields.append(("Output", f"`{esc(job.output_uri)}`"))
    elif job.checkpoint_uri:  # a stopped or failed job's result; a running job's newest save
        fields.append(("Checkpoint", f"`{esc(job.checkpoint_uri)}` (step {job.checkpoint_step})"))
    return fields


def result_hints(job: JobView) -> list[str]:
    """How to use what a stopped or failed job left: load its checkpoint, resume it, or clone it."""
    if not resumable(job.state, job.stop_reason):
        return []
    job_id = esc(job.job_id)
    if job.checkpoint_uri:
        load = how_to_load(job.method, job.model, job.checkpoint_uri)
        first = f"Load the checkpoint: `{esc(load)}`"
        go_on = f"`resume {job_id} [max_cost=$X]` continues from it"
    else:
        first = "No checkpoint was saved"
        go_on = f"`resume {job_id} [max_cost=$X]` starts it again"
    return [f"{first} · {go_on} · `clone {job_id} key=value ...` relaunches it with changes"]


def seconds_text(seconds: float) -> str:
    """A phase's time: '0.4 s', '38 s', '4.2 min', '1.3 h'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def phases_table(job: JobView) -> Table | None:
    """Quote against run, phase by phase (runner/contract/phases.py): what the job's offer was quoted for each
    phase and what its runner reported, with the billed total; a finished job's rows also say run/quote. None
    when neither is known."""
    quoted, ran = job.quoted_phases or {}, job.run_phases or {}
    if not quoted and not ran:
        return None
    final = job.state not in OPEN
    rows = []
    for name in (*PHASES, "preemption"):
        q, r = quoted.get(name), ran.get(name)
        if max(q or 0.0, r or 0.0) < 0.05:
            continue
        ratio = f"x{r / q:.2f}" if final and q and r is not None and q >= 0.05 else ""
        label = PHASE_LABELS.get(name, "lost to preemption (expected)")
        rows.append([label, seconds_text(q) if q else "-", seconds_text(r) if r is not None else "-", ratio])
    reported = sum(ran.values())
    billed = job.billed_seconds
    if billed is not None and ran and billed - reported >= 0.5:
        rows.append(["not reported (exit, lost work)", "-", seconds_text(billed - reported), ""])
    total_q = sum(quoted.values())
    total_r = billed if billed is not None else (reported if ran else None)
    ratio = f"x{total_r / total_q:.2f}" if final and total_q and total_r else ""
    rows.append(
        [
            "total (billed)" if billed is not None else "total",
            seconds_text(total_q) if total_q else "-",
            seconds_text(total_r) if total_r is not None else "-",
            ratio,
        ]
    )
    return Table(["phase", "quoted", "ran", "ran/quoted"], rows, title="Time by phase: quoted against run")


def job_card(job: JobView, *, with_buttons: bool = True, with_samples: bool = False) -> Reply:
    """The status card: edited in place in the job's thread, shown by `status JOB` (``with_samples``: and the
    side-by-side answers under it)."""
    state = _state(job)
    job_id = esc(job.job_id)
    reply = Reply(fallback=f"Job {job_id}: {state}, step {job.step}, spend {money(job.spend)}")
    reply.add(Header(f"Job {job_id}: {state}"))
    emoji = STATE_EMOJI.get(job.state, "")
    reply.add(Text(f"{emoji} *{esc(job.state)}* · owner {mention(job.owner)}".strip()))
    reply.add(Fields(job_fields(job)))
    phases = phases_table(job)
    if phases is not None:
        reply.add(phases)
    if job.pace is not None:  # slower than quoted: said before its cap cuts it (issue 36)
        reply.add(Context([f":warning: {esc(job.pace.line)}"]))
    if job.message:
        reply.add(Context([esc(job.message)]))
    hints = result_hints(job)
    if hints:
        reply.add(Context(hints))
    if with_samples:
        reply.add(*samples_parts(job))
    updated = job.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    reply.add(Context([f"updated {updated}"]))
    if with_buttons and job.state in OPEN:
        reply.add(
            Buttons(
                [
                    Button(
                        "Stop job",
                        "stop_job",
                        job.job_id,
                        style="danger",
                        confirm=Confirm(
                            "Stop this job?", f"Job {job_id} stops after a checkpoint.", ok="Stop"
                        ),
                    )
                ]
            )
        )
    elif with_buttons and hints:
        reply.add(Buttons([Button("Resume", "resume_job", job.job_id, style="primary")]))
    return reply


def operator_approves(job_id: str) -> str:
    """Who approves where no admin is configured: the operator, on the bot's machine."""
    return (
        "no admin is configured (TUNEBOT_ADMINS), so nobody approves it in Slack: the operator approves it "
        f"on the bot's machine with `tunebot approve {esc(job_id)}`."
    )


# Where a job's progress shows, said when it is launched or resumed: the door decides (issue 27: the terminal
# said "its thread" where there is none).
PROGRESS_IN_THREAD = "Progress goes to its thread."
PROGRESS_IN_CONSOLE = "Progress prints here while the console is open (`status JOB` shows the job)."
PROGRESS_ON_CLI = "Follow it with `tunebot jobs {job_id}` (or `--wait`)."


def resumed_reply(
    job: JobView, *, approval_above: float, admins: bool = True, progress: str = PROGRESS_IN_THREAD
) -> Reply:
    """What `resume JOB` answers: where the job continues from, its cap, or who must approve it first;
    ``progress``: where its progress shows (PROGRESS_IN_THREAD in Slack, the console's, the CLI's)."""
    job_id = esc(job.job_id)
    if job.state == "pending_approval":
        who = "an admin has been asked to approve it." if admins else operator_approves(job.job_id)
        return Reply(
            parts=[
                Text(
                    f":hourglass: Job *{job_id}* resumes with a cap of {money(job.max_cost)}, above the "
                    f"{money(approval_above)} approval amount: {who}"
                )
            ],
            fallback=f"Job {job_id} awaits approval to resume",
            kind="warning",
        )
    if job.message and job.state not in ACTIVE:
        return Reply(parts=[Text(esc(job.message))], fallback=esc(job.message))
    where = (
        f"from `{esc(job.checkpoint_uri)}` (step {job.checkpoint_step})"
        if job.checkpoint_uri
        else "from the beginning (no checkpoint was saved)"
    )
    return Reply(
        parts=[
            Text(
                f":arrow_forward: Resuming job *{job_id}* {where}; it is {esc(job.state)}, spend so far "
                f"{money(job.spend)} of max {money(job.max_cost)}. {progress.format(job_id=job_id)}"
            )
        ],
        fallback=f"Resuming job {job_id}",
        kind="success",
    )


def jobs_reply(
    jobs: list[JobView], *, title: str, detailed: bool = False, limit: int | None = MAX_JOB_ROWS
) -> Reply:
    """A table of jobs, newest first. ``detailed`` (the command line) adds the price, preemptions and
    each job's message and output under the table; ``limit=None`` lists them all."""
    if not jobs:
        return Reply(parts=[Text(f"{title}: none.")], fallback=f"{title}: none.")
    shown = jobs if limit is None else jobs[:limit]
    columns = ["job", "state", "owner", "model", "where", "step", "loss", "spend"]
    if detailed:
        columns += ["$/h", "preempt"]
    reply = Reply(fallback=f"{title}: {len(jobs)} job(s)")
    reply.add(Header(title), Table(columns, [_job_row(j, detailed=detailed) for j in shown]))
    if len(jobs) > len(shown):
        reply.add(Context([f"{len(jobs) - len(shown)} older jobs not shown"]))
    notes = [note for j in shown for note in _job_notes(j)] if detailed else []
    if notes:
        reply.add(Context(notes))
    return reply


def _job_row(job: JobView, *, detailed: bool) -> list[str]:
    row = [
        esc(job.job_id),
        _state(job),
        mention(job.owner),
        esc(f"{job.model} {job.method}"),
        esc(f"{job.provider} {job.gpu or ''} x{job.gpu_count or 1}") if job.provider else "-",
        f"{job.step}/{job.max_steps}" if job.max_steps else str(job.step),
        f"{job.loss:.3f}" if job.loss is not None else "-",
        money(job.spend) + (f" of {money(job.max_cost)}" if job.max_cost else ""),
    ]
    if detailed:
        price = money(job.price_per_hour) if job.price_per_hour is not None else "-"
        row += [price, str(job.preemptions)]
    return row


def _state(job: JobView) -> str:
    """'failed (budget)': the state with the reason a job stopped, when it has one."""
    return esc(job.state + (f" ({job.stop_reason})" if job.stop_reason else ""))


def _job_notes(job: JobView) -> list[str]:
    """A job's message and output location, each naming the job (they sit under the table)."""
    notes = [f"`{esc(job.job_id)}` {esc(job.message)}"] if job.message else []
    if job.pace is not None:
        notes.append(f"`{esc(job.job_id)}` :warning: {esc(job.pace.line)}")
    if job.output_uri:
        notes.append(f"`{esc(job.job_id)}` output: `{esc(job.output_uri)}`")
    elif job.checkpoint_uri and resumable(job.state, job.stop_reason):
        where = f"`{esc(job.checkpoint_uri)}` (step {job.checkpoint_step})"
        notes.append(f"`{esc(job.job_id)}` checkpoint: {where}")
    return notes


def job_line(job: JobView) -> str:
    """One line for a job: state, model, step, loss and spend (App Home's list, `launch --wait`)."""
    return (
        f"{STATE_EMOJI.get(job.state, '')} *{esc(job.job_id)}* {_state(job)} · "
        f"{esc(job.model)} {esc(job.method)} · "
        f"step {job.step}"
        + (f"/{job.max_steps}" if job.max_steps else "")
        + (f" · loss {job.loss:.3f}" if job.loss is not None else "")
        + f" · {money(job.spend)}"
    )


def _spend_rows(lines: list[SpendLine], *, people: bool = False) -> list[list[str]]:
    """Spend lines as rows; ``people``: the keys are user ids, shown as the people they are."""
    rows = []
    for line in lines[:25]:
        budget = money(line.budget) if line.budget is not None else "-"
        used = f"{line.amount / line.budget:.0%}" if line.budget else "-"
        rows.append([mention(line.key) if people else esc(line.key), money(line.amount), budget, used])
    return rows


def spend_reply(report: SpendReport, *, user: str | None = None, title: str | None = None) -> Reply:
    """Spend of a period by user, provider and job, against budgets. The user a person typed is shown by
    name in the header (plain text: it cannot ping) and as the escaped id in the fallback."""
    total = money(report.total)
    heading = title or f"Spend {esc(report.period)}{f' for {mention(user)}' if user else ''}: {total}"
    fallback = title or f"Spend {esc(report.period)}{f' for {esc(user)}' if user else ''}: {total}"
    reply = Reply(fallback=f"{fallback} (since {report.start:%Y-%m-%d})")
    reply.add(Header(heading))
    reply.add(Context([f"{report.start:%Y-%m-%d %H:%M} to {report.end:%Y-%m-%d %H:%M} UTC"]))
    for name, lines in (
        ("By user", report.by_user),
        ("By provider", report.by_provider),
        ("By job", report.by_job),
    ):
        if lines:
            rows = _spend_rows(lines, people=name == "By user")
            reply.add(Table([name.split()[-1], "spend", "budget", "used"], rows, title=name))
    if not (report.by_user or report.by_provider or report.by_job):
        reply.add(Text("Nothing spent in this period."))
    return reply


MAX_CALIBRATION_ROWS = 40


def calibration_reply(view: CalibrationView, *, limit: int | None = MAX_CALIBRATION_ROWS) -> Reply:
    """`calibrate show`: each corrected class with its factors and how many runs taught each, then every run
    behind them with its job, host and owner, what it claims (measured / physics) and whether it counts,
    newest first."""
    reply = Reply(fallback=f"Calibration from {view.measurements} measurement(s)")
    reply.add(Header(f"Calibration from {view.measurements} measurement(s)"))
    if view.corrections:
        rows = [
            [
                esc(c.gpu),
                esc(f"{c.stack} {c.method} {c.size}"),
                _taught(c.speed_factor, c.speed_runs, c.speed_held),
                _taught(c.memory_factor, c.memory_runs, c.memory_held),
                str(max(c.speed_waiting, c.memory_waiting)) if c.speed_waiting or c.memory_waiting else "-",
            ]
            for c in view.corrections
        ]
        reply.add(Table(["gpu", "class", "speed", "memory", "waiting"], rows, title="Corrections"))
    runs = list(reversed(view.runs))
    shown = runs if limit is None else runs[:limit]
    if shown:
        rows = [
            [
                esc(r.run),
                mention(r.owner) if r.owner else "-",
                esc(r.host or r.source),
                esc(r.gpu),
                f"x{r.memory_x:.2f}" if r.memory_x is not None else "-",
                f"x{r.speed_x:.2f}" if r.speed_x is not None else "-",
                esc(r.status + (f" by {r.excluded_by}" if r.excluded_by else "")),
            ]
            for r in shown
        ]
        reply.add(Table(["run", "owner", "host", "gpu", "memory", "speed", "status"], rows, title="Runs"))
    if len(runs) > len(shown):
        reply.add(Context([f"{len(runs) - len(shown)} older runs not shown (`tunebot calibrate show`)"]))
    reply.add(
        Context(
            [
                "factor = measured / physics, one vote per host. Slower or more memory than the physics "
                "moves a class most of the way at once (80% from one run), one rented host's by at most 2x "
                "until a host of another owner agrees (held); never past the roofline or what the GPU "
                "holds. Faster or less memory counts only once 3 hosts of 2 owners agree (waiting until "
                "then), shrunk toward 1 by n / (n + 2); memory never drops below the physics. `calibrate "
                "exclude RUN` takes a run out, `calibrate include RUN` puts it back."
            ]
        )
    )
    return reply


def _taught(factor: float, runs: int, held: int) -> str:
    """'x0.040 from 1 run': a correction and how many runs taught it ('held': at one host's bound)."""
    if not runs:
        return "-"
    return f"x{factor:.3f} from {runs} run{'s' if runs != 1 else ''}" + (" (held)" if held else "")


UNTRACKED_VOLUMES = (
    "untracked: volumes tunebot did not create or attach; it never deletes them (use the provider's console)"
)


def volumes_reply(volumes: list[VolumeView], *, limit: int | None = MAX_VOLUME_ROWS) -> Reply:
    """Volumes with their provider and id (what `volumes --delete ID --provider P` takes), size and cost."""
    if not volumes:
        return Reply(parts=[Text("No volumes.")], fallback="No volumes.")
    total = sum(v.cost_per_month for v in volumes)
    shown = volumes if limit is None else volumes[:limit]
    reply = Reply(fallback=f"{len(volumes)} volume(s), {money(total)}/month")
    reply.add(Header(f"Volumes: {money(total)}/month"))
    rows = [
        [
            esc(v.provider),
            esc(v.volume_id),
            esc(v.name),
            f"{v.size_gb:g} GB",
            money(v.cost_per_month),
            money(v.cost_so_far),
            v.idle_since.strftime("%Y-%m-%d") if v.idle_since else "in use",
            (mention(v.owner) if v.owner else "-") if v.tracked else "untracked",
        ]
        for v in shown
    ]
    reply.add(Table(["provider", "id", "name", "size", "$/month", "so far", "idle since", "owner"], rows))
    if len(volumes) > len(shown):
        reply.add(Context([f"{len(volumes) - len(shown)} more volumes not shown"]))
    if any(not v.tracked for v in volumes):
        reply.add(Context([UNTRACKED_VOLUMES]))
    return reply


def volume_reminder(volume: VolumeView, *, message: str = "") -> Reply:
    """An idle volume with the money at stake, and Delete / Keep buttons."""
    idle = f"idle since {volume.idle_since:%Y-%m-%d}" if volume.idle_since else "idle"
    owner = f" ({mention(volume.owner)})" if volume.owner else ""
    text = (
        f":floppy_disk: Volume *{esc(volume.name)}* on {esc(volume.provider)}{owner} is {idle}: "
        f"{volume.size_gb:g} GB costs "
        f"*{money(volume.cost_per_month)}/month* ({money(volume.cost_so_far)} so far)."
    )
    reply = Reply(
        fallback=f"Idle volume {esc(volume.name)}: {money(volume.cost_per_month)}/month", public=True
    )
    reply.add(Text(text))
    if message:
        reply.add(Context([esc(message)]))
    if not volume.tracked:  # the provider's, not tunebot's: no buttons that would be refused anyway
        reply.add(Context([UNTRACKED_VOLUMES]))
        return reply
    reply.add(volume_buttons(volume))
    return reply


def volume_buttons(volume: VolumeView) -> Buttons:
    """Delete (confirmed) and Keep for one volume; the value names it as `provider:volume id`."""
    ref = f"{volume.provider}:{volume.volume_id}"
    return Buttons(
        [
            Button(
                "Delete",
                "volume_delete",
                ref,
                style="danger",
                confirm=Confirm(
                    "Delete this volume?",
                    f"{esc(volume.name)} ({volume.size_gb:g} GB) and its data are deleted for good.",
                    ok="Delete",
                ),
            ),
            Button("Keep", "volume_keep", ref),
        ]
    )


ONLY_YOUR_BUDGET = "Only admins see other people's and teams' budgets (TUNEBOT_TEAM_READ=1 opens reading)."


def budgets_reply(
    budgets: list[BudgetView],
    *,
    who_sets: str = "An admin sets one with `budget set user|team NAME daily=X`.",
    only_yours: bool = False,
) -> Reply:
    """The budgets table; ``who_sets``: the line an empty list shows (the policy's budget_setter_hint);
    ``only_yours``: a member's view (their own budget only), which says so."""
    if not budgets:
        if only_yours:
            text = f"You have no budget. {ONLY_YOUR_BUDGET} {who_sets}"
            return Reply(parts=[Text(text)], fallback="You have no budget.")
        return Reply(parts=[Text(f"No budgets set. {who_sets}")], fallback="No budgets set.")
    rows = [
        [esc(b.scope), mention(b.name) if b.scope == "user" else esc(b.name)]
        + [money(b.daily), money(b.spent_today), money(b.monthly), money(b.spent_month)]
        for b in budgets[:40]
    ]
    reply = Reply(fallback=f"{len(budgets)} budget(s)")
    reply.add(Header("Budgets"), Table(["scope", "name", "daily", "today", "monthly", "month"], rows))
    if only_yours:
        reply.add(Text(ONLY_YOUR_BUDGET))
    return reply


def budget_saved_reply(view: BudgetView) -> Reply:
    """What `budget set` answers at every door (Slack, the modal's DM, the console, `tunebot budget set`)."""
    return text_reply(
        f":white_check_mark: Budget for {esc(view.scope)} *{esc(view.name)}*: "
        f"daily {money(view.daily)}, monthly {money(view.monthly)}.",
        kind="success",
    )


MAX_GPU_ROWS = 25  # `/tune gpus`: the cheapest this many; `gpus GPU` narrows the list
GPU_MEMORY_NOTE = "memory GB = 10^9 bytes (a card sold as A100 40GB has 40 GiB = 42.9 GB)"


def gpu_rows(offers: list[Offer], *, detailed: bool = False) -> tuple[list[str], list[list[str]]]:
    """The GPU table's columns and rows, for every door: Slack and the console show the compact form, `tunebot
    gpus` the detailed one (the GPU's label, storage, egress, reliability and preemption rate too)."""
    if not detailed:
        columns = ["provider", "gpu", "n", "memory", "type", "price", "$/GPU-h"]
        rows = [
            [
                esc(o.provider),
                esc(o.gpu),
                str(o.gpu_count),
                f"{o.gpu_memory_gb:g} GB",
                "spot" if o.interruptible else "on-demand",
                f"{money(o.price_per_hour)}/h",
                money(o.price_per_hour / o.gpu_count),
            ]
            for o in offers
        ]
        return columns, rows
    columns = [
        "provider",
        "gpu",
        "n",
        "memory GB",
        "class",
        "$/h",
        "$/GPU-h",
        "storage $/GB-mo",
        "egress $/GB",
        "reliability",
        "preempt/h",
    ]
    rows = [
        [
            esc(o.provider),
            esc(GPUS[o.gpu].label if o.gpu in GPUS else o.gpu),
            str(o.gpu_count),
            f"{o.gpu_memory_gb:.1f}",
            "interruptible" if o.interruptible else "on-demand",
            f"{o.price_per_hour:.2f}",
            f"{o.price_per_hour / o.gpu_count:.2f}",
            f"{o.storage_per_gb_month:.2f}",
            f"{o.egress_per_gb:.2f}",
            f"{o.reliability:.3f}" if o.reliability is not None else "-",
            f"{o.preemptions_per_hour:.2f}" if o.interruptible else "-",
        ]
        for o in offers
    ]
    return columns, rows


def gpus_reply(prices: PriceList, gpu: str | None = None, *, detailed: bool = False) -> Reply:
    """The GPU price table from the engine's price list (live where a cloud's key is set, else its dated
    snapshot, each cloud's source said). Compact (Slack, the console): the cheapest per GPU-hour first, at
    most MAX_GPU_ROWS, the sources in one line. ``detailed`` (`tunebot gpus`): every offer by GPU and size."""
    offers = [o for o in prices.offers if gpu is None or o.gpu == gpu]
    if detailed:
        stamp = "%Y-%m-%d %H:%M"
    else:  # a snapshot is dated by the day; live prices by the minute
        stamp = "%Y-%m-%d" if prices.source == "snapshot" else "%Y-%m-%d %H:%M UTC"
    when = f" as of {prices.as_of:{stamp}}" if prices.as_of else ""
    if detailed:
        offers.sort(key=lambda o: (o.gpu, o.gpu_count, o.price_per_hour))
        reply = Reply(fallback=f"{len(offers)} GPU offers")
        columns, rows = gpu_rows(offers, detailed=True)
        reply.add(Table(columns, rows, title=f"GPU offers ({esc(prices.source)}{when})"))
        reply.add(Context([GPU_MEMORY_NOTE, *(f"note: {esc(n)}" for n in prices.notes)]))
        if not offers:
            reply.add(Context(["no offers"]))
        return reply
    offers.sort(key=lambda o: (o.price_per_hour / o.gpu_count, o.gpu))
    for_gpu = f" for {esc(gpu)}" if gpu else ""
    if not offers:
        return text_reply(f"No offers{for_gpu} right now.")
    shown = offers[:MAX_GPU_ROWS]
    reply = Reply(
        fallback=f"{len(offers)} offers{for_gpu}; cheapest "
        f"{esc(shown[0].provider)} {esc(shown[0].gpu)} {money(shown[0].price_per_hour)}/h"
    )
    columns, rows = gpu_rows(shown)
    reply.add(Table(columns, rows, title=f"Cheapest offers{for_gpu} ({esc(prices.source)}{when})"))
    if len(offers) > len(shown):
        reply.add(Context([f"{len(offers) - len(shown)} more offers; `gpus GPU` narrows the list"]))
    if prices.notes:  # one element: a Slack context holds 10, and a fifth cloud adds a note
        reply.add(Context(["prices: " + esc("; ".join(prices.notes))]))
    return reply


def help_reply(topic: str | None = None) -> Reply:
    if topic:
        return Reply(parts=[Text(f"```{usage_for(topic)}```")], fallback=usage_for(topic))
    lines = "\n".join("/tune " + u for u in COMMAND_USAGE.values())
    reply = Reply(fallback="tunebot commands: " + ", ".join(COMMAND_USAGE))
    reply.add(Header("tunebot: estimate, launch and babysit cheap fine-tunes"))
    reply.add(Text(f"```{lines}```"))
    reply.add(Context([KEYS_HELP]))
    return reply


def approval_request(
    job: JobView, *, approvers: list[str], threshold: float, reason: str | None = None
) -> Reply:
    """Approve / Reject for a job waiting for approval; ``reason``: why, where the amount is not it (a
    pricier fallback asked again, a bigger GPU, a public Hub push). With no admin configured (``approvers``
    empty) nobody approves in Slack: the message says the operator approves it on the bot's machine, and it
    has no buttons."""
    who = " ".join(mention(a) for a in approvers) or "The operator"
    if reason:
        text = (
            f":bell: {who}: job *{esc(job.job_id)}* of {mention(job.owner)} ({esc(job.model)} "
            f"{esc(job.method)}) needs approval: {esc(reason)}."
        )
    else:
        text = (
            f":bell: {who}: {mention(job.owner)} asks to launch job *{esc(job.job_id)}* "
            f"({esc(job.model)} {esc(job.method)}), estimated *{money(job.estimated_cost)}*, may spend up to "
            f"*{money(job.max_cost)}*, above the {money(threshold)} approval amount."
        )
    reply = Reply(
        fallback=f"Approval needed for job {esc(job.job_id)} ({money(job.estimated_cost)})", public=True
    )
    reply.add(Text(text))
    if not approvers:
        reply.add(Text(operator_approves(job.job_id)[0].upper() + operator_approves(job.job_id)[1:]))
        return reply
    reply.add(
        Buttons(
            [
                Button(
                    "Approve",
                    "approve_job",
                    job.job_id,
                    style="primary",
                    confirm=Confirm(
                        "Approve this job?",
                        f"Job {esc(job.job_id)} may spend up to {money(job.max_cost or job.estimated_cost)}.",
                        ok="Approve",
                    ),
                ),
                Button("Reject", "reject_job", job.job_id, style="danger"),
            ]
        )
    )
    return reply


# ---- what the money bought: before/after, the result's step, side-by-side answers (issue 31) ------------

SAMPLE_CELL = 300  # characters of a prompt or an answer in a table cell (the full text is in the model card)


def untrusted(text: str | None, limit: int = SAMPLE_CELL) -> str:
    """Text a rented host generated: one line, cut to ``limit``, escaped (never markup that acts)."""
    flat = " ".join(str(text or "").split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return esc(flat) or "-"


def eval_change(before: float, after: float) -> str:
    """'2.31 -> 1.42 (-38%)': two decimals, four where two would read the same."""
    digits = 2 if round(before, 2) != round(after, 2) else 4
    change = f"{(after / before - 1.0) * 100:+.0f}%" if before > 0 else "-"
    return f"{before:.{digits}f} -> {after:.{digits}f} ({change})"


def result_step_text(results: RunResults) -> str:
    """'step 16 of 24 (lowest eval loss)' / 'step 24 (the last)'."""
    if results.keep == "best" and results.result_step != results.last_step:
        return f"step {results.result_step} of {results.last_step} (lowest eval loss)"
    if results.keep == "best":
        return f"step {results.result_step} (the last, also the lowest eval loss)"
    return f"step {results.result_step} (the last)"


def result_line(job: JobView, spend: float | None = None) -> str | None:
    """'eval loss 2.31 -> 1.42 (-38%) for $4.10; result: step 16 of 24 (lowest eval loss)', or None when the
    job measured nothing (no eval split, no samples)."""
    r = job.results
    if r is None:
        return None
    cost = job.spend if spend is None else spend
    bits = []
    if r.eval_before is not None and r.eval_after is not None:
        bits.append(f"eval loss {eval_change(r.eval_before, r.eval_after)} for {money(cost)}")
    bits.append(f"result: {result_step_text(r)}")
    return "; ".join(bits)


def result_fields(job: JobView) -> list[tuple[str, str]]:
    """The card's lines for a job that measured its result."""
    r = job.results
    if r is None:
        return []
    fields = []
    if r.eval_before is not None and r.eval_after is not None:
        fields.append(("Eval loss", f"{eval_change(r.eval_before, r.eval_after)} for {money(job.spend)}"))
    fields.append(("Result", result_step_text(r)))
    return fields


def samples_parts(job: JobView) -> list[Part]:
    """The side-by-side answers as a table (one row per prompt), its text escaped and cut: a host wrote it."""
    r = job.results
    if r is None or not r.samples:
        return []
    expected = any(s.expected is not None for s in r.samples)
    columns = ["prompt", *(["held-out answer"] if expected else []), "base model", "tuned"]
    rows = [
        [
            untrusted(s.prompt),
            *([untrusted(s.expected)] if expected else []),
            untrusted(s.base),
            untrusted(s.tuned),
        ]
        for s in r.samples
    ]
    title = (
        f"Side by side: job {esc(job.job_id)}, base model vs step {r.result_step} (greedy, at most "
        f"{r.sample_tokens} tokens)"
    )
    return [Table(columns, rows, title=title)]


def samples_reply(job: JobView) -> Reply | None:
    """The thread's side-by-side answers after the finish (None when there are none)."""
    parts = samples_parts(job)
    if not parts:
        return None
    return Reply(
        parts=parts, fallback=f"Job {esc(job.job_id)}: the base model's and the tuned model's answers"
    )


MAX_COMPARE_SETTINGS = 10  # setting columns in a comparison (a table block takes 20 cells a row)


def compare_reply(view: CompareView, *, chart: Path | None = None, title: str | None = None) -> Reply:
    """`compare JOB JOB...`: one row per run (the settings that differ, eval before -> after, cost, time,
    state), the best result named, notes, and the eval-curve chart."""
    from bot.planner.options import BY_FIELD

    keys = view.differing[:MAX_COMPARE_SETTINGS]
    names = [BY_FIELD[f].key if f in BY_FIELD else f for f in keys]
    columns = ["job", *names, "eval before", "eval after", "change", "result", "cost", "time", "state"]
    rows = []
    for run in view.runs:
        job, r = run.job, run.job.results
        first = run.eval[0][1] if run.eval and run.eval[0][0] == 0 else None
        last = run.eval[-1] if run.eval and run.eval[-1][0] > 0 else None
        b = r.eval_before if r and r.eval_before is not None else first
        a = r.eval_after if r and r.eval_after is not None else (last[1] if last else None)
        before = f"{b:.4f}" if b is not None else "-"
        # A run without a result (stopped, or still training): its latest eval loss, at its step.
        after = f"{a:.4f}" if r and r.eval_after is not None else (f"{a:.4f} @{last[0]}" if last else "-")
        change = f"{(a / b - 1) * 100:+.0f}%" if a is not None and b else "-"
        result = f"step {r.result_step}" if r else "-"
        rows.append(
            [
                esc(job.job_id),
                *(esc(run.settings.get(f, "-")) for f in keys),
                before,
                after,
                change,
                result,
                money(job.spend),
                duration(run.hours * 3600),
                _state(job),
            ]
        )
    heading = title or f"{len(view.runs)} runs side by side"
    reply = Reply(fallback=heading)
    reply.add(Header(heading), Table(columns, rows))
    scored = [r for r in view.runs if r.job.results and r.job.results.eval_after is not None]
    notes = [esc(n) for n in view.notes]
    if scored:
        best = min(scored, key=lambda r: r.job.results.eval_after)  # type: ignore[union-attr]
        cheapest = min(scored, key=lambda r: r.job.spend)
        line = (
            f"lowest eval loss: *{esc(best.job.job_id)}* "
            f"({best.job.results.eval_after:.4f} for {money(best.job.spend)})"  # type: ignore[union-attr]
        )
        if cheapest is not best:
            line += f"; cheapest: {esc(cheapest.job.job_id)} ({money(cheapest.job.spend)})"
        notes.insert(0, line)
    if len(view.differing) > len(keys):
        notes.append(f"{len(view.differing) - len(keys)} more differing settings not shown")
    if notes:
        reply.add(Context(notes))
    if chart is not None:
        reply.add(
            Image(
                alt=f"Eval loss of {len(view.runs)} runs against step, each result starred with its cost",
                path=chart,
                title="Eval loss by step",
            )
        )
    return reply


# ---- sweeps: the best run for a budget (bot/engine/control/sweeps.py) --------------------------------------

SWEEP_EMOJI = {
    "pending_approval": ":hourglass:",
    "running": ":zap:",
    "done": ":trophy:",
    "stopped": ":octagonal_sign:",
    "failed": ":x:",
    "cancelled": ":octagonal_sign:",
}


def _stages_text(survivors: list[int], steps: list[int] | None = None) -> str:
    """'4 -> 2 -> 1 runs (to step 8, 16, 32)'."""
    runs = " -> ".join(str(n) for n in survivors)
    return f"{runs} runs" + (f" (to step {', '.join(str(s) for s in steps)})" if steps else "")


def sweep_estimate_reply(est: SweepEstimate, *, estimate_id: str | None = None) -> Reply:
    """A sweep priced before launch: its configurations, stages, expected and worst cost against max_cost,
    and the button that launches it (when max_cost covers the worst case)."""
    keys = list(est.settings[0]) if est.settings else []
    same_steps = all(s == est.steps[0] for s in est.steps)
    columns = ["#", *keys, "where", "full run"] + ([] if same_steps else ["stage steps"])
    rows = [
        [
            str(i + 1),
            *(esc(s.get(k, "-")) for k in keys),
            esc(est.where[i]),
            money(est.run_costs[i]),
            *([] if same_steps else [", ".join(map(str, est.steps[i]))]),
        ]
        for i, s in enumerate(est.settings)
    ]
    n = len(est.settings)
    title = f"Sweep of {n} configurations: {esc(est.request.model)} {esc(est.request.method)}"
    reply = Reply(fallback=f"{title}: estimated {money(est.estimated_cost)}, at most {money(est.max_cost)}")
    reply.add(Header(title[:150]))
    reply.add(
        Fields(
            [
                ("Stages", _stages_text(est.survivors, est.steps[0] if same_steps else None)),
                ("Estimated", money(est.estimated_cost)),
                ("At most", f"{money(est.max_cost)} (max_cost)"),
                ("Worst case needs", money(est.needed_cost)),
            ]
        )
    )
    reply.add(Table(columns, rows))
    notes = [
        "every configuration trains at once to the first stage; at each stage the better half (eval loss on "
        "held-out data) goes on and the others are stopped and torn down; the last one trains to the end",
        "each run has a cap, and the caps are reserved so that their sum never passes max_cost",
        *(esc(n) for n in est.notes),
    ]
    reply.add(Context(notes))
    if estimate_id and est.feasible:
        reply.add(
            Buttons(
                [
                    Button(
                        f"Launch sweep (at most {money(est.max_cost)})",
                        "launch_sweep",
                        estimate_id,
                        style="primary",
                    ),
                    Button("Cancel", "cancel_estimate", estimate_id),
                ]
            )
        )
    return reply


def _run_row(run: SweepRunView, steps: list[int], keys: list[str]) -> list[str]:
    job = run.job
    evals = [f"{run.stage_evals[s]:.4f}" if s in run.stage_evals else "-" for s in steps]
    progress = "-"
    if job is not None:
        progress = f"{job.step}/{job.max_steps}" if job.max_steps else str(job.step)
    status = run.status + (f" ({esc(run.note)})" if run.note and run.status != "running" else "")
    return [
        str(run.index + 1),
        *(esc(run.settings.get(k, "-")) for k in keys),
        esc(job.job_id) if job else "-",
        progress,
        *evals,
        money(job.spend) if job else "-",
        status,
    ]


def sweep_card(view: SweepView) -> Reply:
    """The sweep's status card (its thread's root, `status SWEEP`): one line per run."""
    sid = esc(view.sweep_id)
    stages = len(view.survivors) or 1
    state = view.state + (
        f", stage {min(view.stage + 1, stages)} of {stages}" if view.state == "running" else ""
    )
    reply = Reply(fallback=f"Sweep {sid}: {state}, spent {money(view.spend)} of {money(view.max_cost)}")
    reply.add(Header(f"Sweep {sid}: {esc(state)}"))
    reply.add(
        Text(f"{SWEEP_EMOJI.get(view.state, '')} *{esc(view.model)}* · owner {mention(view.owner)}".strip())
    )
    keys = list(view.runs[0].settings) if view.runs else []
    steps = sorted({s for r in view.runs for s in r.stage_evals})
    columns = ["run", *keys, "job", "step", *(f"eval @{s}" for s in steps), "spend", "status"]
    reply.add(Table(columns, [_run_row(r, steps, keys) for r in view.runs]))
    fields = [
        ("Spend", f"{money(view.spend)} of max {money(view.max_cost)}"),
        ("Reserved", f"{money(view.reserved)} (caps of the live runs + what the others spent)"),
    ]
    if view.estimated_cost is not None:
        fields.append(("Estimated", money(view.estimated_cost)))
    if view.winner:
        fields.append(("Winner", f"job *{esc(view.winner)}*"))
    reply.add(Fields(fields))
    if view.message:
        reply.add(Context([esc(view.message)]))
    if view.state in ("running", "pending_approval"):
        reply.add(Context([f"`stop {sid}` stops every run · `compare {sid}` shows them side by side"]))
    return reply


def sweep_done_reply(view: SweepView, compare: CompareView | None, *, chart: Path | None = None) -> Reply:
    """The end of a sweep: what it found (the winner, its adapter, the spend), and its runs compared."""
    reply = Reply(fallback=esc(view.message or f"Sweep {view.sweep_id} {view.state}"))
    reply.add(Text(f"{SWEEP_EMOJI.get(view.state, '')} {esc(view.message or view.state)}".strip()))
    if compare is not None:
        done = compare_reply(compare, chart=chart, title=f"Sweep {esc(view.sweep_id)}: its runs side by side")
        reply.add(*done.parts)
    return reply


def sweep_approval_request(view: SweepView, *, approvers: list[str], threshold: float) -> Reply:
    """Approve / Reject a sweep whose max_cost is above the approval amount (its runs then need no more)."""
    who = " ".join(mention(a) for a in approvers) or "an admin"
    sid = esc(view.sweep_id)
    text = (
        f":bell: {who}: {mention(view.owner)} asks to launch sweep *{sid}* ({len(view.runs)} runs of "
        f"{esc(view.model)}), estimated *{money(view.estimated_cost)}*, may spend up to "
        f"*{money(view.max_cost)}*, above the {money(threshold)} approval amount."
    )
    reply = Reply(fallback=f"Approval needed for sweep {sid} ({money(view.max_cost)})", public=True)
    reply.add(Text(text))
    reply.add(
        Buttons(
            [
                Button(
                    "Approve",
                    "approve_job",
                    view.sweep_id,
                    style="primary",
                    confirm=Confirm(
                        "Approve this sweep?",
                        f"Sweep {sid} may spend up to {money(view.max_cost)}.",
                        ok="Approve",
                    ),
                ),
                Button("Reject", "reject_job", view.sweep_id, style="danger"),
            ]
        )
    )
    return reply
