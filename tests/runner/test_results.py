"""What the money bought, on the runner's side: the base model measured before the first step, the result
chosen by eval loss (keep=best), the same prompts answered by both models, all in a bounded results event
and in the model card."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.spec import EXIT_OK, RESULTS_EVENT_BYTES, RunResults, Sample, fit_results, parse_progress
from runner.train import run


def _events(spec: Any) -> list[Any]:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())


def _results(spec: Any) -> RunResults:
    found = [e for e in _events(spec) if e.kind.value == "results"]
    assert len(found) == 1, [e.kind for e in _events(spec)]
    assert found[0].results is not None
    return found[0].results


def test_the_eval_split_rule_is_one_for_runner_and_planner() -> None:
    from runner.contract.fitting import eval_size, split

    assert eval_size(400, None) == 0  # small data: every example trains unless eval= asks
    assert eval_size(1000, None) == 50 and eval_size(100_000, None) == 200  # 5%, at most 200
    assert eval_size(400, 0.1) == 40 and eval_size(400, 0.0) == 0 and eval_size(1, 0.2) == 0
    train, held = split(list(range(2000)), None, seed=3)
    assert len(held) == 100 and not set(train) & set(held)


def test_results_always_fit_one_event() -> None:
    long = "word " * 400
    results = RunResults(
        eval_before=2.0,
        eval_after=1.0,
        samples=[Sample(prompt=long, base=long, tuned=long, expected=long) for _ in range(8)],
    )
    fitted = fit_results(results)
    size = len(json.dumps(fitted.model_dump(mode="json"), separators=(",", ":")))
    assert size <= RESULTS_EVENT_BYTES and len(fitted.samples) >= 1
    assert fitted.samples[0].tuned.endswith("…") and fitted.eval_after == 1.0
    assert fitted.change == pytest.approx(-0.5)


def noise_data(path: Path, n: int = 24, seed: int = 5) -> Path:
    """Answers that are random words: nothing to generalise, so after the format is learnt the model can only
    memorise its few train examples, and the held-out loss goes up again (overfitting, every time)."""
    import random

    rng = random.Random(seed)
    words = ["red", "blue", "green", "cat", "dog", "bird", "sun", "moon", "tree", "rock", "fish", "star"]
    with path.open("w") as fh:
        for _ in range(n):
            record = {
                "instruction": "Say the words.",
                "input": " ".join(rng.choice(words) for _ in range(4)),
                "output": " ".join(rng.choice(words) for _ in range(12)),
            }
            fh.write(json.dumps(record) + "\n")
    return path


@pytest.mark.slow
def test_before_after_best_step_and_samples(runner_job: Callable[..., Any], tmp_path: Path) -> None:
    """Training that overfits (a few examples of random answers, four passes): a later evaluation is worse
    than an earlier one, so the result is the best earlier step (loaded back), and the card and the event say
    which and why. The base model is measured at step 0, and both models answer the held-out prompts."""
    spec = runner_job(
        max_steps=24,
        seq_len=128,
        micro_batch_size=2,
        grad_accum=1,
        packing=False,
        learning_rate=0.01,
        warmup_ratio=0.0,
        lr_scheduler="constant",
        report={"every_seconds": 3600},
        dataset={"uri": str(noise_data(tmp_path / "noise.jsonl")), "format": "alpaca", "eval_fraction": 0.45},
        plateau={"enabled": False, "every_steps": 4},
        samples={"count": 2, "max_new_tokens": 8},
        checkpoint={"every_minutes": 1e-6, "keep": 2},  # a checkpoint due at every step
    )
    summary, code = run(spec)
    assert code == EXIT_OK and summary.steps == 24
    events = _events(spec)
    evals = [p for e in events for p in e.evals or []]
    assert [s for s, _ in evals] == [0, 4, 8, 12, 16, 20, 24]  # the base model first
    results = _results(spec)
    losses = dict(evals)
    assert results.eval_before == pytest.approx(losses[0])
    best = min((s for s in losses if s > 0), key=lambda s: losses[s])
    assert results.keep == "best" and results.result_step == best
    assert best != 24 and losses[24] > losses[best], losses  # the overshoot this test is built on
    assert results.eval_after == pytest.approx(losses[best]) and results.last_eval == pytest.approx(
        losses[24]
    )
    assert f"lowest eval loss of 6 evaluations, {losses[best]:.4f} at step {best}" in (results.why or "")
    assert len(results.samples) == 2 and all(s.prompt and s.expected is not None for s in results.samples)
    assert [e.kind.value for e in events][-2:] == ["results", "finished"]
    # The output is the best step's adapter: the one the newest checkpoint keeps for a resume, as
    # best.safetensors (or as its own weights when its step is the best). Which step that checkpoint has
    # depends on the machine: a timed save is written in the background, and one due while the previous still
    # uploads waits for it, so on a loaded CPU the last steps before the end may have none.
    import torch
    from safetensors.torch import load_file

    from runner.checkpoint import CheckpointStore

    newest = CheckpointStore(spec.checkpoint.uri).newest_complete()
    assert newest is not None and best <= newest < 24
    folder = Path(spec.checkpoint.uri) / f"checkpoint-{newest}"
    out = Path(spec.output_uri)
    kept = load_file(str(folder / ("adapter_model.safetensors" if newest == best else "best.safetensors")))
    output = load_file(str(out / "adapter_model.safetensors"))
    last = load_file(str(folder / "adapter_model.safetensors"))
    assert kept.keys() == output.keys() and all(torch.equal(kept[k], output[k]) for k in kept)
    assert newest == best or not all(torch.equal(last[k], output[k]) for k in kept)
    card = (out / "README.md").read_text()
    assert f"-> {losses[best]:.4f}" in card and f"result: the weights of step {best}" in card
    assert "## Side by side" in card and "Base model:" in card and "Tuned:" in card
    summary_json = json.loads((out / "training_summary.json").read_text())
    assert summary_json["results"]["result_step"] == best


@pytest.mark.slow
def test_keep_last_and_prompts_file(runner_job: Callable[..., Any], tmp_path: Path) -> None:
    """keep=last keeps the last step whatever the evals say; prompts=FILE replaces the held-out prompts."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "Count from one to 3."})
        + "\n"
        + json.dumps({"instruction": "Repeat the words.", "input": "red cat"})
        + "\n"
    )
    spec = runner_job(
        max_steps=8,
        seq_len=128,
        grad_accum=1,
        keep="last",
        report={"every_seconds": 3600},
        dataset={"eval_fraction": 0.1},
        plateau={"enabled": False, "every_steps": 4},
        samples={"count": 3, "prompts_uri": str(prompts), "max_new_tokens": 6},
    )
    summary, code = run(spec)
    assert code == EXIT_OK
    results = _results(spec)
    assert results.keep == "last" and results.result_step == 8 and (results.why or "").startswith("keep=last")
    assert [s.prompt for s in results.samples][0] == "Count from one to 3."
    assert len(results.samples) == 2 and all(s.expected is None for s in results.samples)


