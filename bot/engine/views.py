"""Database rows to the plain view models of api.py (what the chat layer renders)."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.engine.api import JobView, PaceView
from bot.engine.pace import pace
from runner.contract.spec import RunResults
from store.models import Job


def ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def job_view(
    job: Job,
    *,
    spend: float | None = None,
    losses: list[tuple[int, float]] | None = None,
    run_phases: dict[str, float] | None = None,
    billed_seconds: float | None = None,
    heard_step: int | None = None,
) -> JobView:
    """``heard_step``: the step the current run's newest heartbeat claims (bot/engine/watching/progress.py
    ``step_heard``), shown where it is ahead of the last report's: a runner that reports hourly is not shown
    at step 0 for an hour."""
    req = job.request or {}
    spent = job.spend if spend is None else spend
    step = max(job.last_step, heard_step) if heard_step is not None else job.last_step
    return JobView(
        job_id=job.id,
        owner=job.owner,
        state=job.state,
        stop_reason=job.stop_reason,
        model=str(req.get("model", "")),
        method=str(req.get("method", "lora")),
        provider=job.provider,
        gpu=job.gpu,
        gpu_count=job.gpu_count,
        interruptible=job.interruptible,
        price_per_hour=job.price_per_hour,
        estimated_cost=job.estimated_cost,
        max_cost=job.max_cost,
        spend=round(spent, 6),
        step=step,
        reported_step=job.last_step,
        max_steps=job.max_steps,
        loss=job.last_loss,
        eta_seconds=job.eta_seconds,
        preemptions=job.preemptions,
        output_uri=job.output_uri,
        checkpoint_uri=job.last_checkpoint_uri,
        checkpoint_step=job.last_checkpoint_step,
        channel=job.channel,
        thread_ts=job.thread_ts,
        created_at=ts(job.created_at),
        updated_at=ts(job.updated_at),
        message=job.message,
        losses=losses or [],
        results=_results(job.results),
        sweep_id=job.sweep_id,
        pace=_pace(job, spent, step),
        quoted_phases=_quoted_phases(job.offer),
        run_phases=run_phases,
        billed_seconds=billed_seconds,
    )


def _quoted_phases(offer: object) -> dict[str, float] | None:
    """The quote by phase stored with a job's offer (RankedOffer.phases: names and seconds), or None."""
    data = offer.get("phases") if isinstance(offer, dict) else None
    if not isinstance(data, dict):
        return None
    out = {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, int | float)}
    return out or None


def _pace(job: Job, spent: float, step: int) -> PaceView | None:
    """A running job's pace against its quote, when it is worth saying (bot/engine/pace.py)."""
    if job.state != "running" or job.stop_requested_at is not None or job.sweep_id is not None:
        return None  # a sweep's run: the sweep's pace (engine/money/slow_jobs.py says why)
    p = pace(
        step=step,
        max_steps=job.max_steps,
        spent=spent,
        price_per_hour=job.price_per_hour,
        quoted_hours=job.estimated_hours,
        eta_seconds=job.eta_seconds,
        max_cost=job.max_cost,
    )
    if p is None or not p.slow:
        return None
    line = p.line(job.id)
    return PaceView(slower=round(p.slower, 3), cost=p.cost, hours=p.hours, cap_step=p.cap_step, line=line)


def _results(data: object) -> RunResults | None:
    """The stored results, read back (None when absent or unreadable: they came from a host)."""
    if not isinstance(data, dict):
        return None
    try:
        return RunResults.model_validate(data)
    except ValueError:
        return None
