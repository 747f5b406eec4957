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
from runner.contract.spec import chunk_tokens


@dataclass(frozen=True)
class SpeedCoefficients:
    """What the roofline cannot count: fitted on the published tokens/s rows (checked leaving one out)."""

    matmul_eff: float = 0.876  # real-shape GEMMs vs the measured big-square matmul rate
    # SDPA (torch's kernels; masked batches run the memory-efficient one) vs the matmul rate
    attn_eff: float = 0.425
    ew_scale: float = 1.512  # counted eager elementwise bytes -> real (ops not counted: masks, copies, casts)
    compiled_ew: float = 0.05  # fraction of the eager elementwise traffic left after torch.compile
    torchao_dequant_bytes: float = 10.23  # torchao NF4 -> bf16 bytes moved per parameter per pass


FITTED = SpeedCoefficients()

# FlashAttention-2 forward + backward at long sequences, head dim 128, causal: ~190-200 TFLOPS on an A100
# (Dao, "FlashAttention-2", 2023: 50-73% of the 312 TFLOPS peak forward, the backward a little lower), i.e.
# about 0.72 of the measured dense matmul rate. Not fitted: no published row here runs flash attention at a
# long sequence.
FLASH_ATTN_EFF = 0.72
# SDPA on the CPU (its flash kernel for CPUs, the block mask of packed rows, no causal skipping) against the
# CPU's GEMM rate: 48 GFLOPS a core forward and backward at head dimension 16, 512-2,048 tokens, against 70
# for the GEMMs (one thread, bench/quote_vs_run.py's machine).
CPU_ATTN_EFF = 0.6

# bitsandbytes' dequantization: 28 ms per billion 4-bit parameters per checkpointed micro-step (three passes)
# on an A100 (2,039 GB/s), docs/estimation.md: 28e-3 / 3e9 x 2.039e12 = 19 bytes of traffic per parameter and
# pass - the kernel reads 0.5 B and writes 2 B but runs at a fraction of the bandwidth.
BNB_DEQUANT_BYTES = 19.0

# The host side of a step: eager PyTorch dispatches every aten op from Python (its module's code, the
# dispatcher, autograd's record, the kernel launch), a cost per op that FLOPs do not show and that rules small
# models, micro-batch 1 on fast GPUs, and the CPU. The ops are counted from the libraries the runner trains
# with, component by component, as memory.py counts tensors: transformers' LlamaDecoderLayer with SDPA
# (input and post-attention RMSNorm, q/k/v/o projections, rotary embedding, attention, SwiGLU MLP, two
# residual adds), peft's lora.Linear (the frozen layer, then A and B with the scaling added to its output),
# torch.utils.checkpoint without reentrance (the block's forward again in backward, with its saved-tensor
# hooks), torch.optim.AdamW's for-loop step on the CPU (9 ops a tensor with clipping and zero_grad), the
# runner's chunked loss. tests/planner/test_host_ops.py counts them again with a TorchDispatchMode on the
# runner's own step of tiny models (1-3 layers; LoRA on one, two or all Linears; a full fine-tune; with and
# without checkpointing): the formulas below must give what it counts.
BLOCK_FORWARD_OPS = 84  # one decoder block's forward, recorded for backward
BLOCK_FORWARD_CKPT_OPS = 81  # ... under non-reentrant checkpointing (its first forward keeps nothing)
BLOCK_EVAL_OPS = 81  # ... under no_grad (evals, samples)
# A block's backward: a frozen base computes its input's gradient only; a full fine-tune also every weight's.
# Under checkpointing the backward recomputes the block's forward first, with its hooks.
BLOCK_BACKWARD_OPS = {"frozen": 102, "full": 145}
BLOCK_BACKWARD_CKPT_OPS = {"frozen": 207, "full": 286}
ADAPTER_FORWARD_OPS = 10  # peft's lora.Linear beside its frozen layer: dropout, A, B, scale, add
ADAPTER_BACKWARD_OPS = 20
ADAPTER_BACKWARD_CKPT_OPS = 38  # the adapter's forward again, then its backward
NORM_FORWARD_OPS = 6  # RMSNorm in fp32: pow, mean, add, rsqrt, mul, mul by its weight
NORM_BACKWARD_OPS = 10
# Outside the blocks: the embedding, the rotary tables, the packed rows' mask transformers derives from their
# position ids, the final norm, the lm_head and the loss.
OUTSIDE_FORWARD_OPS = 75
OUTSIDE_EVAL_OPS = 72
OUTSIDE_BACKWARD_OPS = {"full": 58, "frozen_ckpt": 39}
# A LoRA step without checkpointing: the first block's frozen input needs no gradient, which saves these.
FIRST_BLOCK_SAVED_OPS = 18
CHUNK_OPS = 21  # the chunked loss's ops per chunk of chunk_tokens(vocab) tokens past the first: its
# logits, log-softmax and gather forward (7), recomputed and differentiated in backward
OPTIMIZER_OPS_PER_TENSOR = 9  # AdamW's for-loop (torch's default on the CPU), clipping, zero_grad: per tensor
OPTIMIZER_OPS_FIXED = 12  # the norm's total, the scheduler
# Under bf16 autocast on CUDA (the runner's LoRA and QLoRA since issue 37, a mixed-precision full fine-tune):
# each RMSNorm upcasts and casts back, each fp32 adapter's weights and input are cast for its matmuls. A
# bitsandbytes 4-bit Linear is a Python autograd.Function (bitsandbytes/autograd/_functions.py MatMul4Bit)
# that dequantizes its weight through bitsandbytes' Python functional API before each of its matmuls
# (forward, input gradient, recompute): about ten ops' worth of host time a pass.
AUTOCAST_OPS_PER_NORM = 4
AUTOCAST_OPS_PER_ADAPTER = 6
DEQUANT_OPS_PER_LINEAR = 10

