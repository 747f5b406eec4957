"""Issue 36, item 5: a slow job says so before its cap cuts it, once (again when materially worse), in its
thread and in `status JOB` / `tunebot jobs`; the cap's stop fires on the spend, never a period early.

The pure projection (bot/engine/pace.py) first, then the engine as `tunebot serve` runs it: the real tick over
a job on the fake cloud, with the runner's progress fed through the same ingest a host's events go through.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from bot.chat import cards
from bot.chat.terminal import render
from bot.engine.pace import Pace, cap_due, pace, worse
from bot.engine.watching import runner_events
from runner.contract.spec import EventKind, RunnerEvent
from store.models import Job

from .conftest import Recorder, estimate_for, request
from .fakes import FakeProvider

QUOTE = dict(price_per_hour=1.0, quoted_hours=1.0, max_steps=1000)  # $1/h, quoted 1 h for 1,000 steps


def _slow(step: int = 100, x: float = 2.4, max_cost: float = 2.0) -> Pace | None:
    """A job ``x`` times slower than quoted at ``step``: billed that long, the runner's eta at that pace."""
    per_step_h = x / 1000
    return pace(
        **QUOTE,
        step=step,
        spent=step * per_step_h,
        eta_seconds=(1000 - step) * per_step_h * 3600,
        max_cost=max_cost,
    )


def test_a_job_slower_than_quoted_projects_its_cost_time_and_where_its_cap_stops_it() -> None:
    p = _slow()
    assert p is not None and p.slow
    assert p.slower == pytest.approx(2.4) and p.cost == pytest.approx(2.4) and p.hours == pytest.approx(2.4)
    assert p.cap_step == 833  # $2 at $0.0024 a step
    line = p.line("j-1")
    assert line.startswith("running 2.4x slower than quoted: at this pace $2.40 and 2.4 h; the cap ($2.00) ")
    assert "stops it near step 833 of 1000" in line
    assert "`resume j-1 max_cost=$2.64` once the cap stops it" in line and "`stop j-1` ends it now" in line
    within = _slow(x=1.8)  # slower, but its cap covers it
    assert (
        within is not None
        and within.slow
        and within.cap_step is None
        and "within its cap" in within.line("j")
    )


def test_nothing_is_said_early_on_a_job_at_its_quote_or_past_its_cap() -> None:
    assert _slow(step=40) is None  # under 5% of the steps: warm-up and start say little of the pace
    on_time = _slow(x=1.1)
    assert on_time is not None and not on_time.slow
    assert _slow(step=1000) is None and _slow(max_cost=0.2) is None  # the end, or the cap's stop is due
    assert pace(step=100, max_steps=1000, spent=0.2, price_per_hour=1.0, quoted_hours=None) is None


def test_a_host_claiming_to_be_slow_reads_no_slower_than_the_bots_own_clock() -> None:
    """The runner's eta is a claim: the projection takes the faster of it and the bot's billed time a step."""
    honest = _slow(x=1.0)
    claimed = pace(**QUOTE, step=100, spent=0.1, eta_seconds=10 * 3600.0, max_cost=2.0)
    assert honest is not None and claimed is not None and claimed.slower == pytest.approx(honest.slower)
    no_eta = pace(**QUOTE, step=100, spent=0.1, max_cost=2.0)  # the bot's clock alone
    assert no_eta is not None and no_eta.slower == pytest.approx(1.0)


def test_said_once_and_again_only_when_materially_worse() -> None:
    p = _slow(x=2.4, max_cost=10.0)
    assert p is not None and worse(p, None)
    assert not worse(p, 2.4) and not worse(_slow(x=2.8, max_cost=10.0), 2.4)  # noise: not again
    assert worse(_slow(x=3.1, max_cost=10.0), 2.4)  # materially worse
    assert worse(_slow(x=2.5), 2.4, said_capped=False)  # its cap now cuts it: said again


def test_the_caps_stop_is_due_at_the_cap_not_a_reconcile_period_early() -> None:
    """9a0c9c1 stopped on the spend one reconcile period (60 s) ahead: a $0.10 cap at $3.60/h stopped at
    $0.05. The stop is due when the spend reaches the cap, or will by the next tick (10 s)."""
    assert not cap_due(0.05, 3.6, 0.10, 10.0)
    assert not cap_due(0.089, 3.6, 0.10, 10.0)
    assert cap_due(0.091, 3.6, 0.10, 10.0) and cap_due(0.12, 0.0, 0.10, 10.0)


def _progress(eng, job_id: str, seq: int, step: int, eta_s: float) -> None:  # type: ignore[no-untyped-def]
    event = RunnerEvent(
        job_id=job_id, seq=seq, kind=EventKind.progress, step=step, max_steps=1000, eta_seconds=eta_s
    )
    assert runner_events.ingest(eng, job_id, [event]) == 1


