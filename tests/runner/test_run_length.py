"""One meaning for a run's length: the steps, tokens and eval passes the estimate prices are the ones the
runner trains, because both use runner/contract/steps.py and runner/data's tokenizing and packing (the bot
without torch)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.engine.launching.jobspec import spec_fields
from bot.planner.request import EstimateRequest
from runner.contract.spec import JobSpec
from runner.contract.steps import evaluations, run_length, steps_per_epoch, total_steps

TINY_JOB = dict(
    seq_len=256,
    batch_size=4,
    grad_accum=2,
    gradient_checkpointing=False,
    plateau=False,
    gpu="cpu",
    lora_r=8,
    learning_rate=1e-2,
)


def test_steps_are_optimizer_steps_and_override_epochs() -> None:
    assert steps_per_epoch(micro_batches=37, processes=2, grad_accum=4) == 4  # 18 per process -> 4 steps
    assert total_steps(18, epochs=1.0, max_steps=400) == 400  # steps= wins: the data repeats
    assert total_steps(18, epochs=3.0, max_steps=10) == 10  # ... or is cut short
    assert total_steps(18, epochs=1.5, max_steps=None) == 27
    assert evaluations(100, 10) == 10 and evaluations(101, 10) == 11  # every 10 steps and at the end
    length = run_length(
        [100] * 50,
        [],
        seq_len=256,
        micro_batch_size=1,
        grad_accum=1,
        processes=1,
        packing=True,
        seed=0,
        epochs=1.0,
        max_steps=400,
    )
    assert (length.steps_per_epoch, length.steps, round(length.epochs, 2)) == (25, 400, 16.0)
    assert "400 steps (steps=400: 16 passes over the data, 25 steps each)" in length.describe()


def _spec(est: Any, tmp_path: Path) -> JobSpec:
    assert est.training is not None
    fields = spec_fields(est.training)
    checkpoint = {"uri": str(tmp_path / "ckpt"), "every_minutes": 60}
    fields.update(
        job_id="length-test",
        gpus=0,
        output_uri=str(tmp_path / "out"),
        report={"every_seconds": 0.5},
        checkpoint=checkpoint,
    )
    return JobSpec.model_validate(fields)


def _train(est: Any, tmp_path: Path, runner_process: Callable[..., Any]) -> tuple[dict[str, Any], list[str]]:
    path = tmp_path / "job.json"
    path.write_text(_spec(est, tmp_path).model_dump_json())
    proc = runner_process(path)
    rc, summary = proc.finish(timeout=300)
    assert rc == 0, (summary, proc.stderr[-2000:])
    return summary, proc.lines


@pytest.mark.slow
def test_a_steps_job_trains_the_steps_it_was_estimated_at(
    runner_tiny_dir: Path, tmp_path: Path, runner_process: Callable[..., Any]
) -> None:
    """steps=20 on data of 12 steps per epoch: estimated at 20 steps (1.67 passes), trained 20 (the old
    planner priced min(steps, one epoch) = 12 while the runner trained 20)."""
    req = EstimateRequest(
        model=str(runner_tiny_dir / "model"),
        dataset=str(runner_tiny_dir / "data.jsonl"),
        max_steps=20,
        **TINY_JOB,
    )
    est = snapshot_plan(req)
    assert est.time.steps == 20 and est.time.steps_per_epoch is not None and est.time.steps_per_epoch < 20
    assert est.time.epochs == pytest.approx(20 / est.time.steps_per_epoch, rel=1e-3)
    summary, lines = _train(est, tmp_path, runner_process)
    assert summary["steps"] == summary["max_steps"] == est.time.steps
    assert f"length: {est.time.length}" in lines  # the runner says up front what the estimate priced
    assert summary["tokens"] == pytest.approx(est.time.tokens * est.time.epochs, rel=0.02)


def _chat_records(n: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["red", "blue", "cat", "dog", "sun", "moon", "tree", "fish", "star", "rock"]

    def say(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            messages += [
                {"role": "user", "content": say(rng.randint(2, 30))},
                {"role": "assistant", "content": say(rng.randint(1, 60))},
            ]
        out.append({"messages": messages})
    return out


@pytest.mark.slow
def test_chat_tokens_and_eval_passes_are_counted_as_the_runner_trains_them(
    runner_tiny_dir: Path, tmp_path: Path, runner_process: Callable[..., Any]
) -> None:
    """A chat dataset (the tokenizer's template, loss on assistant turns, BOS/EOS, packing, an eval split):
    the estimate's tokens per epoch are within 2% of what the runner trains, and its eval passes are the
    runner's and are priced."""
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _chat_records(300)))
    req = EstimateRequest(
        model=str(runner_tiny_dir / "model"),
        dataset=str(data),
        epochs=1.0,
        eval_split=0.1,
        **{**TINY_JOB, "grad_accum": 1},
    )
    est = snapshot_plan(req)
    assert est.training is not None and est.training.dataset_format == "messages"
    assert est.time.token_source == "runner's tokenizer, template and packing"
    summary, lines = _train(est, tmp_path, runner_process)
    assert summary["steps"] == est.time.steps
    assert summary["tokens"] == pytest.approx(est.time.tokens, rel=0.02)
    evals = [line for line in lines if line.startswith("eval loss ")]
    assert est.time.evaluations >= 2 and len(evals) == est.time.evaluations
    no_eval = snapshot_plan(req.model_copy(update={"eval_split": 0.0}))
    assert no_eval.time.evaluations == 0 and no_eval.time.eval_hours == 0
    assert est.time.eval_hours > 0 and est.time.hours > est.time.eval_hours
    assert "eval passes" in " ".join(est.assumptions)


def test_the_bot_counts_with_the_runner_rules_without_importing_torch(runner_tiny_dir: Path) -> None:
    code = (
        "import sys; from bot.planner import plan_request; from bot.planner.request import EstimateRequest\n"
        "from bot.providers.snapshot import snapshot_offers\n"
        f"e = plan_request(EstimateRequest(model={str(runner_tiny_dir / 'model')!r}, "
        f"dataset={str(runner_tiny_dir / 'data.jsonl')!r}, seq_len=256, eval_split=0.1),\n"
        "    offers=snapshot_offers())\n"
        "print(e.time.token_source, e.time.evaluations, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True
    )
    source, _, rest = out.stdout.strip().rpartition(" packing ")
    evals, torch_imported = rest.split()
    assert source == "runner's tokenizer, template and" and int(evals) > 0, out.stdout + out.stderr
    assert torch_imported == "False"