# Host seconds per dispatched op. The CPU: the development machine's runner step (torch 2.11, the tiny model
# at 64 tokens, where compute is nothing: ~1,400 ops in 6.2-6.4 ms of CPU time, bench/quote_vs_run.py), whose
# compute shares the same core. A GPU host: the Python module code, the dispatcher, autograd's node and
# cudaLaunchKernel, ~15 us an op; the launches run ahead of the kernels, so a step takes the longer of the
# two. Checked on the only GPU measurements of the runner's step (bench/gpu_check/README.md, H200,
# Llama-3.2-1B LoRA at micro-batch 1: ~200 ms a step at both 1,024 and 4,096 tokens for ~11,000 ops:
# tests/planner/test_host_ops.py). A compiled stack launches fused kernels: about a third as many.
OP_SECONDS = {"cpu": 3.6e-6}
OP_SECONDS_GPU = 15e-6
COMPILED_OPS = 1 / 3
# Every kernel holds the GPU for at least its launch-to-launch latency, however little it computes: ~4 us for
# back-to-back kernels on one stream (CUDA's launch overhead; the figure NVIDIA's Nsight timelines show
# between tiny kernels). At short sequences an eager LoRA step is thousands of kernels that each do almost
# nothing, so this floor - not FLOPs or bytes - sets the GPU time (the fixed per-step cost that makes MFU fall
# there).
KERNEL_FLOOR_S = 4e-6
# clip_grad_norm_: read every gradient for the norm, then read + write it to scale (per gradient byte)
GRAD_CLIP_BYTES = 3.0
# Host work per trainable tensor in every optimizer step on a GPU, whatever its size: torch.optim.AdamW's
# _init_group walks the parameters in Python and gathers each one's gradient, two states and step counter
# into lists (torch/optim/adam.py), clip_grad_norm_ groups the gradients by device and dtype before its
# foreach norm (torch/nn/utils/clip_grad.py, _group_tensors_by_device_and_dtype), and
# zero_grad(set_to_none=True) walks them again (torch/optim/optimizer.py): ~1-2 us of Python each, plus the
# kernels multi_tensor_apply launches per few dozen tensors (ATen/native/cuda/MultiTensorApply.cuh,
# depth_to_max_tensors). LoRA has two tensors per adapted Linear per layer: 448 for all-linear on 32 layers.
# On the CPU the for-loop step dispatches every tensor's ops instead (OPTIMIZER_OPS_PER_TENSOR).
OPTIMIZER_SECONDS_PER_TENSOR = 5e-6
# The runner's work between two steps (runner/train.py, the logging phase): the chart's point, the
# scheduler's rate, W&B when on, the cap check, the step's line every report; on a GPU the loss read back.
LOGGING_SECONDS_PER_STEP = {"cpu": 1e-4}
LOGGING_SECONDS_PER_STEP_GPU = 5e-4


def _adapted_linears(arch: Architecture, req: EstimateRequest) -> int:
    """Adapted Linear layers in the whole model (0 for a full fine-tune)."""
    if req.method == "full":
        return 0
    chosen = set(map(id, arch.lora_targets(req.lora_targets)))
    return sum(g.layers * sum(id(lin) in chosen for lin in g.linears) for g in arch.groups)