def test_a_bad_prompts_file_is_an_invalid_job(runner_job: Callable[..., Any], tmp_path: Path) -> None:
    from runner.contract.spec import EXIT_BAD_SPEC

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "what?"}\n')
    spec = runner_job(max_steps=2, seq_len=128, samples={"prompts_uri": str(prompts)})
    summary, code = run(spec)
    assert code == EXIT_BAD_SPEC and "prompts:" in (summary.message or "")
    assert "a prompt line needs 'prompt', 'messages', 'instruction' or 'text'" in (summary.message or "")


@pytest.mark.slow
def test_eval_passes_and_answers_are_estimated_as_the_runner_does_them(
    runner_tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The estimate of a job with an eval split and samples counts the runner's passes (the base model's
    included) and the prompts it answers, and prices both; the runner, given the estimate's plan, does
    exactly those."""
    from fakes.snapshot_plan import snapshot_plan

    from bot.engine.launching.jobspec import spec_fields
    from bot.planner.request import EstimateRequest
    from runner.contract.spec import JobSpec

    req = EstimateRequest(
        model=str(runner_tiny_dir / "model"),
        dataset=str(runner_tiny_dir / "data.jsonl"),
        seq_len=256,
        batch_size=4,
        grad_accum=1,
        gradient_checkpointing=False,
        plateau=False,
        gpu="cpu",
        lora_r=8,
        learning_rate=1e-2,
        max_steps=12,
        eval_split=0.05,
        samples=2,
        sample_tokens=6,
    )
    est = snapshot_plan(req)
    assert est.time.evaluations == 1 + 2  # before training, at step 10, at the end (12)
    assert est.time.samples == 2 and est.time.sample_tokens == 6 and est.time.sample_hours > 0
    assert est.time.hours >= est.time.eval_hours + est.time.sample_hours
    assert "2 side-by-side answers" in " ".join(est.assumptions)
    assert est.training is not None
    fields = spec_fields(est.training)
    fields.update(
        job_id="priced",
        gpus=0,
        output_uri=str(tmp_path / "out"),
        report={"every_seconds": 3600},
        checkpoint={"uri": str(tmp_path / "ckpt"), "every_minutes": 60},
    )
    spec = JobSpec.model_validate(fields)
    summary, code = run(spec)
    assert code == EXIT_OK and summary.steps == est.time.steps
    printed = capsys.readouterr().out.splitlines()
    assert len([line for line in printed if line.startswith("eval loss ")]) == est.time.evaluations
    results = _results(spec)
    assert len(results.samples) == est.time.samples and results.sample_tokens == est.time.sample_tokens
