"""Peak reserved memory per GPU, with a breakdown by component and the phase where the peak happens.

Physics (docs/estimation.md): weights by dtype (NF4 only for the Linear layers inside the blocks),
LoRA adapters (exact count, fp32 by default), gradients and optimizer states of the trainable
parameters, activations saved for backward (counted tensor by tensor for a Llama-style block, so
GQA, MoE, frozen-vs-trainable Linear inputs and the attention kernel all show), logits and loss,
CUDA context, and the caching allocator's slack on transient tensors. FSDP shards weights,
gradients and optimizer states across GPUs; activations and logits stay per GPU. The activation
count is checked against the tensors autograd really saves in Hugging Face's Llama, Qwen2, Qwen3,
Gemma 2, Phi-3 and Mixtral blocks (tests/planner/test_activation_physics.py).

Moments of a step compete for the peak: the start of backward (all saved activations + logits alive);
under checkpointing, the recompute of the last block (the layer inputs + that block's working set, the
logits already freed: never both at once, see the phases below); the end of backward (all gradients alive +
one layer's working set) and the optimizer step (gradients + optimizer temporaries: torch's default foreach
AdamW allocates one the size of the states). The breakdown is that of the winning moment. For QLoRA on one
GPU one more comes before the first step: quantizing the model on the GPU (bot/planner/load_phase.py). What
it reserves beyond the step's total shows as "allocator" (the caching allocator keeps it, and the step runs
inside it).

Stack- and library-dependent mechanisms (issue 11), each from the libraries' code or a traced step:
- the loss: transformers' ForCausalLMLoss upcasts the logits (LOGIT_BYTES "plain", traced); a 16-bit loss
  (loss_upcast=False: fp16 + DeepSpeed without autocast, model code that never upcasts) keeps them 16-bit;
- QLoRA on one GPU: peft's prepare_model_for_kbit_training casts the non-4-bit parameters to fp32 and the
  residual stream becomes fp32 (qlora_upcast, fp32_residual; not for GPTQ/AQLM/EETQ/HQQ/torchao bases, and
  not under FSDP in the runner); checked on the CPU with bitsandbytes (test_activation_physics.py);
- bitsandbytes 0.50's MatMul4Bit keeps only the packed weight for backward (ctx.tensors = (None, B) in
  bitsandbytes/autograd/_functions.py), so a frozen 4-bit Linear saves no input (older versions kept A);
- the optimizer: torch's foreach AdamW (its default on CUDA when fused is not asked for: the HF Trainer's
  adamw_torch before torch 2.8, PEFT's benchmark) allocates a temporary the size of the states in the step;
  fused (tunebot's runner on CUDA, torchtune) and for-loop (torch < 2.0) do not (adamw_impl);
- several GPUs: NCCL buffers beside the CUDA context (device memory, not torch's), and FSDP's unsharded
  buffers (fsdp_terms; issue 29 replaced the one fitted coefficient, fsdp_units, by FSDP's own mechanisms).

Mechanisms added for issue 21 (named terms below, each with its library pointer):
- loss_path_bytes: the runner's own loss (runner/loss.py, chunked by default) holds one chunk of logits, not
  the sequence's; liger's fused kernel likewise; "plain" is every published stack's path. Checked against
  traced steps of the runner's loss (tests/planner/test_traced_step.py: Llama-3.1-8B LoRA at 16,384 tokens
  needs 28.9 GB instead of 47.3);
- forward_transient_bytes: peft's LoRA output and its scaled copy (fp32 without autocast) in the busiest
  moment of a block's forward, the peak once the logits no longer are (a chunked loss under checkpointing);
- bitsandbytes' Linear4bit returns fp32 projections on the fp32 residual stream (q, k, v and the MLP saved in
  fp32), and fp32 inputs need no per-adapter cast copy (_activation_bytes_per_token_layer);
- fsdp_terms: units in flight, FSDP1's gradients for frozen tensors that share a flat parameter with
  trainable ones (use_orig_params=True with whole-block wrapping), and CPU offload of the shards; issue 29:
  the root unit unsharded through forward and backward, units in flight from the prefetch and FSDP1's free
  queue, unsharded gradients before reduce-scatter, bitsandbytes' quant state on every GPU (gloo-checked:
  tests/planner/test_fsdp_mechanisms.py);
- issue 29: the allocator mode (allocator_mode: expandable segments, the runner's, or the default allocator
  with fixed or varying shapes) and the for-loop AdamW's temporaries (optimizer_step_bytes, traced:
  tests/planner/test_optimizer_mechanisms.py);
- fp32 logits are not twice the bf16 path's (FP32_LOGIT_BYTES);
- cublas_workspace: cuBLAS' per-stream workspace, torch-reserved on every rank (CUBLAS_WORKSPACE_BYTES);
- autocast follows the runner (request.runner_autocast): its LoRA/QLoRA steps keep fp32 adapter input copies.

Calibration constants (few, each a physical quantity):
- LOGIT_BYTES: bytes per token per vocabulary entry for logits and loss at their peak. Hugging Face path: 12,
  traced (bench/allocator_replay `trace.py hf`, Llama-3.1-8B at 16,384 tokens: the allocated peak is the
  weights, the checkpointed inputs and 12.1 B per token and vocabulary entry): ForCausalLMLoss's fp32 upcast
  and the log-softmax output, then its gradient and log_softmax_backward's output while the saved output is
  still alive (the upcast copy and the bf16 logits are gone by then; the runner drops its reference too).
  transformers < 4.45 kept the fp32 logits as the model's output plus a shifted contiguous copy (18,
  EstimateRequest.legacy_logits); a 16-bit loss (loss_upcast=False) 8; compiled loss keeps the upcast fused
  (10); a compiled chunked cross-entropy keeps only the bf16 logits and recomputes the rest chunk by chunk
  (2).
- CUDA_CONTEXT_GB = 1.2 (0.6-1.3 GB measured; HF measured 1.34 GB including cuBLAS workspaces).
- FRAGMENTATION: reserved/allocated on transient tensors at the peak: 1.02 with expandable segments (the
  runner: traced steps replayed through the emulation need 1.00-1.05x of their tensors whatever the shapes),
  else 1.03 packed or fixed length, 1.12 with variable-length (unpacked) batches. The number is what a card
  needs, the least memory the
  step sequence runs in. On a roomy card variable lengths leave whole cached segments behind, and
  reserved climbs to 1.3-1.6x the allocated peak (what nvidia-smi shows), but the allocator hands those
  back before running out: traced full-size Hugging Face steps replayed through bot/planner/allocator.py
  (bench/allocator_replay: `trace.py hf`) need up to ~1.15x the transient tensors of their longest step
  without checkpointing, and this estimate is within ~5% of that need. torchtune's Llama-2-7B LoRA
  tutorial figures (15.6-17.0 GB) are roomy-card reserved, ~1 GB above the need.
- NF4 dequantization transient, per parameter of the Linear being dequantized: bitsandbytes' kernel
  (and a compiled torchao dequant) writes the bf16 weight directly, 2 B/param (two such weights counted,
  the one in use and the next). torchao's NF4Tensor in eager mode (torchtune QLoRA without compile)
  goes through int64 index tensors: two half-size int64 indices (8), two bf16 look-ups (2), their
  scaled copies (2) and the stacked weight (2) are alive together, 14 B/param (14.05 measured by
  tracing the tensors torchao 0.3.1's NF4Tensor.get_original_weight allocates). Unsloth dequantizes
  every weight into one reused scratch buffer the size of the largest (unsloth/kernels/utils.py,
  matmul_lora's use_global_buffer): 2 B/param.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bot.planner.architectures import Architecture
from bot.planner.load_phase import load_reserved_bytes
from bot.planner.request import EstimateRequest

GB = 1e9
NF4_BYTES = 0.5625  # 4 bits + fp32 absmax per block of 64
NF4_DQ_BYTES = 0.516  # double quantization: 8-bit absmax + fp32 constant per 256 blocks
NF4_STORAGE_BYTES = (
    0.5  # the packed 4-bit weight alone (any bnb_4bit_quant_storage dtype); the rest is quant_state
)
LOGIT_BYTES = {"plain": 12.0, "legacy": 18.0, "plain16": 8.0, "compiled": 10.0, "chunked": 2.0}
FP32_LOGIT_BYTES = {"plain": 12.0, "legacy": 18.0, "plain16": 12.0, "compiled": 12.0, "chunked": 4.0}
CUDA_CONTEXT_GB = 1.2
# Each process of a multi-GPU run also holds NCCL's communication buffers outside PyTorch's allocator (4 MiB
# NCCL_BUFFSIZE per channel and protocol, for each ring/tree peer): counted with the CUDA context, so they
# show on the card (nvidia-smi) but not in torch.cuda.max_memory_reserved.
NCCL_BUFFERS_GB = 0.5
# cuBLAS keeps one workspace per (handle, stream) that runs matmuls (ATen/cuda/CUDAContextLight.h,
# cublas_handle_stream_to_workspace), allocated through the caching allocator, so it is part of torch's
# reserved memory on every rank. Default size (torch.backends.cuda.cublas_workspace_size, which
# CUBLAS_WORKSPACE_CONFIG overrides): ":4096:8" = 32 MiB on Hopper and newer, ":4096:2:16:8" ~8 MiB before;
# cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on by default). The forward and the autograd backward
# run their matmuls on the current stream (FSDP's extra streams only communicate): one workspace, priced at
# the larger default because the estimate does not know the card yet.
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 8
CUBLAS_STREAMS = 1
QK_NORM_MODELS = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2")
FRAGMENTATION = {"packed": 1.03, "variable": 1.12, "expandable": 1.02}


def allocator_mode(req: EstimateRequest) -> str:
    """Which FRAGMENTATION applies: expandable segments (the runner sets them, runner/cuda_env.py) whatever
    the shapes; else fixed-length (packed) or varying-length (unpacked) batches with the default allocator."""
    if req.expandable_segments:
        return "expandable"
    return "packed" if req.packing else "variable"


# Which Linear layers of a block read the same input (q, k, v the attention norm's output; gate, up the MLP's)
INPUT_OF = {"q": 0, "k": 0, "v": 0, "gate": 1, "up": 1, "o": 2, "down": 3}
# per parameter of the largest Linear
NF4_DEQUANT_BYTES = {"kernel": 2.0 * 2, "torchao eager": 14.0, "unsloth buffer": 2.0}


# FSDP (torch.distributed.fsdp), read from its code and measured on gloo
# (tests/planner/test_fsdp_mechanisms.py): FSDP1's rate limiter lets the CPU run at most this many freed
# all-gathers ahead of the GPU (torch/distributed/fsdp/_limiter_utils.py,
# _FreeEventQueue._max_num_inflight_all_gathers = 2, "empirically chosen"): until the GPU has finished with
# them, their unsharded memory cannot be reused.
FSDP_FREE_QUEUE = 2
# Unsharded gradients alive in a full fine-tune's backward: the unit autograd is filling and the previous one,
# whose reduce-scatter runs on the post-backward stream (_post_backward_hook: record_stream until it is done).
FSDP_GRAD_UNITS = 2


@dataclass(frozen=True)
class MemoryCoefficients:
    """The memory model has no fitted quantity since issue 29: every term is a mechanism from the libraries'
    code. `fsdp_units` overrides the FSDP units in flight (None: fsdp_units_in_flight's count), for
    experiments and the cross-validation's sensitivity check."""

    fsdp_units: float | None = None


FITTED_MEMORY = MemoryCoefficients()


@dataclass
class MemoryResult:
    per_gpu_bytes: float
    breakdown: dict[str, float]  # bytes per component at the peak moment (sums to per_gpu_bytes)
    offloaded: dict[str, float] = field(default_factory=dict)  # bytes kept off the GPU (paged, CPU)
    peak_phase: str = ""
    trainable: int = 0
    sharding: str = "none"
    checkpoint_bytes: float = 0.0  # what a resumable checkpoint holds (trainable weights + optimizer)
    download_bytes: float = 0.0  # the base model in 16-bit, fetched on every (re)start
    notes: list[str] = field(default_factory=list)  # the mechanisms assumed, for the estimate's assumptions

    @property
    def per_gpu_gb(self) -> float:
        return self.per_gpu_bytes / GB

    @property
    def torch_reserved_gb(self) -> float:
        """What torch.cuda.max_memory_reserved() reports: all of it but the CUDA context."""
        return (self.per_gpu_bytes - self.breakdown.get("cuda_context", 0.0)) / GB

    def breakdown_gb(self) -> dict[str, float]:
        return {k: round(v / GB, 3) for k, v in self.breakdown.items()}


def trainable_parameters(arch: Architecture, req: EstimateRequest) -> int:
    if req.method == "full":
        return arch.parameters
    return arch.lora_parameters(req.lora_r, req.lora_targets)


def _activation_bytes_per_token_layer(
    arch: Architecture, req: EstimateRequest, gpus: int | None = None
) -> float:
    """Bytes saved for backward per token in one block (no checkpointing).

    Counted tensor by tensor for a Llama-style block: q, k, v and the attention output (attention
    backward), the MLP's gate/up/activation (SiLU and product backward), the fp32 RMSNorm inputs, and
    the input of every Linear whose weight gets a gradient. A frozen Linear saves nothing (its input
    gradient needs only the weight). PEFT's fp32 adapters cast their input to fp32, so each adapted
    Linear keeps its own copy of its input: fp32, or bf16 when autocast casts it back for the matmul
    (the Trainer's bf16=True); bf16 adapters (torchtune) share the layer's bf16 input.
    """
    elem = 4.0 if req.precision == "fp32" else 2.0
    h, q_dim, ffn = arch.hidden, arch.q_dim, arch.ffn_per_token
    full = req.method == "full"
    attn_elem = mlp_elem = elem
    if fp32_residual(req, gpus or req.gpus):
        # bitsandbytes' Linear4bit returns its output in its input's dtype (bitsandbytes/nn/modules.py,
        # Linear4bit.forward: `out.to(inp_dtype)`), and with the fp32 residual stream every projection's input
        # is fp32: q, k, v, the MLP's gate and up, SiLU's input and the product are fp32 tensors, saved as
        # such. Under autocast the attention kernel gets (and saves) bf16 copies; nothing casts the MLP back.
        mlp_elem = 4.0
        attn_elem = 2.0 if req.autocast else 4.0
    # q, k, v kept for the attention backward; HF sdpa/eager and torchtune repeat k, v to all heads.
    kv = arch.kv_dim if req.attn == "flash" else q_dim
    block = (q_dim + 2 * kv + q_dim) * attn_elem  # q, k, v and the attention output
    if arch.gated_mlp:
        block += (2 if req.compile else 3) * ffn * mlp_elem  # gate, up (and silu(gate) unless fused)
    else:
        block += ffn * mlp_elem  # activation input
    elems = 0
    adapter_bytes = 0.0
    if full:
        elems += h + q_dim + h + ffn  # inputs of q/k/v, o (contiguous copy), gate/up, down
    else:
        fp32_adapters = req.adapter_dtype == "fp32" or req.precision == "fp32"
        # An fp32 input needs no cast (peft's _cast_input_dtype returns it as is): adapters reading the same
        # input (q, k and v; gate and up) then save one tensor between them, not a copy each.
        fp32_inputs = req.precision == "fp32" or fp32_residual(req, gpus or 1)
        shared = fp32_adapters and not req.autocast and fp32_inputs
        inputs_seen: set[tuple[int, int]] = set()
        adapted: set[str] = set()
        for lin in arch.lora_targets(req.lora_targets):
            per_token = lin.active if lin.count > 1 else 1  # experts: only the routed ones see a token
            adapted.update(lin.roles)
            if shared and lin.count == 1:
                source = (lin.d_in, INPUT_OF.get(lin.roles[0], 3))
                new_input = source not in inputs_seen
                inputs_seen.add(source)
                adapter_bytes += 4.0 * ((lin.d_in if new_input else 0) + req.lora_r)
            elif fp32_adapters:
                copy = 2.0 if req.autocast and req.precision != "fp32" else 4.0
                adapter_bytes += per_token * copy * (lin.d_in + req.lora_r)
            else:
                adapter_bytes += per_token * elem * req.lora_r
            if req.lora_dropout > 0:
                adapter_bytes += per_token * lin.d_in * (4.0 if fp32_adapters else elem)
        if not fp32_adapters:
            elems += h if adapted & {"q", "k", "v"} else 0
            elems += q_dim if "o" in adapted else 0
            elems += h if adapted & {"gate", "up"} else 0
            elems += ffn if "down" in adapted else 0
    if arch.experts:
        elems += 2 * arch.experts_per_token * h  # token dispatch and combine copies
    gemma = arch.model_type.startswith("gemma")
    norms = 4 if arch.model_type.startswith(("gemma2", "gemma3")) else 2
    # RMSNorm upcasts to fp32 and saves that copy unless a compiled kernel fuses it.
    norm_elem = elem if req.compile else max(elem, 4.0)
    norm_bytes = norms * h * norm_elem
    if gemma and full:
        norm_bytes += norms * h * norm_elem  # Gemma scales by (1 + w) in fp32: w's gradient keeps that too
    if arch.model_type in QK_NORM_MODELS:
        norm_bytes += (q_dim + arch.kv_dim) * norm_elem  # q_norm / k_norm inputs
    per_layer = block + elems * elem + norm_bytes + adapter_bytes
    if req.attn == "eager":
        per_layer += arch.heads * req.seq_len * 6.0  # scores bf16 + fp32 softmax output, per token
        if arch.config.get("attn_logit_softcapping"):
            per_layer += arch.heads * req.seq_len * 2.0  # Gemma 2's tanh-capped scores
    elif sdpa_math_fallback(arch, req, gpus or req.gpus):
        per_layer += arch.heads * req.seq_len * 8.0  # SDPA's math path saves fp32 scores and softmax output
    return per_layer


def sdpa_math_fallback(arch: Architecture, req: EstimateRequest, gpus: int = 1) -> bool:
    """Whether torch's SDPA runs its math kernel, which materializes the attention matrix.

    transformers passes grouped-query attention to SDPA as enable_gqa=True when there is no mask
    (integrations/sdpa_attention.py, use_gqa_in_sdpa); on CUDA only the flash kernel takes enable_gqa, and
    flash takes 16-bit inputs only, so fp32 queries with GQA and no mask fall back to the math kernel (torch's
    scaled_dot_product_attention docs: GQA "works only for Flash_attention and math kernel on CUDA tensor").
    fp32 queries come with QLoRA's fp32 residual stream (prepare_model_for_kbit_training) without autocast
    (fp32 compute would too on CUDA; the CPU, where the planner prices fp32, has kernels of its own). No mask:
    a micro-batch of one unpadded row (the runner passes a block-causal mask when it packs;
    has_attention_mask). Measured on an H200 (bench/gpu_check, QLoRA on Llama-3.2-1B, micro-batch 1, no mask):
    13.2 GB at 4,096 tokens where LoRA takes 4.1."""
    if req.attn != "sdpa" or arch.kv_heads >= arch.heads or has_attention_mask(req):
        return False
    return fp32_residual(req, gpus) and not req.autocast


def has_attention_mask(req: EstimateRequest) -> bool:
    """Whether the model gets an attention mask (EstimateRequest.attention_mask; None: as the runner does)."""
    if req.attention_mask is not None:
        return req.attention_mask
    return req.packing or req.batch_size > 1


def sdpa_math_backward_bytes(arch: Architecture, req: EstimateRequest, gpus: int = 1) -> float:
    """Per token, the math kernel's backward of one layer: the gradients of the softmax output and of the
    scores (fp32), alive with what the layer saved."""
    return arch.heads * req.seq_len * 8.0 if sdpa_math_fallback(arch, req, gpus) else 0.0


def forward_transient_bytes(arch: Architecture, req: EstimateRequest) -> float:
    """Per token, what a block's forward holds at its busiest moment beyond what it saves for backward.

    peft's LoRA Linear computes `result = result + lora_B(lora_A(dropout(x))) * scaling` (peft/tuners/lora/
    layer.py, Linear.forward): with fp32 adapters and no autocast the adapter's output and its scaled copy are
    fp32 rows as wide as the layer's output, alive with the base layer's bf16 output (then the fp32 sum
    replaces them): 10 bytes per output feature of the widest adapted Linear (gate/up: the MLP width). Under
    autocast, or with bf16 adapters, those copies are 16-bit (6). Shows when nothing larger competes: under
    checkpointing with a chunked loss the recompute of the last block is the peak, not the logits."""
    if req.method == "full":
        return 0.0
    widest = max((lin.d_out for lin in arch.lora_targets(req.lora_targets)), default=0)
    fp32 = (req.adapter_dtype == "fp32" or req.precision == "fp32") and not req.autocast
    return widest * (10.0 if fp32 else 6.0)


def nf4_dequant_path(req: EstimateRequest) -> str:
    """How the NF4 weights become bf16 for each matmul: a kernel's fresh output, Unsloth's one reused
    buffer, or torchao's eager ops."""
    if req.stack == "unsloth":
        return "unsloth buffer"
    return "torchao eager" if req.stack == "torchtune" and not req.compile else "kernel"


def qlora_upcast(req: EstimateRequest, gpus: int = 1) -> bool:
    """Whether peft's prepare_model_for_kbit_training casts every non-4-bit parameter to fp32
    (peft/utils/other.py, "cast all non INT8 parameters to fp32"; skipped for GPTQ/AQLM/EETQ/HQQ/torchao
    bases). On one GPU the runner calls it (runner/model.py); under FSDP the runner, like TRL, skips it - a
    unit's parameters are flattened into one buffer of one dtype - unless the request says the run did
    (qlora_upcast set explicitly)."""
    if req.method != "qlora" or not req.qlora_upcast:
        return False
    return gpus == 1 or "qlora_upcast" in req.model_fields_set


def fp32_residual(req: EstimateRequest, gpus: int = 1) -> bool:
    """With the upcast the embedding output and the RMSNorm weights are fp32, so every residual add is fp32,
    and bitsandbytes' Linear4bit returns its output in its input's dtype (bitsandbytes/nn/modules.py,
    Linear4bit.forward: `.to(inp_dtype)`): the whole residual stream of a QLoRA model is fp32 and the
    checkpointed layer inputs are 4 B per element, not 2 - bitsandbytes QLoRA activations are larger than
    LoRA's."""
    return req.stack == "hf" and qlora_upcast(req, gpus)


def adamw_impl(req: EstimateRequest) -> str:
    """fused (tunebot's runner on CUDA, torchtune's configs: the default), foreach (torch's own default on
    CUDA since 2.0 when fused is not asked for) or for-loop (torch < 2.0)."""
    return req.optimizer_impl or "fused"


STACK_QUANTIZER = {"hf": "bitsandbytes", "torchtune": "torchao", "unsloth": "prequantized"}


def nf4_quantizer(req: EstimateRequest) -> str:
    return req.nf4_quantizer or STACK_QUANTIZER[req.stack]


def _logit_bytes(arch: Architecture, req: EstimateRequest) -> float:
    kind = "chunked" if req.chunked_ce else "compiled" if req.compile else "plain"
    if kind == "plain" and not req.loss_upcast:
        # 16-bit loss: logits, log-softmax output, its gradient and the logits' gradient all 16-bit (fp16 +
        # DeepSpeed without autocast; model code whose forward never calls logits.float()).
        kind = "plain16"
    elif kind == "plain" and req.legacy_logits:
        kind = "legacy"
    extra = 0.0
    if kind in ("plain", "legacy") and arch.config.get("final_logit_softcapping"):
        extra = 4.0  # Gemma 2's tanh soft-capping: two more bf16 copies (scaled logits, saved tanh output)
    if req.precision == "fp32":
        # fp32 logits: the upcast is a no-op, and the peak is the same three fp32 tensors (log-softmax output,
        # its gradient, log_softmax_backward's output): 12 B, not twice the bf16 path's (bench/chunked_loss.py
        # measures 6.6 GB for 4,096 tokens x 128,256 entries, 12.6 B). Only what was 16-bit doubles.
        return FP32_LOGIT_BYTES[kind] + 2.0 * extra
    return LOGIT_BYTES[kind] + extra


# The runner's chunked loss (runner/loss.py), at its worst moment: a chunk's log-softmax output, its gradient
# and log_softmax_backward's output alive together (the recomputed bf16 logits and their fp32 upcast are freed
# as the recompute goes: nothing saves them), per token of the chunk and vocabulary entry.
CHUNK_BYTES = 12.0


def loss_path_bytes(arch: Architecture, req: EstimateRequest, tokens: int) -> float:
    """Bytes of the loss path at the start of backward (the logits, their copies and gradients).

    plain: every token's logits, LOGIT_BYTES per entry (transformers' ForCausalLMLoss: bf16 logits, the fp32
    upcast, the log-softmax output, its gradient). chunked (the runner's default, runner/loss.py): one chunk
    of runner.contract.spec.chunk_tokens(vocab) label tokens at a time, plus the gathered label positions'
    hidden states and their gradient. liger (LigerFusedLinearCrossEntropyLoss,
    liger_kernel/ops/fused_linear_cross_entropy.py): chunks of next_power_of_2(ceil(tokens / ceil(vocab /
    hidden))) tokens, the fp32 logits of one chunk with the gradient written in place, and the input gradient
    it builds in the forward."""
    from runner.contract.spec import chunk_tokens

    elem = 4.0 if req.precision == "fp32" else 2.0
    if req.loss == "chunked":
        rows = min(tokens, chunk_tokens(arch.vocab))
        extra = 4.0 if arch.config.get("final_logit_softcapping") else 0.0
        return rows * arch.vocab * (CHUNK_BYTES + extra) + 2.0 * tokens * arch.hidden * elem
    if req.loss == "liger":
        chunks = max(1, math.ceil(arch.vocab / arch.hidden))
        rows = min(tokens, 1 << max(0, math.ceil(tokens / chunks) - 1).bit_length())
        return rows * arch.vocab * 4.0 + 2.0 * tokens * arch.hidden * elem
    return tokens * arch.vocab * _logit_bytes(arch, req)


def fsdp_units_in_flight(req: EstimateRequest) -> float:
    """Transformer-block units whose unsharded parameters are on the GPU at once, from FSDP's code.

    FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel, the runner and accelerate): the unit being
    computed, the one BACKWARD_PRE prefetches (backward_prefetch's default) and up to FSDP_FREE_QUEUE freed
    units whose all-gather memory the GPU has not released yet (limit_all_gathers=True): 4 when every unit is
    a block (a full fine-tune, or adapters wrapped inside their block). With peft's wrap policy (the runner's
    for LoRA/QLoRA: every adapter Linear its own unit) the prefetch and the free queue land on the adapters'
    tiny
    units, which come between two blocks in execution order: one block (gloo measures exactly that).
    FSDP2 (fully_shard; torchtune): the computed unit and the prefetched one; the prefetch's flat all-gather
    output lives only until foreach_all_gather_copy_out has copied it into the parameters
    (_fsdp_collectives.py), while the computed unit runs: 2."""
    if req.fsdp_version == 2:
        return 2.0
    if req.method == "full" or req.fsdp_wrap == "blocks":
        return 2.0 + FSDP_FREE_QUEUE
    return 1.0


def fsdp_terms(
    arch: Architecture, req: EstimateRequest, gpus: int, coef: MemoryCoefficients
) -> dict[str, float]:
    """What FSDP adds per GPU beside the shards, each from the library's code (docs/estimation.md).

    gathered: fsdp_units_in_flight unsharded blocks, in the compute dtype (MixedPrecision's param_dtype; NF4
    storage for QLoRA, bnb_4bit_quant_storage=bf16 flattens the packed 4-bit bytes).
    root: the parameters no auto-wrap policy puts in a block's unit (embeddings, an untied lm_head, the final
    norm) form the root unit, and FSDP does not reshard the root after forward (_runtime_utils._post_forward:
    `free_unsharded_flat_param = not state._is_root and ...`; FSDP2: `post_forward_mesh_info = None` for the
    root): unsharded from the first forward to the end of backward.
    gradient_buffers (a full fine-tune): _post_backward_hook reduce-scatters each unit's unsharded gradient
    (the compute dtype), casting it to reduce_dtype first when that differs
    (MixedPrecision(reduce_dtype=fp32): a 4-byte copy), into a new sharded gradient; FSDP_GRAD_UNITS units at
    once, when backward ends. root_gradients: the root's unsharded gradient (embeddings, lm_head) exists from
    the lm_head's gradient, the first of backward, to the root's post-backward hook, the last: all through
    backward, with its reduce_dtype copy at the end (root_reduce).
    quant_state: bitsandbytes keeps each Linear4bit's quant_state (absmax, its double-quantization constants)
    on the module, not in the flat parameter (bitsandbytes/nn/modules.py,
    fix_4bit_weight_quant_state_from_module: "the quant state got lost when the parameter got converted. This
    happens for example for fsdp"), so every GPU holds all of it (the NF4 bytes beyond 4 bits); torchao's
    NF4Tensor shards its scalers with its data (fsdp_pre_all_gather).
    frozen_gradients: with use_orig_params=True and a unit that holds frozen and trainable tensors (whole
    blocks wrapped around LoRA adapters), the FlatParameter requires grad and FSDP gives all of it a gradient,
    the frozen part as zeros (fully_sharded_data_parallel.py, use_orig_params: "gradient memory usage will be
    higher than expected (namely, equivalent to not freezing those parameters)"): every block's shard of
    gradients stays until the optimizer step, and one unsharded block gradient is reduce-scattered at a time.
    peft's wrap policy (the runner's) gives adapters their own units and avoids it."""
    block = max(sum(lin.params for lin in g.linears) + g.other_params for g in arch.groups)
    elem = 2.0 if req.precision != "fp32" else 4.0
    units = coef.fsdp_units if coef.fsdp_units is not None else fsdp_units_in_flight(req)
    unit_bytes = block * elem
    if req.method == "qlora":  # the packed 4-bit bytes (bf16-typed storage); norms in the compute dtype
        linear = max(sum(lin.params for lin in g.linears) for g in arch.groups)
        unit_bytes = linear * NF4_STORAGE_BYTES + (block - linear) * elem
    gathered = units * unit_bytes
    root_params = arch.embedding_params + arch.global_other_params
    root_elem = 4.0 if req.precision == "fp32" or qlora_upcast(req, gpus) else 2.0
    root = root_params * root_elem
    grad_buffers = root_grads = root_reduce = 0.0
    if req.method == "full":
        grad_elem = elem  # the unsharded gradient has the gathered parameters' dtype
        reduce_copy = 4.0 if req.precision == "mixed" else 0.0  # reduce_dtype=fp32 (runner/distributed.wrap)
        shard_out = max(grad_elem, reduce_copy) / gpus
        grad_buffers = FSDP_GRAD_UNITS * block * (grad_elem + reduce_copy + shard_out)
        root_grads = root_params * grad_elem
        root_reduce = root_params * (reduce_copy + shard_out)
    quant_state = 0.0
    if (
        req.method == "qlora" and nf4_quantizer(req) == "bitsandbytes"
    ):  # torchao's NF4Tensor shards its scalers
        q_bytes = NF4_DQ_BYTES if req.double_quant else NF4_BYTES
        quant_state = (q_bytes - NF4_STORAGE_BYTES) * arch.block_linear_params * (1.0 - 1.0 / gpus)
    frozen = 0.0
    if req.method != "full" and req.fsdp_wrap == "blocks" and req.fsdp_orig_params:
        others = arch.parameters - arch.block_linear_params - arch.embedding_params  # norms, biases, routers
        base = arch.block_linear_params * (NF4_BYTES if req.method == "qlora" else elem) + others * elem
        unit = block * (NF4_BYTES if req.method == "qlora" else elem)
        frozen = base / gpus + unit
    return {
        "gathered": gathered,
        "root": root,
        "gradient_buffers": grad_buffers,
        "root_gradients": root_grads,
        "root_reduce": root_reduce,
        "quant_state": quant_state,
        "frozen_gradients": frozen,
    }


@dataclass
class _TrainedState:
    """What lives through the whole step, per GPU: the weights, the adapters, the gradients and the optimizer
    states (sharded under FSDP), and what the optimizer step allocates on top."""

    weights: float
    adapters: float
    grads: float
    optimizer: float
    step_temp: float
    param_bytes: float  # bytes per trainable parameter (its dtype)
    state_bytes: float  # optimizer state bytes per trainable parameter
    fsdp_live: float = 0.0  # FSDP's unsharded root and units in flight, forward and backward
    fsdp_root_grad: float = 0.0  # the root's unsharded gradient, all through backward
    fsdp_end: float = 0.0  # the blocks' unsharded gradients and the root's reduce copy, when backward ends


@dataclass
class _StepTensors:
    """What a step's forward and backward hold, per GPU: the saved activations, one block's working set, the
    loss path and the forward's temporaries."""

    per_layer: float  # one block's saved tensors (the working set recomputed under checkpointing)
    stored: float  # saved for backward when the forward ends
    block_casts: float  # autocast's bf16 weight copies of one block (mixed precision, one GPU)
    logits: float
    transient: float  # the busiest moment of a block's forward beyond what it saves


def _largest_tensor(arch: Architecture) -> int:
    """Parameters of the largest single weight: the embedding or the widest Linear."""
    return max(arch.vocab * arch.hidden, *(lin.d_in * lin.d_out for g in arch.groups for lin in g.linears))


def _largest_trainable(arch: Architecture, req: EstimateRequest) -> int:
    """Parameters of the largest trainable tensor: a full fine-tune's largest weight, or the widest adapter
    matrix (r x the wider side of its Linear)."""
    if req.method == "full":
        return _largest_tensor(arch)
    return max(
        (req.lora_r * max(lin.d_in, lin.d_out) for lin in arch.lora_targets(req.lora_targets)), default=0
    )


def _weight_bytes(arch: Architecture, req: EstimateRequest, n_gpus: int) -> float:
    """The frozen base or the trained model, before sharding."""
    n, quantizable = arch.parameters, arch.block_linear_params
    if req.method == "qlora":
        q_bytes = NF4_DQ_BYTES if req.double_quant else NF4_BYTES
        other_bytes = 4.0 if qlora_upcast(req, n_gpus) else 2.0
        return quantizable * q_bytes + (n - quantizable) * other_bytes
    if req.precision == "fp32":
        return 4.0 * n
    if req.method == "full" and req.precision == "mixed":
        return 4.0 * n  # fp32 master weights; autocast's bf16 copies are counted with the activations
    return 2.0 * n


def optimizer_step_bytes(
    arch: Architecture, req: EstimateRequest, trainable: int, param_bytes: float, shard: float
) -> float:
    """What the optimizer step allocates beyond its states (fused optimizers update in place: nothing;
    measured by tracing each torch.optim.AdamW path's allocations:
    tests/planner/test_optimizer_mechanisms.py).

    for-loop (torch/optim/adam.py _single_tensor_adam): `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)`
    holds the square root and its quotient of one parameter at a time: twice the largest trainable tensor."""
    step_temp = 0.0
    if req.optimizer == "adamw" and adamw_impl(req) == "for-loop":
        step_temp = 2.0 * min(trainable, _largest_trainable(arch, req)) * param_bytes / shard
    if req.optimizer == "adamw" and adamw_impl(req) == "foreach":
        # torch.optim.AdamW without fused=True is foreach on CUDA (torch/optim/optimizer.py
        # _default_to_fused_or_foreach); _multi_tensor_adam builds `exp_avg_sq_sqrt =
        # torch._foreach_sqrt(device_exp_avg_sqs)`, one temporary the size of every state at once
        # (torch/optim/adam.py), while the gradients are still alive. The HF Trainer's adamw_torch (torch <
        # 2.8) uses it; tunebot's runner (on CUDA) and torchtune's configs ask for fused=True.
        step_temp = trainable * param_bytes / shard
    if req.stack == "torchtune" and req.optimizer == "adamw_8bit":
        # torchao's 8-bit AdamW updates one parameter at a time with its two states dequantized to
        # fp32: the largest tensor (usually the embedding) sets the spike.
        step_temp = min(trainable, _largest_tensor(arch)) * 8.0
    return step_temp


def _trained_state(
    arch: Architecture, req: EstimateRequest, n_gpus: int, trainable: int, offloaded: dict[str, float]
) -> _TrainedState:
    """Weights, adapters, gradients and optimizer states per GPU (sharded; paged states offloaded)."""
    shard = float(n_gpus) if n_gpus > 1 else 1.0
    weights = _weight_bytes(arch, req, n_gpus) / shard
    if req.method == "full":
        adapters = 0.0
        param_bytes = 2.0 if req.precision == "bf16" else 4.0
    else:
        param_bytes = 4.0 if (req.adapter_dtype == "fp32" or req.precision == "fp32") else 2.0
        adapters = trainable * param_bytes / shard
    if req.optimizer_in_backward:
        grads = min(trainable, _largest_tensor(arch)) * param_bytes
    else:
        grads = trainable * param_bytes / shard
    state_bytes = 2.0 if req.optimizer in ("adamw_8bit", "paged_adamw_8bit") else 2.0 * param_bytes
    optimizer = trainable * state_bytes / shard
    if req.optimizer == "paged_adamw_8bit":
        offloaded["optimizer (paged, may spill to CPU)"] = optimizer
        optimizer = 0.0
    step_temp = optimizer_step_bytes(arch, req, trainable, param_bytes, shard)
    return _TrainedState(weights, adapters, grads, optimizer, step_temp, param_bytes, state_bytes)


def _step_tensors(
    arch: Architecture, req: EstimateRequest, n_gpus: int, offloaded: dict[str, float]
) -> _StepTensors:
    """Activations, the loss path and the forward's temporaries, per GPU (FSDP does not shard them)."""
    tokens = req.batch_size * req.seq_len
    per_layer = _activation_bytes_per_token_layer(arch, req, n_gpus) * tokens
    resid = (4.0 if req.precision != "bf16" or fp32_residual(req, n_gpus) else 2.0) * arch.hidden * tokens
    if req.gradient_checkpointing:
        inputs = arch.layers * resid
        if req.activation_offload:
            offloaded["checkpointed activations (CPU)"] = inputs
            inputs = 0.0
        stored = inputs  # the layer inputs; the last layer is recomputed only after the loss is done
    else:
        stored = arch.layers * per_layer
    if req.method == "qlora":
        biggest = max(lin.d_in * lin.d_out for g in arch.groups for lin in g.linears)
        stored += biggest * NF4_DEQUANT_BYTES[nf4_dequant_path(req)]
    logits = loss_path_bytes(arch, req, tokens)
    # Mixed precision on one GPU (the runner: fp32 weights, forward under torch.autocast): each matmul uses a
    # bf16 copy of its weight, which autograd keeps for the input gradient. Without checkpointing all of them
    # are alive when backward starts; under checkpointing a block's copies are dropped with its activations
    # (autocast's cache is cleared when the forward leaves autocast) and remade while it is recomputed, so
    # only the lm_head's survives the forward. Under FSDP the gathered units are bf16 already.
    casts = block_casts = 0.0
    if req.method == "full" and req.precision == "mixed" and n_gpus == 1:
        block_casts = 2.0 * max(sum(lin.params for lin in g.linears) for g in arch.groups)
        head = 2.0 * arch.vocab * arch.hidden
        casts = head if req.gradient_checkpointing else 2.0 * arch.matmul_parameters
    stored += casts
    transient = (forward_transient_bytes(arch, req) + sdpa_math_backward_bytes(arch, req, n_gpus)) * tokens
    return _StepTensors(per_layer, stored, block_casts, logits, transient)


def _add_fsdp(
    arch: Architecture,
    req: EstimateRequest,
    n_gpus: int,
    coef: MemoryCoefficients,
    state: _TrainedState,
    offloaded: dict[str, float],
) -> None:
    """FSDP's unsharded buffers (fsdp_terms) beside the shards; CPU offload moves the shards off (the quant
    state, a module attribute, stays on the GPU)."""
    fsdp = fsdp_terms(arch, req, n_gpus, coef)
    state.grads += fsdp["frozen_gradients"]
    state.fsdp_live = fsdp["gathered"] + fsdp["root"]
    state.fsdp_root_grad = fsdp["root_gradients"]
    state.fsdp_end = fsdp["gradient_buffers"] + fsdp["root_reduce"]
    if req.fsdp_cpu_offload:
        offloaded["sharded weights, gradients and optimizer (CPU)"] = (
            state.weights + state.grads + state.optimizer + state.adapters
        )
        state.weights, state.grads, state.optimizer, state.adapters = 0.0, 0.0, 0.0, 0.0
    state.weights += fsdp["quant_state"]


def _phases(
    arch: Architecture, req: EstimateRequest, n_gpus: int, state: _TrainedState, step: _StepTensors
) -> dict[str, dict[str, float]]:
    """The moments of a step that compete for the peak, each as gradients, activations, logits (and the
    optimizer step's temporaries)."""
    full = req.method == "full"
    shard = float(n_gpus) if n_gpus > 1 else 1.0
    # With accumulation the gradients live through the next forward; without, backward starts by
    # producing the lm_head's gradient while the logits are still alive.
    head = arch.vocab * arch.hidden
    first_grad = head * state.param_bytes / shard if full and not req.optimizer_in_backward else 0.0
    if full and req.loss != "plain":
        # Each chunk's lm_head gradient is summed into the one autograd accumulates: one more head-sized
        # tensor.
        first_grad *= 2.0
    grads = state.grads
    persistent_grads = grads if req.grad_accum > 1 else min(grads, first_grad)
    # Under checkpointing the loss's backward (logits, their fp32 copies and gradients) runs and frees before
    # the last block's forward is recomputed (torch/utils/checkpoint.py: a checkpointed block recomputes when
    # autograd first unpacks one of its saved tensors, i.e. when its own backward starts), so the logits and
    # one block's working set are never alive together.
    # FSDP: the root and the units in flight from the first forward to the end of backward, the unsharded
    # gradients before their reduce-scatter at its end; everything resharded for the optimizer step.
    live = state.fsdp_live + state.fsdp_root_grad
    backward = live + state.fsdp_end
    phases = {
        "start of backward": {
            "gradients": persistent_grads,
            "activations": step.stored,
            "logits": step.logits,
            "fsdp": live,
        },
        "end of backward": {
            "gradients": grads,
            "activations": step.per_layer + step.block_casts,
            "logits": 0.0,
            "fsdp": backward,
        },
        "optimizer step": {"gradients": grads, "activations": 0.0, "logits": 0.0, "step": state.step_temp},
    }
    if req.gradient_checkpointing:
        phases["recompute of the last layer"] = {
            "gradients": persistent_grads,
            "activations": step.stored + step.per_layer + step.block_casts + step.transient,
            "logits": 0.0,
            "fsdp": live,
        }
    else:  # the last block's forward: everything saved so far, and its own temporaries
        phases["forward of the last layer"] = {
            "gradients": persistent_grads,
            "activations": step.stored + step.transient,
            "logits": 0.0,
            "fsdp": live,
        }
    return phases


def _transient(parts: dict[str, float]) -> float:
    """What the caching allocator hands out and takes back within the step (fragmentation applies)."""
    return parts["activations"] + parts["logits"] + parts.get("step", 0.0)


def _peak(phases: dict[str, dict[str, float]], frag: float) -> tuple[str, dict[str, float]]:
    """The moment that reserves the most."""
    return max(
        phases.items(), key=lambda kv: kv[1]["gradients"] + kv[1].get("fsdp", 0.0) + _transient(kv[1]) * frag
    )


def _breakdown(state: _TrainedState, parts: dict[str, float], n_gpus: int, frag: float) -> dict[str, float]:
    """Bytes per component at the peak moment (they sum to the estimate)."""
    out = {
        "weights": state.weights,
        "adapters": state.adapters,
        "gradients": parts["gradients"],
        "optimizer": state.optimizer + parts.get("step", 0.0),
        "activations": parts["activations"],
        "logits": parts["logits"],
        "cuda_context": (CUDA_CONTEXT_GB + (NCCL_BUFFERS_GB if n_gpus > 1 else 0.0)) * GB,
        "cublas_workspace": float(CUBLAS_WORKSPACE_BYTES * CUBLAS_STREAMS),
        "allocator": _transient(parts) * (frag - 1.0),
    }
    if n_gpus > 1:
        out["fsdp_buffers"] = parts.get("fsdp", 0.0)
    return out


def _load_phase(
    arch: Architecture, req: EstimateRequest, n_gpus: int, weights: float, breakdown: dict[str, float]
) -> bool:
    """QLoRA on one GPU: quantizing on the GPU can reserve more than the training step ever allocates; the
    step then runs inside that reservation (the caching allocator keeps it), shown as allocator. True when it
    does."""
    if req.method != "qlora" or n_gpus != 1:
        return False
    loaded = load_reserved_bytes(arch, nf4_quantizer(req), weights, req.lora_r)
    training = sum(breakdown.values()) - breakdown["cuda_context"]
    if loaded <= training:
        return False
    breakdown["allocator"] += loaded - training
    return True


def estimate_memory(
    arch: Architecture,
    req: EstimateRequest,
    gpus: int | None = None,
    coef: MemoryCoefficients = FITTED_MEMORY,
) -> MemoryResult:
    """Peak reserved memory per GPU for `req` on `gpus` GPUs (default req.gpus): the state that lives through
    the step, the step's own tensors, the moments that compete for the peak, and the winner's breakdown."""
    n_gpus = gpus or req.gpus
    trainable = trainable_parameters(arch, req)
    offloaded: dict[str, float] = {}
    state = _trained_state(arch, req, n_gpus, trainable, offloaded)
    step = _step_tensors(arch, req, n_gpus, offloaded)
    if n_gpus > 1:
        _add_fsdp(arch, req, n_gpus, coef, state, offloaded)
    frag = FRAGMENTATION[allocator_mode(req)]
    phase, parts = _peak(_phases(arch, req, n_gpus, state, step), frag)
    breakdown = _breakdown(state, parts, n_gpus, frag)
    if _load_phase(arch, req, n_gpus, state.weights, breakdown):
        phase = "model load (NF4 quantization on the GPU)"
    full_bytes = 4.0 if req.method == "full" and req.precision != "bf16" else state.param_bytes
    notes = memory_notes(arch, req, n_gpus, coef, state)
    return MemoryResult(
        per_gpu_bytes=sum(breakdown.values()),
        breakdown=breakdown,
        offloaded=offloaded,
        peak_phase=phase,
        trainable=trainable,
        sharding="fsdp" if n_gpus > 1 else "none",
        checkpoint_bytes=trainable * full_bytes + trainable * state.state_bytes,
        download_bytes=2.0 * arch.parameters,
        notes=notes,
    )


def memory_notes(
    arch: Architecture, req: EstimateRequest, n_gpus: int, coef: MemoryCoefficients, state: _TrainedState
) -> list[str]:
    """The memory mechanisms this estimate assumes, one line each (the estimate's assumptions)."""
    notes = []
    mode = allocator_mode(req)
    if mode == "expandable":
        notes.append(
            "allocator: expandable segments (the runner sets PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True before CUDA starts): the card needs ~2% above the tensors at the peak, "
            "whatever the batch shapes"
        )
    elif mode == "variable":
        notes.append(
            "allocator: PyTorch's default with batches of varying length: the card needs ~12% above the "
            "step's transient tensors; on a card with room to spare torch keeps old segments cached and its "
            "reserved memory can read up to ~2x the allocated peak (docs/estimation.md)"
        )
    if req.optimizer == "adamw":
        impl = adamw_impl(req)
        if impl == "foreach":
            notes.append(
                "optimizer: AdamW foreach allocates a temporary the size of one state (the parameters it "
                f"updates) in each step ({state.step_temp / GB:.1f} GB per GPU); adamw_impl=fused updates in "
                "place"
            )
        elif impl == "fused" and req.method == "full":
            notes.append("optimizer: fused AdamW (in place, no step temporaries)")
    if sdpa_math_fallback(arch, req, n_gpus):
        notes.append(
            "attention: fp32 queries with grouped-query attention and no mask take SDPA's math kernel, which "
            "materializes each layer's attention scores (priced); packing passes a mask and avoids it"
        )
    if n_gpus > 1:
        f = fsdp_terms(arch, req, n_gpus, coef)
        units = coef.fsdp_units if coef.fsdp_units is not None else fsdp_units_in_flight(req)
        text = (
            f"FSDP{req.fsdp_version}: the root unit (embeddings, lm_head) {f['root'] / GB:.1f} GB unsharded "
            f"through forward and backward, {units:g} block(s) in flight {f['gathered'] / GB:.1f} GB"
        )
        if f["gradient_buffers"]:
            text += f", unsharded gradients before reduce-scatter {f['gradient_buffers'] / GB:.1f} GB"
        if f["quant_state"]:
            text += f", bitsandbytes' quant state on every GPU {f['quant_state'] / GB:.1f} GB"
        notes.append(text + "; NCCL buffers beside the CUDA context")
    return notes