def _card(reply) -> str:  # type: ignore[no-untyped-def]
    console = Console(width=200, record=True, force_terminal=False, color_system=None)
    render(reply, console)
    return console.export_text()


def test_a_slow_job_says_so_in_its_thread_and_its_status_once(make_engine, clock) -> None:  # type: ignore[no-untyped-def]
    """Quoted 1 h at $1/h, capped at $2: at step 100 of 1,000 after 0.24 h it runs 2.4x slower than quoted.
    The thread (Slack, `serve`'s log) is told once with the projection and what to do, `status JOB` and
    `tunebot jobs` show it; the same pace a tick later says nothing new; much slower, it is said again."""
    cloud = FakeProvider("vast", price=1.0)
    eng = make_engine(providers={"vast": cloud})
    rec = Recorder(eng.bus)
    job = eng.create_job(request(), user="alice", estimate=estimate_for(cloud, hours=1.0), max_cost=2.0)
    job_id = job.job_id
    with eng.session() as s:
        launched = s.get(Job, job_id).started_at  # type: ignore[union-attr]
    assert launched is not None
    clock.advance(0.24 * 3600)
    _progress(eng, job_id, 1, 100, 900 * 8.64)
    eng.tick()
    said = [e for e in rec.events if e.kind == "warning" and e.job_id == job_id]
    assert len(said) == 1, [e.message for e in said]
    line = said[0].message
    assert f"Job {job_id}: running 2.4x slower than quoted: at this pace $2.40 and 2.4 h" in line, line
    assert "the cap ($2.00) stops it near step 83" in line and f"`resume {job_id} max_cost=$" in line
    view = eng.get_job(job_id)
    assert view.state == "running" and view.pace is not None and view.pace.cap_step is not None
    status = _card(cards.job_card(view, with_buttons=False))  # `status JOB`
    listing = _card(cards.jobs_reply([view], title="Jobs", detailed=True))  # `tunebot jobs`
    for shown in (status, listing):
        assert "running 2.4x slower than quoted" in shown and "stops it near step 83" in shown, shown

    clock.advance(60)
    _progress(eng, job_id, 2, 107, 893 * 8.64)
    eng.tick()
    assert len([e for e in rec.events if e.kind == "warning" and e.job_id == job_id]) == 1  # not every tick

    clock.advance(0.3 * 3600)  # then it nearly stalls: materially worse
    _progress(eng, job_id, 3, 120, 880 * 30.0)
    eng.tick()
    again = [e for e in rec.events if e.kind == "warning" and e.job_id == job_id]
    assert len(again) == 2 and "slower than quoted" in again[1].message
    assert eng.get_job(job_id).state == "running"  # the projection stops nothing: the spend does


def test_a_small_cap_is_spent_before_the_stop_not_half_of_it(make_engine, clock) -> None:  # type: ignore[no-untyped-def]
    """9a0c9c1 asked a job to stop once its spend one reconcile period (60 s) ahead reached the cap: at $36/h
    and a $1 cap, with the tick every 10 s, at $0.40 spent (40% of the cap). Now at 90% or more."""
    pricey = FakeProvider("pricey", price=36.0)  # $0.01 per second
    eng = make_engine(providers={"pricey": pricey})
    job = eng.create_job(request(), user="alice", estimate=estimate_for(pricey, hours=0.01), max_cost=1.0)
    for _ in range(30):
        clock.advance(10)
        eng.tick()
        with eng.session() as s:
            row = s.get(Job, job.job_id)
            asked, started = row.stop_requested_at, row.started_at  # type: ignore[union-attr]
        if asked is not None:
            break
    assert asked is not None and started is not None
    spent_when_asked = (asked - started) * 36.0 / 3600
    assert 0.9 <= spent_when_asked <= 1.0 + 1e-9, spent_when_asked


def test_a_sweeps_run_paused_at_its_stage_boundary_is_not_called_slow(make_engine, clock) -> None:  # type: ignore[no-untyped-def]
    """A sweep's run waits at each stage boundary (billed, its step still) and its cap covers its stage: the
    same figures that make a lone job slow say nothing in a sweep run's thread nor on its card."""
    cloud = FakeProvider("vast", price=1.0)
    eng = make_engine(providers={"vast": cloud})
    rec = Recorder(eng.bus)
    job_id = eng.create_job(
        request(), user="alice", estimate=estimate_for(cloud, hours=1.0), max_cost=2.0
    ).job_id
    with eng.session() as s:
        row = s.get(Job, job_id)
        assert row is not None
        row.sweep_id = "sw-paused"
        s.commit()
    clock.advance(0.24 * 3600)
    _progress(eng, job_id, 1, 100, 900 * 8.64)
    eng.tick()
    assert not [e for e in rec.events if e.kind == "warning" and e.job_id == job_id]
    assert eng.get_job(job_id).pace is None
