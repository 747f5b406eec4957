"""Per-op dispatch cost: small models on the CPU are dispatch-bound, real models on GPUs are not."""

from __future__ import annotations

import json
from pathlib import Path

from bot.planner import EstimateRequest
from bot.planner.architectures import from_config
from bot.planner.gpus import gpu
from bot.planner.models import resolve
from bot.planner.speed import OP_SECONDS_GPU, estimate_speed, ops_per_micro_step

# `tunebot-runner make-tiny`'s model (hidden 64, 2 layers, vocab 512); the runner trains its job
# (LoRA r=8 all-linear, seq 256, batch 4, accum 2, sdpa, no checkpointing) at about 17k tokens/s
# on 2 CPU cores.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}
TINY_JOB = dict(
    method="lora", lora_r=8, seq_len=256, batch_size=4, grad_accum=2, gradient_checkpointing=False
)


def test_the_tiny_model_on_the_cpu_is_priced_at_the_runners_measured_speed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    arch, source = resolve(str(tmp_path))
    assert source == "config file" and arch.parameters == from_config(TINY).parameters
    req = EstimateRequest(model=str(tmp_path), **TINY_JOB)
    speed = estimate_speed(arch, req, gpu("cpu"))
    # FLOPs alone would say hundreds of thousands of tokens/s; the runner measures ~17k.
    assert 17_000 / 1.3 <= speed.tokens_per_second <= 17_000 * 1.3


def test_dispatch_does_not_bind_a_real_model_on_a_gpu() -> None:
    arch, _ = resolve("meta-llama/Llama-3.1-8B")
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", seq_len=2048, batch_size=2)
    speed = estimate_speed(arch, req, gpu("rtx-4090"))
    assert ops_per_micro_step(arch, req) * OP_SECONDS_GPU < 0.1 * speed.micro_step_seconds


def test_checkpointing_and_adapters_add_ops() -> None:
    arch, _ = resolve("meta-llama/Llama-3.2-1B")
    base = EstimateRequest(model="x", method="full", gradient_checkpointing=False)
    assert ops_per_micro_step(
        arch, base.model_copy(update={"gradient_checkpointing": True})
    ) > ops_per_micro_step(arch, base)
    assert ops_per_micro_step(arch, base.model_copy(update={"method": "lora"})) > ops_per_micro_step(
        arch, base
    )


def test_the_optimizer_step_pays_for_every_trainable_tensor() -> None:
    """All-linear LoRA on a 28-layer model has 392 tensors (A and B of 7 Linears a layer): the optimizer step
    walks each of them in Python whatever its size, which a short step feels and the bandwidth term misses."""
    from bot.planner.speed import OPTIMIZER_SECONDS_PER_TENSOR, trainable_tensors

    arch, _ = resolve("Qwen/Qwen2.5-1.5B")
    req = EstimateRequest(model="Qwen/Qwen2.5-1.5B", seq_len=512)
    assert trainable_tensors(arch, req) == 2 * 7 * arch.layers == 392
    qv = req.model_copy(update={"lora_targets": ["q", "v"]})
    assert trainable_tensors(arch, qv) == 2 * 2 * arch.layers
    parts = estimate_speed(arch, req, gpu("h100-sxm")).parts
    assert parts is not None
    assert parts["optimizer (per step)"] >= 392 * OPTIMIZER_SECONDS_PER_TENSOR
    # a full fine-tune: every Linear's weight, two norms a layer, embedding, final norm, lm_head
    full = req.model_copy(update={"method": "full"})
    assert trainable_tensors(arch, full) == 7 * arch.layers + 2 * arch.layers + 3
