"""Out of memory backs off instead of killing the job (runner/oom.py): the same effective batch and loss
curve, then activation checkpointing, then its own exit code. The error is injected on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runner import oom
from runner.contract.spec import EXIT_OK, EXIT_OUT_OF_MEMORY, EventKind, parse_progress
from runner.train import run


def test_levels_halve_the_micro_batch_down_to_one_then_turn_checkpointing_on() -> None:
    assert oom.levels(4, False) == [oom.Level(1), oom.Level(2), oom.Level(4), oom.Level(4, True)]
    assert oom.levels(3, True) == [oom.Level(1, True), oom.Level(2, True)]
    assert oom.levels(1, True) == [oom.Level(1, True)]
    assert oom.Level(4, True).describe(8, 2) == "micro-batch 2 x grad_accum 8, activation checkpointing on"


def test_split_rows_keeps_every_row_once_in_order() -> None:
    batch = {"input_ids": torch.arange(12).reshape(3, 4), "attention_mask": torch.ones(3, 1, 4, 4)}
    pieces = oom.split_rows(batch, 4)  # more parts than rows: one row each
    assert [p["input_ids"].shape[0] for p in pieces] == [1, 1, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in pieces]), batch["input_ids"])
    assert pieces[2]["attention_mask"].shape == (1, 1, 4, 4)


def _events(spec: Any) -> list[Any]:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())


def _losses(spec: Any) -> torch.Tensor:
    return torch.tensor(
        [
            e.loss
            for e in _events(spec)
            if e.kind is EventKind.progress and e.loss is not None and e.message is None
        ],
        dtype=torch.float64,
    )


def _job(runner_job: Callable[..., Any], tmp_path: Path, name: str, **overrides: Any) -> Any:
    # No LoRA dropout: its masks depend on how many rows each micro-step draws for (the curve would be the
    # same only in distribution).
    base = dict(
        max_steps=6,
        seq_len=128,
        learning_rate=1e-2,
        report={"every_seconds": 1e-6},
        lora={"dropout": 0.0},
        plateau={"enabled": False},
        checkpoint={"uri": str(tmp_path / name / "ckpt"), "every_minutes": 600},
        output_uri=str(tmp_path / name / "out"),
    )
    return runner_job(**{**base, **overrides})


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_loss_curve(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = _job(runner_job, tmp_path, "reference", micro_batch_size=4, grad_accum=1)
    summary, code = run(reference)
    assert code == EXIT_OK and summary.metrics["micro_batch_size"] == 4.0

    # Two 128-token rows already exceed the injected limit: 4 rows -> 2 -> 1 per micro-step.
    monkeypatch.setenv(oom.TEST_OOM_ENV, "130")
    backed = _job(runner_job, tmp_path, "backed", micro_batch_size=4, grad_accum=1)
    summary, code = run(backed)
    assert code == EXIT_OK and summary.steps == 6, summary
    assert (summary.metrics["micro_batch_size"], summary.metrics["grad_accum"]) == (1.0, 4.0)
    notes = [e.message for e in _events(backed) if e.kind is EventKind.progress and e.message]
    assert any("micro-batch 2 x grad_accum 2" in n for n in notes), notes
    assert any("micro-batch 1 x grad_accum 4" in n and "same effective batch" in n for n in notes), notes
    assert summary.tokens == run_tokens(reference)
    torch.testing.assert_close(_losses(backed), _losses(reference), rtol=1e-5, atol=1e-5)
    assert len(_losses(backed)) == 6


def run_tokens(spec: Any) -> int:
    return max(e.tokens_seen or 0 for e in _events(spec))


def test_at_one_row_it_turns_checkpointing_on_with_the_same_loss_curve(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = _job(
        runner_job, tmp_path, "reference", micro_batch_size=1, grad_accum=2, gradient_checkpointing=False
    )
    assert run(reference)[1] == EXIT_OK
    monkeypatch.setenv(oom.TEST_OOM_ENV, "100:100000")  # every row is over 100 tokens unless checkpointing
    backed = _job(
        runner_job, tmp_path, "backed", micro_batch_size=1, grad_accum=2, gradient_checkpointing=False
    )
    summary, code = run(backed)
    assert code == EXIT_OK and summary.metrics["gradient_checkpointing"] == 1.0
    torch.testing.assert_close(_losses(backed), _losses(reference), rtol=1e-5, atol=1e-5)


def test_out_of_memory_at_every_level_exits_with_its_own_code_and_says_so(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(oom.TEST_OOM_ENV, "1")
    spec = _job(runner_job, tmp_path, "none", micro_batch_size=2, grad_accum=1)
    summary, code = run(spec)
    assert code == EXIT_OUT_OF_MEMORY and summary.status == "out_of_memory" and summary.steps == 0
    last = _events(spec)[-1]
    assert last.kind is EventKind.out_of_memory
    assert "micro-batch 1 x grad_accum 2, activation checkpointing on" in (last.message or "")
    assert "more memory" in (last.message or "")


@pytest.mark.slow
def test_two_processes_restart_together_one_level_further(
    runner_job: Callable[..., Any],
    tmp_path: Path,
    write_spec: Callable[..., Path],
    runner_process: Callable[..., Any],
) -> None:
    """A rank out of memory cannot back off alone (the other waits in an FSDP collective): the launcher starts
    both again at the next level, from where they were."""
    spec = _job(runner_job, tmp_path, "two", micro_batch_size=2, grad_accum=1, max_steps=3)
    env = {"TUNEBOT_CPU_PROCESSES": "2", oom.TEST_OOM_ENV: "130"}  # 2 rows over the limit, 1 row under
    first = runner_process(write_spec(spec), env=env)
    rc, summary = first.finish()
    assert rc == EXIT_OK and summary["status"] == "finished", (summary, first.stderr[-3000:])
    assert summary["steps"] == 3
    notes = [e.message or "" for e in _events(spec) if e.kind is EventKind.progress]
    assert any("restarting the 2 processes at micro-batch 1 x grad_accum 2" in n for n in notes), notes


def test_the_launcher_walks_the_levels_then_exits_with_the_code_and_the_event(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner import distributed

    starts: list[int] = []
    said: list[tuple[str, str]] = []

    def once(*args: Any, level: int, **kwargs: Any) -> int:
        starts.append(level)
        return EXIT_OUT_OF_MEMORY

    monkeypatch.setattr(distributed, "_launch_once", once)
    monkeypatch.setattr(oom, "report", lambda spec_json, kind, message: said.append((kind, message)))
    spec_json = '{"micro_batch_size": 4, "grad_accum": 2, "gradient_checkpointing": false}'
    assert distributed.launch(spec_json, 2) == EXIT_OUT_OF_MEMORY
    assert starts == [0, 1, 2, 3]  # micro-batch 4, 2, 1, then 1 with checkpointing
    assert [kind for kind, _ in said] == ["progress", "progress", "progress", "out_of_memory"]
    last_restart = "restarting the 2 processes at micro-batch 1 x grad_accum 8, activation checkpointing on"
    assert last_restart in said[2][1]
    assert '"status":"out_of_memory"' in capsys.readouterr().out.splitlines()[-1]


def test_a_back_off_grows_back_to_the_planned_micro_batch(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Issue 37: one out-of-memory error (a long batch, a fragmented cache) no longer halves the micro-batch
    for the rest of the run. After GrowBack.after good steps the runner tries the planned level again; the
    run ends at the spec's micro-batch, as the planner chose it."""
    monkeypatch.setenv(oom.TEST_OOM_ENV, "200")  # two 128-token rows are over it, one is not
    monkeypatch.setenv(oom.TEST_OOM_TIMES_ENV, "1")  # a passing shortage: once
    monkeypatch.setattr(oom, "_injected", [0])  # (counted per process)
    monkeypatch.setenv(oom.GROW_BACK_ENV, "2")
    spec = _job(runner_job, tmp_path, "grows", micro_batch_size=2, grad_accum=1)
    summary, code = run(spec)
    assert code == EXIT_OK and summary.steps == 6, summary
    assert (summary.metrics["micro_batch_size"], summary.metrics["grad_accum"]) == (2.0, 1.0)
    out = capsys.readouterr().out
    assert "retrying the step at micro-batch 1 x grad_accum 2" in out
    assert "2 steps ran at micro-batch 1 x grad_accum 2; trying micro-batch 2 x grad_accum 1 again" in out


def test_grow_back_waits_twice_as_long_after_the_level_above_failed_again() -> None:
    grow = oom.GrowBack(after=2)
    grow.backed_off()
    assert [grow.step_ok(1, 0) for _ in range(2)] == [False, True]  # tried again after 2 good steps
    grow.backed_off()  # ... and it ran out of memory again
    assert grow.after == 4 and [grow.step_ok(1, 0) for _ in range(4)] == [False, False, False, True]
    assert not grow.step_ok(0, 0)  # at the planned level there is nothing to grow back to
