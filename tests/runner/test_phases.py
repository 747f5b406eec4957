"""Every run says where its time went, by phase (issue 36 item 1): the phases add up to the wall clock the
host bills, a resumed job carries its earlier runs' phases, and the steady speed calibration learns is
measured over the time the steps are billed for (batches, reports and the cap check between steps
included)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.contract.phases import PHASES, STEADY, bounded
from runner.contract.spec import RunnerEvent, RunSummary, parse_progress
from runner.measure import PhaseClock, RunMeter


def _phased_job(runner_job: Callable[..., Any], **overrides: Any) -> Any:
    """The tiny job with everything a run can spend time on: an eval split, samples and checkpoints."""
    fields: dict[str, Any] = {
        "max_steps": 24,
        "dataset": {"eval_fraction": 0.1},
        "samples": {"count": 2, "max_new_tokens": 4},
        "checkpoint": {"every_minutes": 0.01, "keep": 1},
        "plateau": {"enabled": False, "every_steps": 8},
    }
    return runner_job(**{**fields, **overrides})


def test_a_run_says_where_its_time_went_and_the_phases_add_up_to_its_wall_clock(
    runner_job: Callable[..., Any],
    write_spec: Callable[..., Path],
    runner_process: Callable[..., Any],
    tmp_path: Path,
) -> None:
    spec = _phased_job(runner_job)
    began = time.monotonic()
    proc = runner_process(write_spec(spec))
    rc, summary = proc.finish()
    wall = time.monotonic() - began  # what a host bills: from the process's start to its exit
    assert rc == 0, proc.stderr[-2000:]
    phases = summary["phases"]
    assert list(phases) == list(PHASES)
    for name in ("start", "load", "data", "base_eval", "warmup", "steps", "optimizer", "evals", "samples"):
        assert phases[name] > 0, (name, phases)
    assert phases["checkpoints"] > 0 and phases["output"] > 0, phases
    # Every second in one phase: the phases are the wall clock, bar the process's spawn and the last flush.
    assert abs(sum(phases.values()) - wall) <= max(1.0, 0.05 * wall), (sum(phases.values()), wall, phases)
    # The terminal event the bot reads carries them too (the progress object beside the checkpoints).
    events = parse_progress((tmp_path / "checkpoints" / "progress.json").read_text())
    finished = [e for e in events if e.kind.value == "finished"][-1]
    assert finished.phases is not None and finished.phases["output"] > 0
    assert sum(finished.phases.values()) <= sum(phases.values())
    # The steady speed is over the billed time of the steps after the first, nothing left out.
    steady = sum(phases[k] for k in STEADY)
    tokens_after_first = summary["tokens"] * (summary["steps"] - 1) / summary["steps"]
    assert summary["metrics"]["tokens_per_second"] <= 1.05 * tokens_after_first / steady


def test_a_resumed_job_adds_its_runs_phases(
    runner_job: Callable[..., Any],
    write_spec: Callable[..., Path],
    runner_process: Callable[..., Any],
    tmp_path: Path,
) -> None:
    spec = _phased_job(runner_job, max_steps=60, checkpoint={"every_minutes": 60})
    first = runner_process(write_spec(spec))
    rc, stopped = first.finish(sigterm_at_step=8)
    assert rc == 75, first.stderr[-2000:]
    saved = json.loads(next((tmp_path / "checkpoints").glob("checkpoint-*/trainer_state.json")).read_text())
    assert saved["phases"]["steps"] > 0 and saved["phases"]["start"] > 0
    began = time.monotonic()
    second = runner_process(write_spec(spec))
    rc, done = second.finish()
    wall = time.monotonic() - began
    assert rc == 0, second.stderr[-2000:]
    earlier = sum(saved["phases"].values())
    total = sum(done["phases"].values())
    assert abs(total - earlier - wall) <= max(1.0, 0.05 * wall), (total, earlier, wall)
    # The second run had its own start and first step; the base model was measured once, by the first.
    assert done["phases"]["start"] > saved["phases"]["start"]
    assert done["phases"]["base_eval"] == saved["phases"]["base_eval"]


def test_the_clock_puts_every_second_in_one_phase() -> None:
    clock = PhaseClock(before=2.0, now=0.0)  # 2 s of start-up before the clock (boot, imports)
    clock.switch("steps", now=1.0)
    clock.switch("optimizer", now=4.0)
    clock.switch("logging", now=5.0)
    clock.switch("evals", now=5.5)
    clock.switch("steps", now=9.5)
    clock.switch("output", now=11.5)
    seen = clock.seconds(now=12.0)
    assert seen["start"] == 3.0 and seen["steps"] == 5.0 and seen["optimizer"] == 1.0
    assert seen["logging"] == 0.5 and seen["evals"] == 4.0 and seen["output"] == 0.5
    assert sum(seen.values()) == 14.0  # 12 s on the clock and the 2 before it
    clock.carry({"steps": 100.0, "made-up": 5.0})  # a resumed job: its earlier runs' phases
    assert clock.seconds(now=12.0)["steps"] == 105.0 and "made-up" not in clock.seconds(now=12.0)
    assert clock.steady_seconds(now=12.0) == 6.5  # this run's steps, optimizer and logging


def test_a_held_phase_keeps_what_happens_inside_it() -> None:
    clock = PhaseClock()
    with clock.phase("warmup", hold=True):
        with clock.phase("optimizer"):
            time.sleep(0.01)
    seen = clock.seconds()
    assert seen["warmup"] >= 0.01 and seen["optimizer"] == 0.0
    assert clock.current == "start"


def test_the_steady_speed_is_over_the_steady_phases_of_the_clock() -> None:
    clock = PhaseClock(now=0.0)
    meter = RunMeter("cpu", clock=clock)
    clock.switch("warmup", now=0.0)
    clock.switch("steps", now=10.0)  # a slow first step: the warm-up, not the steady speed
    meter.step(1000, 10.0)
    for _ in range(4):
        meter.step(1000, 0.1)  # what a step timer around the step alone says: 10,000 tokens/s
    clock.switch("logging", now=1.0 + 10.0)  # the steps' billed time: 1 s, then 1 s between them
    clock.switch("evals", now=12.0)
    clock.switch("output", now=13.0)
    clock._at = time.monotonic()  # noqa: SLF001 - the open phase ends now, in output
    out = meter.result()
    assert out["tokens_per_second"] == 2000.0  # 4,000 tokens over 2 s of steps and logging
    assert out["steady_steps"] == 4


def test_a_hosts_phases_are_bounded_claims() -> None:
    claimed = {
        "start": 1.5,
        "steps": float("nan"),
        "evals": -3,
        "output": 1e12,
        "data": True,
        "load": "2",
        "free money": 5.0,
    }
    assert bounded(claimed) == {"start": 1.5}
    assert bounded("not a dict") is None and bounded({"x": 1}) is None
    event = RunnerEvent(job_id="j", seq=1, kind="finished", phases=claimed)
    assert event.phases == {"start": 1.5}
    assert RunnerEvent.model_validate_json(event.model_dump_json()).phases == {"start": 1.5}
    assert RunSummary(status="finished", phases={"steps": 2}).phases == {"steps": 2.0}
