"""What the runner checks before it fetches weights, and what a failure tells the person who asked.

Issue 10: a chat dataset given as alpaca failed only after the model was downloaded, and the user saw
"the runner exited with code 2"; `q,v` LoRA targets crashed peft (NoMatchingPeftModuleError) after the
weights were loaded. Now both are refused first, with the runner's own error line in a `failed` event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.spec import EXIT_BAD_SPEC, EventKind, parse_progress
from runner.train import run


def _failed_events(spec: Any) -> list[Any]:
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    return [e for e in events if e.kind is EventKind.failed]


def _no_weights(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record whether the runner asked for the base model's weights."""
    import runner.model as model

    calls: list[bool] = []
    real = model.resolve_base_model

    def spy(base: str, *, weights: bool = True, into: Path | None = None) -> Path:
        calls.append(weights)
        return real(base, weights=weights, into=into)

    monkeypatch.setattr(model, "resolve_base_model", spy)
    return calls


def test_a_chat_dataset_declared_alpaca_is_refused_before_any_model_file_is_fetched(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    chat.write_text("\n".join(json.dumps(r) for r in rows * 20) + "\n")
    calls = _no_weights(monkeypatch)
    spec = runner_job(dataset={"uri": str(chat), "format": "alpaca"})
    summary, code = run(spec)
    assert code == EXIT_BAD_SPEC and summary.status == "invalid"
    line = f"{chat}:1: alpaca record is missing the key 'instruction'"
    assert summary.message == line
    assert calls == []  # neither the config/tokenizer nor the weights were fetched
    (failed,) = _failed_events(spec)
    assert failed.message == f"invalid job: {line}"  # what the bot shows the person


def test_lora_targets_that_match_no_layer_are_refused_before_the_weights_load(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _no_weights(monkeypatch)
    spec = runner_job(lora={"target_modules": ["q", "v"]})
    summary, code = run(spec)
    assert code == EXIT_BAD_SPEC, summary
    assert "LoRA target(s) q, v match no Linear layer" in (summary.message or "")
    assert "q_proj" in summary.message and "v_proj" in summary.message  # the model's own names
    assert calls == [False]  # only the light files (config, tokenizer) were fetched
    assert "q_proj" in _failed_events(spec)[0].message


def test_the_real_module_names_train_and_only_those_layers_get_adapters(
    runner_job: Callable[..., Any],
) -> None:
    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, lora={"target_modules": ["q_proj", "v_proj"]})
    summary, code = run(spec)
    assert code == 0, summary
    config = json.loads((Path(spec.output_uri) / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_the_output_folder_explains_itself_with_a_model_card(runner_job: Callable[..., Any]) -> None:
    spec = runner_job(
        max_steps=4,
        seq_len=128,
        grad_accum=1,
        dataset={"eval_fraction": 0.1},
        base_model_name="acme/tiny-llama",
        learning_rate=0.01,
        cost={
            "price_per_hour": 0.5,
            "spent_before": 0.25,
            "estimated_total": 0.9,
            "where": "vast rtx-4090 x1 (spot)",
        },
    )
    summary, code = run(spec)
    assert code == 0, summary
    card = (Path(spec.output_uri) / "README.md").read_text()
    assert card.startswith("---\nbase_model: acme/tiny-llama\nlibrary_name: peft\n")
    for text in (
        "| learning rate | 0.01 (cosine, warmup 5%",
        "| LoRA | r 8, alpha 16, dropout 0.05, targets all-linear |",
        "| eval split | 10% |",
        "| seed | 0 |",
        "- records: 400",
        f"- final training loss: {summary.final_loss:.4f}",
        "on vast rtx-4090 x1 (spot) at $0.50/h",
        "(estimated $0.90)",
    ):
        assert text in card, text
    eval_line = next(line for line in card.splitlines() if line.startswith("- eval loss: "))
    assert float(eval_line.split(": ")[1]) > 0  # an eval loss was measured at the end
    cost_line = next(line for line in card.splitlines() if line.startswith("- cost: "))
    assert float(cost_line.split("$")[1].split()[0]) >= 0.25  # the earlier instances' spend is included
    summary_json = json.loads((Path(spec.output_uri) / "training_summary.json").read_text())
    assert summary_json["eval_loss"] is not None and summary_json["cost"] >= 0.25
    adapter = json.loads((Path(spec.output_uri) / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "acme/tiny-llama"


def test_merge_saves_a_loadable_model_with_the_adapter_folded_in(runner_job: Callable[..., Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    spec = runner_job(max_steps=3, seq_len=128, grad_accum=1, merge=True)
    summary, code = run(spec)
    assert code == 0, summary
    merged = AutoModelForCausalLM.from_pretrained(str(Path(spec.output_uri) / "merged"))
    base = AutoModelForCausalLM.from_pretrained(spec.base_model)
    assert sum(p.numel() for p in merged.parameters()) == sum(p.numel() for p in base.parameters())
    q_merged = merged.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_merged, base.model.layers[0].self_attn.q_proj.weight)
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_wandb_runs_online_under_the_project_and_entity_and_the_run_link_is_reported(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    inits: list[dict[str, Any]] = []

    class Run:
        url = "https://wandb.ai/acme/tunebot/runs/abc123"

        def log(self, values: dict[str, Any], step: int) -> None:
            return None

        def finish(self, exit_code: int = 0) -> None:
            return None

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: inits.append(kw) or Run()  # type: ignore[attr-defined]
    fake.Settings = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the suite's offline default asks for less, and wins
    monkeypatch.setattr("runner.wandb_log._unreachable", lambda url: None)  # this fake W&B answers
    spec = runner_job(
        max_steps=2,
        seq_len=128,
        grad_accum=1,
        wandb={"mode": "online", "project": "tunebot", "entity": "acme", "run_id": "job-1"},
    )
    summary, code = run(spec)
    assert code == 0, summary
    assert inits[0]["mode"] == "online" and inits[0]["entity"] == "acme" and inits[0]["project"] == "tunebot"
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    started = next(e for e in events if e.kind is EventKind.started)
    assert started.wandb_url == Run.url