def _extra_norms(arch: Architecture) -> int:
    """RMSNorms a block has beyond Llama's two: Gemma 2/3's pre- and post-norms, q/k norms."""
    extra = 2 if arch.model_type.startswith(("gemma2", "gemma3")) else 0
    return extra + (2 if arch.model_type in QK_NORM_MODELS else 0)


def _chunks(arch: Architecture, req: EstimateRequest) -> int:
    """The chunked loss's chunks per micro-step past the first (runner/loss.py)."""
    if req.loss != "chunked":
        return 0
    return max(0, math.ceil(req.batch_size * req.seq_len / chunk_tokens(arch.vocab)) - 1)


def _autocast_ops(arch: Architecture, req: EstimateRequest, adapters: int, passes: float) -> float:
    """Casts and dequantizations a CUDA step adds: under autocast every norm's and adapter's, and a 4-bit
    Linear's dequantization on each pass that uses its weight."""
    extra = 0.0
    if req.autocast:
        extra += passes * (2 + _extra_norms(arch)) * arch.layers * AUTOCAST_OPS_PER_NORM / 2
        extra += passes * adapters * AUTOCAST_OPS_PER_ADAPTER / 2
    if req.method == "qlora":
        linears = sum(g.layers * len(g.linears) for g in arch.groups)
        extra += (passes - 1) * linears * DEQUANT_OPS_PER_LINEAR
    return extra


def forward_ops(arch: Architecture, req: EstimateRequest, *, device: str = "cuda") -> float:
    """Ops one forward without autograd dispatches (an eval pass, a sample's token): every block's, every
    adapter's, the norms beyond Llama's, those outside the blocks."""
    adapters = _adapted_linears(arch, req)
    ops = arch.layers * (BLOCK_EVAL_OPS + _extra_norms(arch) * NORM_FORWARD_OPS) + OUTSIDE_EVAL_OPS
    ops += ADAPTER_FORWARD_OPS * adapters + CHUNK_OPS / 3 * _chunks(arch, req)
    return ops + (_autocast_ops(arch, req, adapters, 1.0) if device != "cpu" else 0.0)


def ops_per_micro_step(arch: Architecture, req: EstimateRequest, *, device: str = "cuda") -> float:
    """Ops one training micro-step dispatches: forward, backward (and the recomputed forward under
    checkpointing), as counted from the libraries (see BLOCK_FORWARD_OPS)."""
    adapters = _adapted_linears(arch, req)
    ckpt = req.gradient_checkpointing
    kind = "full" if req.method == "full" else "frozen"
    norms = _extra_norms(arch) * (NORM_FORWARD_OPS * (2 if ckpt else 1) + NORM_BACKWARD_OPS)
    block = (BLOCK_FORWARD_CKPT_OPS if ckpt else BLOCK_FORWARD_OPS) + norms
    block += (BLOCK_BACKWARD_CKPT_OPS if ckpt else BLOCK_BACKWARD_OPS)[kind]
    adapter = ADAPTER_FORWARD_OPS + (ADAPTER_BACKWARD_CKPT_OPS if ckpt else ADAPTER_BACKWARD_OPS)
    ops = arch.layers * block + adapters * adapter + OUTSIDE_FORWARD_OPS + (1 if ckpt else 0)
    if kind == "full":
        ops += OUTSIDE_BACKWARD_OPS["full"]
    elif ckpt:
        ops += OUTSIDE_BACKWARD_OPS["frozen_ckpt"]
    else:
        ops += 2 * adapters / max(arch.layers, 1) - FIRST_BLOCK_SAVED_OPS
    ops += CHUNK_OPS * _chunks(arch, req)
    if device != "cpu":
        ops += _autocast_ops(arch, req, adapters, 4.0 if ckpt else 3.0)
    return ops


def optimizer_ops(arch: Architecture, req: EstimateRequest) -> float:
    """Ops the CPU's for-loop AdamW step dispatches (clipping and zero_grad included)."""
    return OPTIMIZER_OPS_PER_TENSOR * trainable_tensors(arch, req) + OPTIMIZER_OPS_FIXED


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


def _attention_flops_per_token(arch: Architecture, req: EstimateRequest, *, cpu: bool = False) -> float:
    """Attention's FLOPs per token: half of the s x s work under a causal kernel (FlashAttention, SDPA's
    causal path, the runner's variable-length kernel for packed rows on CUDA); all of it where a mask takes
    the kernel off causal skipping (eager; the CPU, where transformers hands SDPA the packed rows' block
    mask)."""
    full = req.attn == "eager" or cpu
    attn_fwd = (4.0 if full else 2.0) * req.seq_len * arch.q_dim * arch.layers
    return attn_fwd * (4.0 if req.gradient_checkpointing else 3.0)


