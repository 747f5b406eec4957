"""Exact parameter counts from config.json, LoRA counts, and the architecture quirks."""

from __future__ import annotations

import json

import pytest

from bot.planner.architectures import from_config
from bot.planner.errors import BadRequestError, PlanningError
from bot.planner.models import resolve

# Totals published by the model authors / reported by transformers' num_parameters().
PUBLISHED_TOTALS = {
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-405B": 405_853_388_800,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "meta-llama/Llama-3.3-70B-Instruct": 70_553_706_496,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-3B": 3_085_938_688,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-14B": 14_770_033_664,
    "Qwen/Qwen2.5-32B": 32_763_876_352,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "Qwen/Qwen3-0.6B": 596_049_920,
    "Qwen/Qwen3-4B": 4_022_468_096,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-14B": 14_768_307_200,
    "Qwen/Qwen3-32B": 32_762_123_264,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "microsoft/Phi-3.5-mini-instruct": 3_821_079_552,
    "microsoft/Phi-3-medium-4k-instruct": 13_960_238_080,
    "huggyllama/llama-30b": 32_528_943_616,
    "huggyllama/llama-65b": 65_285_660_672,
    "bigscience/bloomz-7b1": 7_069_016_064,
    "bigscience/T0_3B": 2_851_598_336,
}


@pytest.mark.parametrize(("model", "total"), sorted(PUBLISHED_TOTALS.items()))
def test_parameter_count_is_exact(model: str, total: int) -> None:
    arch, source = resolve(model)
    assert source == "built-in table"
    assert arch.parameters == total


def test_mixtral_counts_total_and_active_parameters() -> None:
    arch, _ = resolve("mixtral-8x7b")
    assert arch.parameters == 46_702_792_704
    assert arch.active_parameters == 12_879_925_248  # 2 of 8 experts per token
    assert arch.experts == 8 and arch.experts_per_token == 2


@pytest.mark.parametrize(
    ("model", "r", "targets", "trainable"),
    [
        ("meta-llama/Llama-3.2-3B", 32, ["q", "v"], 9_175_040),  # docs/estimation.md, what PEFT reports
        ("meta-llama/Llama-2-7b-hf", 8, ["q_proj", "v_proj"], 4_194_304),
        ("meta-llama/Llama-3.1-8B", 16, "all-linear", 41_943_040),
        ("meta-llama/Llama-3.1-8B", 8, ["q", "k", "v", "o"], 6_815_744),
        ("Qwen/Qwen2.5-0.5B", 8, ["q", "v"], 24 * 8 * (896 + 896 + 896 + 128)),
    ],
)
def test_lora_trainable_count_is_exact(model: str, r: int, targets: list[str] | str, trainable: int) -> None:
    arch, _ = resolve(model)
    assert arch.lora_parameters(r, targets) == trainable


def test_phi3_fused_projections_are_adapted_once() -> None:
    arch, _ = resolve("phi-3-mini")
    names = arch.linear_names()
    assert "qkv_proj" in names and "gate_up_proj" in names and "q_proj" not in names
    # q and v both live in qkv_proj: adapting "q,v" adapts that one Linear(3072, 9216).
    assert arch.lora_parameters(8, ["q", "v"]) == 32 * 8 * (3072 + 9216)
    assert arch.lora_parameters(8, ["qkv_proj"]) == arch.lora_parameters(8, ["q", "v"])


def test_qwen2_has_qkv_biases_and_qwen3_has_qk_norms() -> None:
    base = json.loads(json.dumps(resolve("Qwen/Qwen2.5-0.5B")[0].config))
    no_bias = from_config({**base, "model_type": "llama"})
    assert resolve("Qwen/Qwen2.5-0.5B")[0].parameters - no_bias.parameters == 24 * (896 + 128 + 128)
    q3 = resolve("Qwen/Qwen3-0.6B")[0]
    as_llama = from_config({**q3.config, "model_type": "llama"})
    assert q3.parameters - as_llama.parameters == 28 * 2 * 128


def test_gemma2_ties_embeddings_by_default_and_has_four_norms() -> None:
    cfg = dict(resolve("google/gemma-2-9b")[0].config)
    cfg.pop("tie_word_embeddings")
    arch = from_config(cfg)
    assert arch.tied and arch.parameters == 9_241_705_984


def test_unknown_lora_target_lists_the_layers() -> None:
    arch, _ = resolve("llama-3.2-1b")
    with pytest.raises(BadRequestError, match="q_proj"):
        arch.lora_parameters(8, ["attention_everything"])


def test_config_without_sizes_is_a_planning_error() -> None:
    with pytest.raises(PlanningError, match="config.json"):
        from_config({"model_type": "llama", "vocab_size": 10})


def test_qwen_moe_counts_shared_expert() -> None:
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "tie_word_embeddings": False,
    }
    arch = from_config(cfg)
    attn = 64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64
    experts = 4 * 3 * 64 * 32 + 64 * 4
    shared = 3 * 64 * 48 + 64
    per_layer = attn + experts + shared + 2 * 64
    assert arch.parameters == 2 * per_layer + 2 * 100 * 64 + 64
    assert arch.active_parameters == arch.parameters - 2 * (2 * 3 * 64 * 32)
