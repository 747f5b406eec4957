"""Throughput and step time from a roofline of a micro-step: matmuls, attention, memory traffic, fixed costs.

Utilization (MFU) is not a constant per stack: it is what falls out of timing every part of a micro-step on
the GPU's own rates, so it rises with tokens per micro-step (fixed costs are spread) and with model size
(memory-bound work grows with the hidden size, matmul work with its square):

- matmuls: FLOPs per token (full 6N, LoRA/QLoRA 4N, +2N recomputed under activation checkpointing; N = the
  Linear layers a token passes through plus the lm_head; adapters' own A and B matmuls) at MATMUL_EFF of the
  GPU's measured dense bf16 matmul rate, but never faster than reading the weights once per pass (a
  micro-step of a few tokens is bandwidth-bound);
- attention: 4*s*d FLOPs per token and layer forward (half under a causal kernel), x3 for training (x4 with
  recompute), at ATTN_EFF of the matmul rate for fused kernels (FlashAttention / SDPA); eager attention also
  writes and reads the s x s score matrix (memory-bound);
- memory-bound ops: every elementwise op of an eager block (RMSNorm in fp32, rotary, SiLU x up, residual adds,
  PEFT's adapter casts and scaling) and the loss over the vocabulary, counted as bytes read + written per
  token (elementwise_bytes_per_token) at the GPU's memory bandwidth; torch.compile fuses most of it
  (COMPILED_EW of it is left);
- QLoRA: each 4-bit weight is dequantized to bf16 on every pass that uses it (forward, input-gradient
  backward, and the recomputed forward): DEQUANT_BYTES per parameter and pass at the memory bandwidth;
- the optimizer step once per optimizer step: a memory-bound pass over weights, gradients and states
  (foreach AdamW rereads its states several times; fused and 8-bit optimizers once); gradient clipping too;
  and a fixed host cost per trainable tensor (OPTIMIZER_SECONDS_PER_TENSOR: the Python loops of the optimizer,
  clipping and zero_grad), which hundreds of tiny LoRA tensors make visible at short sequences;
- CPU dispatch: eager PyTorch launches every op from Python; on a GPU launches run ahead of the kernels, so a
  micro-step takes the longer of the two (small models at short sequences are dispatch-bound); on a CPU
  the costs add up;
- FSDP all-gathers and reduce-scatters over the GPU interconnect, overlapped with compute: NVLink on the
  SXM boards, PCIe on the others (GeForce cards without peer-to-peer: through host memory; planner/gpus.py).

The few efficiencies (MATMUL_EFF, ATTN_EFF, EW_SCALE, COMPILED_EW, DEQUANT_BYTES for torchao) are fitted on
the published tokens/s rows and checked by leaving one source out (bench/planner_crossval.py;
tests/planner/test_crossval.py). MFU reported = model FLOPs / (time x measured matmul rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bot.planner.architectures import Architecture
from bot.planner.gpus import GPU
from bot.planner.memory import (
    QK_NORM_MODELS,
    adamw_impl,
    estimate_memory,
    fp32_residual,
    nf4_quantizer,
    trainable_parameters,
)
from bot.planner.request import EstimateRequest


@dataclass(frozen=True)
class SpeedCoefficients:
    """What the roofline cannot count: fitted on the published tokens/s rows (checked leaving one out)."""

    matmul_eff: float = 0.880  # real-shape GEMMs vs the measured big-square matmul rate
    # SDPA (torch's kernels; masked batches run the memory-efficient one) vs the matmul rate
    attn_eff: float = 0.399
    ew_scale: float = 1.593  # counted eager elementwise bytes -> real (ops not counted: masks, copies, casts)
    compiled_ew: float = 0.05  # fraction of the eager elementwise traffic left after torch.compile
    torchao_dequant_bytes: float = 11.04  # torchao NF4 -> bf16 bytes moved per parameter per pass


FITTED = SpeedCoefficients()

# FlashAttention-2 forward + backward at long sequences, head dim 128, causal: ~190-200 TFLOPS on an A100
# (Dao, "FlashAttention-2", 2023: 50-73% of the 312 TFLOPS peak forward, the backward a little lower), i.e.
# about 0.72 of the measured dense matmul rate. Not fitted: no published row here runs flash attention at a
# long sequence.
FLASH_ATTN_EFF = 0.72

# bitsandbytes' dequantization: 28 ms per billion 4-bit parameters per checkpointed micro-step (three passes)
# on an A100 (2,039 GB/s), docs/estimation.md: 28e-3 / 3e9 x 2.039e12 = 19 bytes of traffic per parameter and
# pass - the kernel reads 0.5 B and writes 2 B but runs at a fraction of the bandwidth.
BNB_DEQUANT_BYTES = 19.0

# Eager PyTorch dispatches every op from Python, a fixed cost per op that FLOPs do not show. Op counts: a
# decoder block's forward (norms, projections, rotary, attention, MLP, residuals), a LoRA adapter (dropout, A,
# B, scale, add, cast), embedding + final norm + lm_head + loss; the backward about twice the forward. The
# per-op costs are a CUDA launch with Python dispatch (~10 us) and, on the CPU, the runner's measured ~100 us
# per op for the tiny model on 2 cores (17k tokens/s: bench/README.md, `tunebot-runner make-tiny`). A compiled
# stack launches fused kernels: about a third as many.
OPS_PER_LAYER = 40
OPS_PER_ADAPTER = 6
OPS_OUTSIDE_LAYERS = 30
BACKWARD_OPS = 2.0
OP_SECONDS = {"cpu": 100e-6}
OP_SECONDS_GPU = 10e-6
COMPILED_OPS = 1 / 3
# Every kernel holds the GPU for at least its launch-to-launch latency, however little it computes: ~4 us for
# back-to-back kernels on one stream (CUDA's launch overhead; the figure NVIDIA's Nsight timelines show
# between tiny kernels). At short sequences an eager LoRA step is thousands of kernels that each do almost
# nothing, so this floor - not FLOPs or bytes - sets the GPU time (the fixed per-step cost that makes MFU fall
# there).
KERNEL_FLOOR_S = 4e-6
# clip_grad_norm_: read every gradient for the norm, then read + write it to scale (per gradient byte)
GRAD_CLIP_BYTES = 3.0
# Host work per trainable tensor in every optimizer step, whatever its size: torch.optim.AdamW's
# _init_group walks the parameters in Python and gathers each one's gradient, two states and step counter
# into lists (torch/optim/adam.py), clip_grad_norm_ groups the gradients by device and dtype before its
# foreach norm (torch/nn/utils/clip_grad.py, _group_tensors_by_device_and_dtype), and
# zero_grad(set_to_none=True) walks them again (torch/optim/optimizer.py): ~1-2 us of Python each, plus the
# kernels multi_tensor_apply launches per few dozen tensors (ATen/native/cuda/MultiTensorApply.cuh,
# depth_to_max_tensors). LoRA has two tensors per adapted Linear per layer: 448 for all-linear on 32 layers.
OPTIMIZER_SECONDS_PER_TENSOR = 5e-6


def _adapted_linears(arch: Architecture, req: EstimateRequest) -> int:
    """Adapted Linear layers in the whole model (0 for a full fine-tune)."""
    if req.method == "full":
        return 0
    chosen = set(map(id, arch.lora_targets(req.lora_targets)))
    return sum(g.layers * sum(id(lin) in chosen for lin in g.linears) for g in arch.groups)


def forward_ops(arch: Architecture, req: EstimateRequest) -> float:
    """Ops one forward launches: every block's, every adapter's, and those outside the blocks."""
    return arch.layers * OPS_PER_LAYER + OPS_PER_ADAPTER * _adapted_linears(arch, req) + OPS_OUTSIDE_LAYERS


def ops_per_micro_step(arch: Architecture, req: EstimateRequest) -> float:
    forward = forward_ops(arch, req)
    recompute = forward if req.gradient_checkpointing else 0.0
    return forward * (1.0 + BACKWARD_OPS) + recompute


def trainable_tensors(arch: Architecture, req: EstimateRequest) -> int:
    """Tensors the optimizer updates: A and B of every adapted Linear; for a full fine-tune every Linear's
    weight, two norms per block, the embedding, the final norm and (untied) the lm_head."""
    if req.method != "full":
        return 2 * _adapted_linears(arch, req)
    linears = sum(g.layers * len(g.linears) for g in arch.groups)
    return linears + 2 * arch.layers + 3


@dataclass(frozen=True)
class SpeedResult:
    tokens_per_second: float  # all GPUs together
    step_seconds: float  # one optimizer step (grad_accum micro-steps + the update)
    micro_step_seconds: float
    mfu: float
    flops_per_token: float
    parts: dict[str, float] | None = None  # seconds per micro-step by part (matmul, attention, ...)


def _linear_flops_per_token(arch: Architecture, req: EstimateRequest) -> float:
    passes = 6.0 if req.method == "full" else 4.0
    if req.gradient_checkpointing:
        passes += 2.0
    adapters = 0.0 if req.method == "full" else 6.0 * trainable_parameters(arch, req)  # A and B matmuls
    # The runner's chunked loss recomputes each chunk's logits in backward: one more lm_head forward.
    recompute = 2.0 * arch.vocab * arch.hidden if req.loss == "chunked" else 0.0
    return passes * arch.matmul_parameters + adapters + recompute


def _attention_flops_per_token(arch: Architecture, req: EstimateRequest) -> float:
    attn_fwd = (2.0 if req.attn != "eager" else 4.0) * req.seq_len * arch.q_dim * arch.layers
    return attn_fwd * (4.0 if req.gradient_checkpointing else 3.0)


def flops_per_token(arch: Architecture, req: EstimateRequest) -> float:
    return _linear_flops_per_token(arch, req) + _attention_flops_per_token(arch, req)


def elementwise_bytes_per_token(arch: Architecture, req: EstimateRequest) -> float:
    """Bytes an eager forward of one block reads and writes per token outside matmuls and attention kernels.

    Counted op by op from transformers' Llama block (modeling_llama.py): LlamaRMSNorm upcasts to fp32,
    squares, takes the mean, multiplies, casts back and scales (~36 B per element); apply_rotary_pos_emb on q
    and k (x*cos, rotate_half's slices, negation and cat, *sin, add: ~20 B per element); act_fn(gate) * up (10
    B per element of the MLP width); two residual adds (6 B per element each); the attention output's
    transpose + reshape copy (4 B). PEFT's LoRA layer casts its input to the adapter dtype, scales the adapter
    output and adds it (fp32 adapters: 6 B per input element + 16 B per output element; bf16 adapters 10 B per
    output element). With fp32 activations (fp32 precision, or prepare_model_for_kbit_training's fp32 residual
    stream) the residual and norm traffic doubles.
    """
    h, q, kv, f = arch.hidden, arch.q_dim, arch.kv_dim, arch.ffn_per_token
    wide = req.precision == "fp32" or fp32_residual(req, req.gpus)
    norms = 4 if arch.model_type.startswith(("gemma2", "gemma3")) else 2
    norm = norms * 36.0 * h + (36.0 * (q + kv) if arch.model_type in QK_NORM_MODELS else 0.0)
    residual = 2 * 6.0 * h
    if wide:
        norm, residual = 2 * norm, 2 * residual
    rotary = 20.0 * (q + kv)
    mlp = (10.0 if arch.gated_mlp else 4.0) * f
    layout = 4.0 * q
    adapters = 0.0
    if req.method != "full":
        fp32 = req.adapter_dtype == "fp32" or req.precision == "fp32"
        for lin in arch.lora_targets(req.lora_targets):
            per_token = lin.active if lin.count > 1 else 1
            adapters += per_token * ((6.0 * lin.d_in + 16.0 * lin.d_out) if fp32 else 10.0 * lin.d_out)
    return norm + residual + rotary + mlp + layout + adapters


def loss_bytes_per_token(arch: Architecture, req: EstimateRequest) -> float:
    """Memory traffic of the loss over the vocabulary per token: logits written, upcast, log-softmax (two
    passes), its gradient and the cast back (~50 B per vocabulary entry on the plain path); a compiled or
    chunked loss fuses it to a read and a write of 16-bit logits and their gradient (~8 B)."""
    if req.loss == "liger":
        per_entry = 8.0  # one fused kernel: logits chunk written, read, gradient written in place
    elif req.loss == "chunked":
        per_entry = 54.0  # the plain traffic, plus the recomputed bf16 logits written and read
    else:
        per_entry = 8.0 if (req.chunked_ce or req.compile) else 50.0
    return per_entry * arch.vocab


def _optimizer_bytes_per_param(req: EstimateRequest) -> tuple[float, float]:
    """(bytes moved per trainable parameter by one optimizer step, gradient bytes per parameter)."""
    pbytes = (
        2.0
        if (req.method == "full" and req.precision == "bf16")
        or (req.method != "full" and req.adapter_dtype == "bf16" and req.precision != "fp32")
        else 4.0
    )
    if req.optimizer != "adamw":
        # bitsandbytes' 8-bit AdamW: one fused kernel reads weight, grad and two 1-byte states, writes back.
        return 2 * pbytes + pbytes + 4.0, pbytes
    if adamw_impl(req) != "fused":
        # torch's foreach AdamW (and the for-loop one alike): lerp, mul, addcmul, sqrt (a temporary),
        # div, add, addcdiv and the decoupled weight decay each pass over whole lists: ~11 state reads/writes,
        # 3 gradient and 4 weight passes.
        return 11 * pbytes + 3 * pbytes + 4 * pbytes, pbytes
    # fused AdamW (the runner on CUDA, torchtune): weight, grad and both states read once, weight and states
    # written.
    return 2 * pbytes + pbytes + 4 * pbytes, pbytes


def estimate_speed(
    arch: Architecture,
    req: EstimateRequest,
    gpu: GPU,
    gpus: int | None = None,
    coef: SpeedCoefficients = FITTED,
) -> SpeedResult:
    n_gpus = gpus or req.gpus
    tokens_micro = req.batch_size * req.seq_len
    rate = gpu.matmul_tflops * 1e12
    bandwidth = gpu.bandwidth_gbs * 1e9
    cpu = gpu.kind == "cpu"

    linear_flops = _linear_flops_per_token(arch, req) * tokens_micro
    attn_flops = _attention_flops_per_token(arch, req) * tokens_micro
    passes = 3.0 + (1.0 if req.gradient_checkpointing else 0.0)
    weight_bytes = (0.5625 if req.method == "qlora" else 2.0) * arch.matmul_parameters * passes
    t_matmul = max(linear_flops / (rate * coef.matmul_eff), weight_bytes / bandwidth)
    attn_eff = {"eager": coef.matmul_eff, "flash": FLASH_ATTN_EFF}.get(req.attn, coef.attn_eff)
    t_attn = attn_flops / (rate * attn_eff)
    if (
        req.attn == "eager"
    ):  # the s x s scores: bf16 written, fp32 softmax read + written, read back; x3 training
        t_attn += arch.heads * req.seq_len * tokens_micro * arch.layers * 12.0 * passes / bandwidth
    ew_fraction = coef.compiled_ew if req.compile else 1.0
    ew_bytes = elementwise_bytes_per_token(arch, req) * arch.layers * passes * coef.ew_scale * ew_fraction
    t_elementwise = tokens_micro * (ew_bytes + loss_bytes_per_token(arch, req)) / bandwidth
    t_dequant = 0.0
    if req.method == "qlora":
        per_param = BNB_DEQUANT_BYTES if nf4_quantizer(req) == "bitsandbytes" else coef.torchao_dequant_bytes
        if req.stack == "unsloth":
            per_param = 2.5  # Unsloth's fused kernel: read 0.5 B, write 2 B into its reused buffer
        t_dequant = arch.block_linear_params * per_param * (passes - 1.0) / bandwidth
    ops = ops_per_micro_step(arch, req) * (COMPILED_OPS if req.compile else 1.0)
    t_kernels = 0.0 if cpu else ops * KERNEL_FLOOR_S
    gpu_seconds = t_matmul + t_attn + t_elementwise + t_dequant + t_kernels

    dispatch = ops * OP_SECONDS.get(gpu.kind, OP_SECONDS_GPU)
    compute = gpu_seconds + dispatch if cpu else max(gpu_seconds, dispatch)
    comm = 0.0
    if n_gpus > 1:
        gathers = 3.0 if req.gradient_checkpointing else 2.0
        wbytes = arch.parameters * (0.55 if req.method == "qlora" else 2.0)
        trainable = trainable_parameters(arch, req)
        # gradients reduce-scattered in fp32 after mixed precision (the runner's FSDP MixedPrecision)
        grad_bytes = 4.0 if req.method == "full" and req.precision != "bf16" else 2.0
        link = gpu.interconnect_gbs * 1e9
        comm = (gathers * wbytes + grad_bytes * trainable) * (n_gpus - 1) / n_gpus / link
        compute = max(compute, comm)
    trainable_local = trainable_parameters(arch, req) / n_gpus
    opt_bytes, grad_bytes = _optimizer_bytes_per_param(req)
    optimizer = trainable_local * (opt_bytes + GRAD_CLIP_BYTES * grad_bytes) / bandwidth
    if req.optimizer_in_backward:
        optimizer = trainable_local * opt_bytes / bandwidth  # fused into backward, no clipping pass
    per_tensor = trainable_tensors(arch, req) * OPTIMIZER_SECONDS_PER_TENSOR
    if req.optimizer_in_backward:
        per_tensor = 0.0  # each parameter's step runs in its own backward hook, among the backward's ops
    optimizer += per_tensor
    if req.optimizer == "paged_adamw_8bit" and not cpu:
        # bitsandbytes' paged states live in CUDA unified memory: what does not fit beside the rest of the
        # step is paged in over the host link and back out every optimizer step.
        mem = estimate_memory(arch, req, n_gpus)
        paged = mem.offloaded.get("optimizer (paged, may spill to CPU)", 0.0)
        room = max(0.0, gpu.memory_gb * 1e9 - mem.per_gpu_bytes)
        optimizer += 2.0 * max(0.0, paged - room) / (gpu.host_link_gbs * 1e9)
    step = req.grad_accum * compute + optimizer
    tps = req.grad_accum * tokens_micro * n_gpus / step
    fpt = (linear_flops + attn_flops) / tokens_micro
    mfu = fpt * tps / n_gpus / rate
    parts = {
        "matmul": t_matmul,
        "attention": t_attn,
        "elementwise": t_elementwise,
        "dequantize": t_dequant,
        "kernel launches": t_kernels,
        "dispatch": dispatch,
        "communication": comm,
        "optimizer (per step)": optimizer,
    }
    return SpeedResult(tps, step, compute, mfu, fpt, parts)


def optimizer_steps(tokens: int, epochs: float, req: EstimateRequest, gpus: int | None = None) -> int:
    """ceil(tokens*epochs / tokens per optimizer step), packing assumed (every row full); <= max_steps."""
    per_step = req.batch_size * req.seq_len * req.grad_accum * (gpus or req.gpus)
    steps = max(1, math.ceil(tokens * epochs / per_step))
    return min(steps, req.max_steps) if req.max_steps else steps
