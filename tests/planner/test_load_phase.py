"""Quantizing a QLoRA model on the GPU can set the peak reserved memory before training starts."""

from __future__ import annotations

from fractions import Fraction

import pytest

from bot.planner import load_phase
from bot.planner.load_phase import load_reserved_bytes
from bot.planner.memory import estimate_memory, nf4_quantizer
from bot.planner.models import resolve
from bot.planner.request import EstimateRequest

# torchtune 0.1.1's QLoRA tutorial: Llama-2-7B, r=8 everywhere, batch 2, alpaca (<= 512 tokens).
TT01 = dict(
    model="meta-llama/Llama-2-7b-hf",
    method="qlora",
    stack="torchtune",
    lora_r=8,
    batch_size=2,
    seq_len=512,
    packing=False,
    adapter_dtype="bf16",
    qlora_upcast=False,
    grad_accum=16,
)


def test_recorded_torchao_01_sequences_are_balanced_and_68_bytes_per_parameter_at_peak() -> None:
    """Each profile frees every scratch tensor it makes; the (numel, 16) bf16 distance table and its
    absolute value (32 + 32 B) plus the weight and scaled blocks (2 + 2 B) are the peak."""
    survivors = {
        "build": (load_phase._BUILD, set(load_phase._BUILD_SURVIVORS), Fraction(1, 32)),
        "clone": (load_phase._CLONE, set(load_phase._LOAD_FREES_CLONE.values()), Fraction(1, 8192)),
    }
    for events, kept_ids, scalers in survivors.values():
        made = {e[1] for e in events if e[0] == "+"}
        freed = {e[1] for e in events if e[0] == "-"}
        assert freed <= made and made - freed == kept_ids
        kept = sum(e[2] for e in events if e[0] == "+" and e[1] in kept_ids)
        assert (
            kept == Fraction(1, 2) + Fraction(1, 64) + scalers
        )  # packed 4-bit data + int8 scalers + factors
        assert 68 <= load_phase.peak_bytes_per_param(events) < 68.2
    load = load_phase._LOAD
    assert {e[1] for e in load if e[0] == "-"} - {e[1] for e in load if e[0] == "+"} == set(
        load_phase._LOAD_FREES_CLONE
    )


def test_torchao_01_reserves_more_than_the_sum_of_sizes_says() -> None:
    arch, _ = resolve("meta-llama/Llama-2-7b-hf")
    reserved = load_reserved_bytes(arch, "torchao-0.1", 0.0, 8)
    largest = max(lin.d_in * lin.d_out for g in arch.groups for lin in g.linears)
    nf4 = arch.block_linear_params * (0.5 + 1 / 64 + 1 / 32)
    bf16 = 2 * (arch.parameters - arch.block_linear_params)
    high_water = nf4 + bf16 + 68 * largest  # all weights alive + one Linear's scratch
    assert reserved > 1.15 * high_water  # fragmentation: carved blocks cannot hold the next scratch
    assert reserved < 2 * high_water


def test_torchtune_01_qlora_peak_is_the_model_load_and_matches_the_tutorial() -> None:
    arch, _ = resolve(TT01["model"])
    old = estimate_memory(arch, EstimateRequest(**TT01, nf4_quantizer="torchao-0.1"))
    new = estimate_memory(arch, EstimateRequest(**TT01))  # today's chunked torchao
    assert old.peak_phase.startswith("model load")
    assert not new.peak_phase.startswith("model load")
    assert old.torch_reserved_gb == pytest.approx(9.29, rel=0.05)
    assert old.per_gpu_gb - new.per_gpu_gb > 3.0
    assert sum(old.breakdown.values()) == pytest.approx(old.per_gpu_bytes)


@pytest.mark.parametrize(
    ("stack", "quantizer"), [("hf", "bitsandbytes"), ("torchtune", "torchao"), ("unsloth", "prequantized")]
)
def test_each_stack_quantizes_its_own_way(stack: str, quantizer: str) -> None:
    assert nf4_quantizer(EstimateRequest(model="x", method="qlora", stack=stack)) == quantizer


@pytest.mark.parametrize(
    "model", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-32B", "mistralai/Mixtral-8x7B-v0.1"]
)
def test_bitsandbytes_loading_never_outgrows_a_training_step(model: str) -> None:
    """bitsandbytes needs the bf16 weight plus the packed output while quantizing; a training step
    dequantizes the same Linear (2 B/param, twice) next to its activations, so training stays the peak."""
    arch, _ = resolve(model)
    m = estimate_memory(arch, EstimateRequest(model=model, method="qlora", batch_size=1, seq_len=64))
    assert not m.peak_phase.startswith("model load")


def test_several_gpus_shard_after_loading_so_no_single_gpu_load_peak() -> None:
    arch, _ = resolve(TT01["model"])
    one = estimate_memory(arch, EstimateRequest(**TT01, nf4_quantizer="torchao-0.1"))
    two = estimate_memory(arch, EstimateRequest(**TT01, nf4_quantizer="torchao-0.1", gpus=2))
    assert one.peak_phase.startswith("model load") and not two.peak_phase.startswith("model load")
