"""The estimate's training plan: what the runner will get, resolved from the request and the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.planner.errors import BadRequestError
from bot.planner.request import EstimateRequest
from runner.contract.spec import Defaults


@pytest.mark.parametrize(
    ("model", "targets", "names"),
    [
        ("llama-3.1-8b", ["q", "v"], ["q_proj", "v_proj"]),
        ("Qwen2.5-7B", ["Q_PROJ", "v"], ["q_proj", "v_proj"]),
        ("microsoft/Phi-3-mini-4k-instruct", ["q", "v"], ["qkv_proj"]),  # fused: the layer peft adapts
        ("bigscience/bloomz-7b1", ["q", "v"], ["query_key_value"]),
        ("llama-3.1-8b", ["attn"], ["q_proj", "k_proj", "v_proj", "o_proj"]),
        ("llama-3.1-8b", "all-linear", "all-linear"),
    ],
)
def test_lora_targets_become_the_models_own_module_names(model: str, targets, names) -> None:  # type: ignore[no-untyped-def]
    plan = snapshot_plan(EstimateRequest(model=model, lora_targets=targets, tokens=10**6)).training
    assert plan is not None and plan.lora_targets == names


def test_an_unknown_target_is_refused_with_the_models_layers() -> None:
    with pytest.raises(BadRequestError, match="its Linear layers are: q_proj, k_proj"):
        snapshot_plan(EstimateRequest(model="llama-3.1-8b", lora_targets=["wq"], tokens=10**6))


def test_defaults_come_from_one_place_and_the_alias_becomes_the_hub_id() -> None:
    plan = snapshot_plan(EstimateRequest(model="llama-3.1-8b", tokens=10**6)).training
    assert plan is not None and plan.base_model == "meta-llama/Llama-3.1-8B"
    assert (plan.lora_r, plan.lora_alpha, plan.lora_dropout) == (
        Defaults.lora_r,
        Defaults.lora_r * Defaults.lora_alpha_per_r,
        Defaults.lora_dropout,
    )
    assert (plan.learning_rate, plan.lr_scheduler, plan.warmup_ratio, plan.seed) == (
        Defaults.learning_rate,
        Defaults.lr_scheduler,
        Defaults.warmup_ratio,
        Defaults.seed,
    )
    assert plan.plateau is Defaults.plateau and plan.plateau_patience == Defaults.plateau_patience
    assert plan.plateau_on == "train loss" and plan.hub_private is Defaults.hub_private


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        ({"instruction": "a", "input": "", "output": "b"}, "alpaca"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "messages"),
        ({"prompt": "a", "completion": "b"}, "prompt_completion"),
        ({"text": "a b c"}, "text"),
    ],
)
def test_the_dataset_format_is_read_from_the_data(tmp_path: Path, row: dict, fmt: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    plan = snapshot_plan(EstimateRequest(model="llama-3.1-8b", dataset=str(data), eval_split=0.1)).training
    assert plan is not None and plan.dataset_format == fmt and plan.plateau_on == "eval loss"


def test_max_steps_caps_the_priced_time() -> None:
    full = snapshot_plan(EstimateRequest(model="llama-3.1-8b", tokens=10**7))
    capped = snapshot_plan(EstimateRequest(model="llama-3.1-8b", tokens=10**7, max_steps=100))
    assert capped.time.steps == 100 < full.time.steps and capped.time.hours < full.time.hours