def _lm_head_passes(req: EstimateRequest) -> float:
    """Matmuls over the lm_head per token: forward, the input's gradient (and its weight's in a full
    fine-tune), the chunked loss's recompute."""
    return 2.0 * ((3.0 if req.method == "full" else 2.0) + (1.0 if req.loss == "chunked" else 0.0))


def fp32_stream(req: EstimateRequest, gpus: int, gpu: GPU) -> bool:
    """QLoRA computing its residual stream, attention and lm_head in fp32 on a GPU: the upcast without
    autocast."""
    return gpu.kind != "cpu" and fp32_residual(req, gpus) and not req.autocast


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
    cpu = gpu.kind == "cpu"
    # Each op at the dtype it runs in: bf16 on a GPU's tensor cores (the runner's LoRA and QLoRA under
    # autocast since issue 37, a mixed full fine-tune), TF32 where the request computes in fp32 (the runner
    # turns TF32 on), fp32 on the CPU (its matmul rate is fp32's).
    rate = gpu.matmul_tflops * 1e12
    if not cpu and req.precision == "fp32":
        rate /= 2.0  # TF32: half the bf16 tensor rate
    bandwidth = gpu.bandwidth_gbs * 1e9

    linear_flops = _linear_flops_per_token(arch, req) * tokens_micro
    attn_flops = _attention_flops_per_token(arch, req, cpu=cpu) * tokens_micro
    passes = 3.0 + (1.0 if req.gradient_checkpointing else 0.0)
    weight_bytes = (0.5625 if req.method == "qlora" else 2.0) * arch.matmul_parameters * passes
    if cpu:
        weight_bytes *= 2.0  # fp32 weights
    t_matmul = max(linear_flops / (rate * coef.matmul_eff), weight_bytes / bandwidth)
    attn_eff = {"eager": coef.matmul_eff, "flash": FLASH_ATTN_EFF}.get(req.attn, coef.attn_eff)
    if cpu:
        attn_eff = CPU_ATTN_EFF
    attn_rate = rate
    if fp32_stream(req, n_gpus, gpu):
        # QLoRA on the upcast residual stream without autocast (peft's prepare_model_for_kbit_training, the
        # runner before issue 37): fp32 queries reach attention (SDPA's math kernel) and fp32 hidden states
        # the lm_head, both off the tensor cores.
        attn_rate = (gpu.fp32_tflops or gpu.matmul_tflops / 12) * 1e12
        head = _lm_head_passes(req) * arch.vocab * arch.hidden * tokens_micro
        t_matmul += head / (attn_rate * coef.matmul_eff) - head / (rate * coef.matmul_eff)
    t_attn = attn_flops / (attn_rate * attn_eff)
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
    if cpu and req.packing:
        # transformers builds the packed rows' block mask from their position ids on the host: s x s booleans
        # a row, written and read by the attention of every layer
        t_elementwise += req.batch_size * req.seq_len**2 * (1.0 + arch.layers * passes) / bandwidth
    ops = ops_per_micro_step(arch, req, device=gpu.kind) * (COMPILED_OPS if req.compile else 1.0)
    t_kernels = 0.0 if cpu else ops * KERNEL_FLOOR_S
    gpu_seconds = t_matmul + t_attn + t_elementwise + t_dequant + t_kernels

    op_seconds = OP_SECONDS.get(gpu.kind, OP_SECONDS_GPU) * gpu.host_factor
    dispatch = ops * op_seconds
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
    if cpu:  # torch's for-loop AdamW on the CPU: every tensor's ops dispatched one by one
        per_tensor = optimizer_ops(arch, req) * op_seconds
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
    logging = LOGGING_SECONDS_PER_STEP.get(gpu.kind, LOGGING_SECONDS_PER_STEP_GPU) * gpu.host_factor
    step = req.grad_accum * compute + optimizer + logging
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
        "logging (per step)": logging,
        "step": step,  # the whole optimizer step, before any calibration scales it
    }
    return SpeedResult(tps, step, compute, mfu, fpt, parts)


def optimizer_steps(tokens: int, epochs: float, req: EstimateRequest, gpus: int | None = None) -> int:
    """ceil(tokens*epochs / tokens per optimizer step), packing assumed (every row full); <= max_steps."""
    per_step = req.batch_size * req.seq_len * req.grad_accum * (gpus or req.gpus)
    steps = max(1, math.ceil(tokens * epochs / per_step))
    return min(steps, req.max_steps) if req.max_steps else steps
