"""Throughput and step time: FLOPs per token by method, a calibrated utilization, fixed per-step costs.

FLOPs per trained token (docs/estimation.md): full 6N (2N forward + 4N backward), LoRA/QLoRA 4N (no
weight gradients for the frozen base), +2N for the forward recomputed under activation checkpointing;
N counts the Linear layers a token passes through (top-k experts for MoE) plus the lm_head. Attention
adds 12*L*s*d per token for training, half with causal kernels (sdpa, flash).

Utilization (MFU) is relative to the GPU's measured dense bf16 matmul rate and calibrated per
implementation and method on the published runs (docs/estimation.md): the plain Hugging Face path
(Trainer + PEFT) and compiled stacks (torchtune, Unsloth). The GPU class enters through that
measured rate: consumer cards reach their datasheet figure, datacenter cards about 80% of it, and
with that one utilization per stack and method fits the RTX 4090, L40S and A100 runs alike.
Per-step costs that are not matmuls are
modelled from bandwidth: QLoRA's dequantization (28 ms per billion 4-bit parameters per micro-step on
an A100, scaled by memory bandwidth), the optimizer step (memory-bound pass over the trainable
state), and FSDP's all-gathers and reduce-scatters over the GPU interconnect (overlapped with compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bot.planner.architectures import Architecture
from bot.planner.gpus import GPU
from bot.planner.memory import trainable_parameters
from bot.planner.request import EstimateRequest

# MFU against measured matmul TFLOPS, by (stack, method); calibrated on the published runs. The
# Hugging Face figures come from unpacked, variable-length batches (PEFT benchmark), so they include
# padding waste and are conservative for packed runs. torch.compile multiplies by COMPILE_SPEEDUP
# (torchtune: 7075 -> 8998 tokens/s on Llama-3.2-3B).
MFU: dict[tuple[str, str], float] = {
    ("hf", "full"): 0.19,
    ("hf", "lora"): 0.34,
    ("hf", "qlora"): 0.34,
    ("torchtune", "full"): 0.57,
    ("torchtune", "lora"): 0.57,
    ("torchtune", "qlora"): 0.57,
    ("unsloth", "full"): 0.72,
    ("unsloth", "lora"): 0.72,
    ("unsloth", "qlora"): 0.72,
}
COMPILE_SPEEDUP = 1.27

# Eager PyTorch dispatches every op from Python, a fixed cost per op that FLOPs do not show. On a GPU
# the launches run ahead of the kernels (asynchronous), so a micro-step takes the longer of the two and
# real models are compute-bound; on a CPU each op runs where it is dispatched, so the costs add up and
# small models are dispatch-bound. Op counts: a decoder block's forward (norms, projections, rotary,
# attention, MLP, residuals), a LoRA adapter (dropout, A, B, scale, add, cast), embedding + final
# norm + lm_head + loss; the backward about twice the forward. The per-op costs are a CUDA launch
# with Python dispatch (~10 us) and, on the CPU, the runner's measured ~100 us per op for the tiny
# model on 2 cores (17k tokens/s: bench/README.md, `tunebot-runner make-tiny`).
OPS_PER_LAYER = 40
OPS_PER_ADAPTER = 6
OPS_OUTSIDE_LAYERS = 30
BACKWARD_OPS = 2.0
OP_SECONDS = {"cpu": 100e-6}
OP_SECONDS_GPU = 10e-6


def ops_per_micro_step(arch: Architecture, req: EstimateRequest) -> float:
    adapters = 0
    if req.method != "full":
        chosen = set(map(id, arch.lora_targets(req.lora_targets)))
        adapters = sum(g.layers * sum(id(lin) in chosen for lin in g.linears) for g in arch.groups)
    forward = arch.layers * OPS_PER_LAYER + OPS_PER_ADAPTER * adapters + OPS_OUTSIDE_LAYERS
    recompute = forward if req.gradient_checkpointing else 0.0
    return forward * (1.0 + BACKWARD_OPS) + recompute


DEQUANT_S_PER_BPARAM_A100 = 0.028
A100_BANDWIDTH_GBS = 2039.0


@dataclass(frozen=True)
class SpeedResult:
    tokens_per_second: float  # all GPUs together
    step_seconds: float  # one optimizer step (grad_accum micro-steps + the update)
    micro_step_seconds: float
    mfu: float
    flops_per_token: float


def flops_per_token(arch: Architecture, req: EstimateRequest) -> float:
    n = arch.matmul_parameters
    passes = 6.0 if req.method == "full" else 4.0
    if req.gradient_checkpointing:
        passes += 2.0
    attn_fwd = (2.0 if req.attn != "eager" else 4.0) * req.seq_len * arch.q_dim * arch.layers
    attn = attn_fwd * (4.0 if req.gradient_checkpointing else 3.0)
    adapters = 0.0 if req.method == "full" else 6.0 * trainable_parameters(arch, req)  # A and B matmuls
    return passes * n + attn + adapters


def estimate_speed(
    arch: Architecture, req: EstimateRequest, gpu: GPU, gpus: int | None = None
) -> SpeedResult:
    n_gpus = gpus or req.gpus
    mfu = MFU[(req.stack, req.method)] * (COMPILE_SPEEDUP if req.compile and req.stack != "unsloth" else 1.0)
    fpt = flops_per_token(arch, req)
    tokens_micro = req.batch_size * req.seq_len
    compute = tokens_micro * fpt / (mfu * gpu.matmul_tflops * 1e12)
    dispatch = ops_per_micro_step(arch, req) * OP_SECONDS.get(gpu.kind, OP_SECONDS_GPU)
    compute = compute + dispatch if gpu.kind == "cpu" else max(compute, dispatch)
    if req.method == "qlora":
        compute += (
            DEQUANT_S_PER_BPARAM_A100
            * arch.block_linear_params
            / 1e9
            * A100_BANDWIDTH_GBS
            / gpu.bandwidth_gbs
        )
    if n_gpus > 1:
        gathers = 3.0 if req.gradient_checkpointing else 2.0
        wbytes = arch.parameters * (0.55 if req.method == "qlora" else 2.0)
        trainable = trainable_parameters(arch, req)
        comm_bytes = (gathers * wbytes + 2.0 * trainable) * (n_gpus - 1) / n_gpus
        compute = max(compute, comm_bytes / (gpu.interconnect_gbs * 1e9))
    trainable = trainable_parameters(arch, req) / n_gpus
    pbytes = 2.0 if (req.method == "full" and req.precision == "bf16") or req.adapter_dtype == "bf16" else 4.0
    sbytes = 2.0 if req.optimizer != "adamw" else 2 * pbytes
    optimizer = 3.0 * trainable * (2 * pbytes + sbytes) / (gpu.bandwidth_gbs * 1e9)
    step = req.grad_accum * compute + optimizer
    tps = req.grad_accum * tokens_micro * n_gpus / step
    return SpeedResult(tps, step, compute, mfu, fpt)


def optimizer_steps(tokens: int, epochs: float, req: EstimateRequest, gpus: int | None = None) -> int:
    """ceil(tokens*epochs / tokens per optimizer step), packing assumed (every row full); <= max_steps."""
    per_step = req.batch_size * req.seq_len * req.grad_accum * (gpus or req.gpus)
    steps = max(1, math.ceil(tokens * epochs / per_step))
    return min(steps, req.max_steps) if req.max_steps else steps
