"""The training loop on the tiny model: each method lowers the loss; the output and summary are complete."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.spec import EXIT_OK, parse_progress
from runner.train import run


def _losses(checkpoint_uri: str) -> list[float]:
    events = parse_progress((Path(checkpoint_uri) / "progress.json").read_bytes())
    return [e.loss for e in events if e.kind.value == "progress" and e.loss is not None]


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_each_method_lowers_the_training_loss(method: str, runner_job: Callable[..., Any]) -> None:
    learning_rate = 3e-3 if method == "full" else 1e-2
    spec = runner_job(
        method=method,
        max_steps=20,
        seq_len=128,
        grad_accum=1,
        learning_rate=learning_rate,
        report={"every_seconds": 1e-6},  # every step reported: the count does not hang on step times
    )
    summary, code = run(spec)
    assert code == EXIT_OK and summary.status == "finished", summary
    assert summary.steps == 20 and summary.tokens > 0
    losses = _losses(spec.checkpoint.uri)
    assert len(losses) >= 15
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 1.0, (method, losses)

    output = Path(spec.output_uri)
    weights = "model.safetensors" if method == "full" else "adapter_model.safetensors"
    assert (output / weights).exists() and (output / "tokenizer.json").exists()
    saved = json.loads((output / "training_summary.json").read_text())
    assert saved["steps"] == 20 and saved["status"] == "finished"
    assert json.loads((output / "job.json").read_text())["method"] == method


def test_checkpoints_on_any_fsspec_uri_and_an_in_process_resume(runner_job: Callable[..., Any]) -> None:
    from runner.checkpoint import CheckpointStore

    uri = "memory://tunebot-test/jobs/mem"
    spec = runner_job(
        max_steps=4,
        seq_len=128,
        grad_accum=1,
        checkpoint={"uri": uri, "every_minutes": 1e-9},  # due after every step, however fast a step is
        output_uri="memory://tunebot-test/out/mem",
    )
    first, code = run(spec)
    assert code == EXIT_OK and first.steps == 4
    store = CheckpointStore(uri)
    steps = store.complete_steps()  # time-based saves after steps 1-3 (not after the last), pruned to keep=2
    assert steps == [2, 3]

    longer = spec.model_copy(update={"max_steps": 6})
    second, code = run(longer)
    assert code == EXIT_OK and second.resumed_from == f"{uri}/checkpoint-{steps[-1]}" and second.steps == 6
    import fsspec

    assert fsspec.filesystem("memory").exists("/tunebot-test/out/mem/adapter_model.safetensors")


def test_every_step_reaches_the_chart_from_step_1_with_eval_and_learning_rate(
    runner_job: Callable[..., Any],
) -> None:
    """Reports land every few seconds, but each event carries the steps since the last one: the chart gets
    every step's loss and learning rate from step 1, and each eval loss at its step."""
    spec = runner_job(
        max_steps=12,
        seq_len=128,
        grad_accum=1,
        report={"every_seconds": 3600},
        dataset={"eval_fraction": 0.2},
        plateau={"enabled": False, "every_steps": 4},
    )
    summary, code = run(spec)
    assert code == EXIT_OK and summary.steps == 12
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    progress = [e for e in events if e.kind.value == "progress"]
    assert [e.step for e in progress] == [12]  # one report only (the last step), yet:
    steps = [p[0] for e in events for p in e.points or []]
    assert steps == list(range(1, 13))
    rates = [lr for e in events for _, _, lr in e.points or []]
    assert all(loss is not None for e in events for _, loss, _ in e.points or [])
    assert max(rates) > 0 and rates[-1] < max(rates)  # the schedule, as trained (warmup, then cosine)
    evals = [s for e in events for s, _ in e.evals or []]
    assert evals == [0, 4, 8, 12]  # the base model before the first step, then every 4 steps


def test_thin_points_keeps_the_newest_and_the_cap() -> None:
    from runner.contract.spec import MAX_EVENT_POINTS, MAX_REPORT_POINTS, thin_points

    points = [(i, 1.0, 0.1) for i in range(1, 2001)]
    thinned = thin_points(points, MAX_EVENT_POINTS)
    assert len(thinned) <= MAX_EVENT_POINTS and thinned[0][0] == 1 and thinned[-1][0] == 2000
    assert thin_points(points[:10]) == points[:10]
    # A report keeps up to MAX_REPORT_POINTS (the reporter splits it into events that fit the bot's limit).
    many = [(i, 1.0, 0.1) for i in range(1, 3 * MAX_REPORT_POINTS)]
    kept = thin_points(many)
    assert len(kept) <= MAX_REPORT_POINTS and kept[-1] == many[-1] and thin_points(points) == points


def test_the_runner_stops_itself_at_its_spend_cap_with_no_bot_alive(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: nothing else may be alive to stop the job (no `tunebot serve`, no callback URL). At $3,600/h
    (a dollar a second), with $0.50 spent by earlier runs and a second billed before this runner started,
    the runner stops itself once its paid time reaches the cap: a checkpoint, a `budget` event saying why,
    exit 79. The cap is set two seconds after the set-up (whose length this machine decides)."""
    import re
    import time

    from runner import train
    from runner.contract.spec import EXIT_BUDGET

    spec = runner_job(
        max_steps=1_000_000,  # would run for days
        seq_len=64,
        grad_accum=1,
        report={"callback_url": None, "every_seconds": 0.5},
        checkpoint={"every_minutes": 60.0},
        cost={"price_per_hour": 3600.0, "max_cost": 1e3, "spent_before": 0.5, "billed_from": time.time() - 1},
    )
    caps: list[float] = []
    set_up = train.Trainer.setup

    def setup_then_cap(self: Any) -> None:
        set_up(self)
        paid = self.spec.cost.paid(self.session_started, time.monotonic() - self.session_clock)
        assert paid is not None and paid > 1.5  # $0.50 before + the second of boot + the set-up
        caps.append(paid + 2.0)
        self.spec = self.spec.model_copy(
            update={"cost": self.spec.cost.model_copy(update={"max_cost": caps[0]})}
        )

    monkeypatch.setattr(train.Trainer, "setup", setup_then_cap)
    summary, code = run(spec)
    assert code == EXIT_BUDGET and summary.status == "budget", summary
    assert 0 < summary.steps < 1_000_000
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    last = events[-1]
    assert last.kind.value == "budget" and last.step == summary.steps
    assert f"max ${caps[0]:.4f}" in (last.message or "") and "checkpoint saved" in (last.message or "")
    assert last.checkpoint_uri and (Path(last.checkpoint_uri) / "COMPLETE").exists()
    # Priced as the bot's ledger prices it: it stops when one more step would reach the cap.
    paid = float(re.search(r"spend cap: \$([0-9.]+)", last.message or "").group(1))  # type: ignore[union-attr]
    assert caps[0] - 1.0 < paid <= caps[0] + 1.0, last.message


def test_a_runner_whose_cap_is_spent_before_training_trains_nothing(runner_job: Callable[..., Any]) -> None:
    from runner.contract.spec import EXIT_BUDGET

    spec = runner_job(
        max_steps=50,
        seq_len=64,
        report={"callback_url": None},
        cost={"price_per_hour": 1.0, "max_cost": 2.0, "spent_before": 2.0},  # a resume over its cap
    )
    summary, code = run(spec)
    assert code == EXIT_BUDGET and summary.status == "budget" and summary.steps == 0, summary
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    assert events[-1].kind.value == "budget" and "spend cap" in (events[-1].message or "")
