"""The published measurements of docs/estimation.md as planner inputs and expected outputs.

Conventions: "torch" rows were read from torch.cuda (peak reserved or active), which excludes the CUDA
context; "device" rows are what the whole GPU needs. GiB rows are converted to GB (1e9 bytes).
Inputs a source did not state are filled with documented, physically plain choices (noted per row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3 / 1e9


@dataclass(frozen=True)
class Row:
    id: str
    request: dict[str, Any]
    gpu: str
    memory_gb: float | None = None
    tokens_per_second: float | None = None
    # "torch" (reserved, no CUDA context) | "allocated" (torch.cuda.max_memory_allocated: no allocator slack
    # either) | "device" | "footprint" (weights + context)
    convention: str = "torch"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every published stack computes its loss from the model's logits (its own path, which chunked_ce,
        # compile, legacy_logits and loss_upcast describe), not with the runner's chunked loss.
        self.request.setdefault("loss", "plain")
        # No published stack set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the runner does).
        self.request.setdefault("expandable_segments", False)
        # The Hugging Face Trainer and TRL with bf16=True (the QLoRA paper's qlora.py, PEFT's FSDP+QLoRA docs,
        # Unsloth's notebooks; PEFT's MetaMathQA benchmark priced the same way) compute under torch.autocast;
        # torchtune and fp32 runs do not; the rows say theirs (tunebot's own rows measured 9a0c9c1's runner,
        # which did not autocast LoRA/QLoRA: they say autocast=False).
        if self.request.get("stack", "hf") != "torchtune" and self.request.get("precision") != "fp32":
            self.request.setdefault("autocast", True)
        # Every published QLoRA run on one GPU upcast the non-4-bit weights with peft's
        # prepare_model_for_kbit_training (tunebot's runner too, until issue 37), the request's default then.
        if self.request.get("method") == "qlora" and self.request.get("gpus", 1) == 1:
            self.request.setdefault("qlora_upcast", True)


# torchtune README: batch 2, packed to 2048, torch.compile, activation checkpointing, chunked CE
# (the Llama 3 recipes' default loss), adapters in bf16; LoRA r=8 on q, v, output and MLP; full
# fine-tune with PagedAdamW8bit and optimizer-in-backward.
# Every published full fine-tune here trained pure bf16 weights (torchtune's dtype: bf16; PEFT's benchmark in
# bf16); tunebot's own default for full is mixed precision (runner.contract.spec.Defaults.full_precision).
_TT = dict(
    stack="torchtune",
    precision="bf16",
    batch_size=2,
    seq_len=2048,
    compile=True,
    gradient_checkpointing=True,
    chunked_ce=True,
    adapter_dtype="bf16",
    qlora_upcast=False,
    attn="sdpa",
)
# torchtune's distributed recipes shard with FSDP2 (fully_shard) since 0.2 (the README table is from 0.3).
_TT_LORA = dict(_TT, lora_r=8, lora_targets=["q", "v", "o", "gate", "up", "down"], fsdp_version=2)
_TT_FULL = dict(_TT, method="full", optimizer="paged_adamw_8bit", optimizer_in_backward=True)
# torchtune Llama-3.2-3B on one A100 80GB, batch 2 x 4096, full fine-tune with bf16 AdamW; each row
# adds one technique to the previous one.
_T3 = dict(
    stack="torchtune",
    precision="bf16",
    model="meta-llama/Llama-3.2-3B",
    method="full",
    batch_size=2,
    seq_len=4096,
    gradient_checkpointing=False,
    attn="sdpa",
    packing=True,
)
_T3_PACK = dict(_T3)
_T3_COMPILE = dict(_T3_PACK, compile=True)
_T3_CHUNK = dict(_T3_COMPILE, chunked_ce=True)
_T3_CKPT = dict(_T3_CHUNK, gradient_checkpointing=True)
_T3_OIB = dict(_T3_CKPT, optimizer_in_backward=True)
_T3_OFF = dict(_T3_OIB, activation_offload=True)
_T3_8BIT = dict(_T3_OFF, optimizer="adamw_8bit")
_T3_LORA = dict(
    _T3_OFF,
    method="lora",
    optimizer="adamw",
    optimizer_in_backward=False,
    lora_r=8,
    lora_targets=["q", "v", "o", "gate", "up", "down"],
    adapter_dtype="bf16",
)
# torchtune tutorials (torchtune 0.1.1), Llama-2-7B, batch 2, unpacked alpaca_cleaned padded to the batch's
# longest sample, which torchtune 0.1.1's alpaca dataset truncates at max_seq_len=512; checkpointing on.
_T2 = dict(
    stack="torchtune",
    model="meta-llama/Llama-2-7b-hf",
    batch_size=2,
    seq_len=512,
    packing=False,
    gradient_checkpointing=True,
    adapter_dtype="bf16",
    qlora_upcast=False,
)
# PEFT MetaMathQA benchmark: L40S, Llama-3.2-3B pure bf16, batch 4, max length 768, variable lengths.
_PEFT = dict(
    precision="bf16",
    optimizer_impl="foreach",  # the benchmark's torch.optim.AdamW without fused=True
    model="meta-llama/Llama-3.2-3B",
    batch_size=4,
    seq_len=768,
    packing=False,
    gradient_checkpointing=False,
    attn="sdpa",
)
# PEFT docs: A100 80GB, fp32 weights; batch and length not stated: batch 1 x 512. The table dates from PEFT's
# first release (February 2023), before torch 2.0 made AdamW foreach by default on CUDA: torch 1.13's AdamW
# ran its for-loop, which allocates no parameter-sized temporary.
_PD = dict(
    optimizer_impl="for-loop",
    precision="fp32",
    batch_size=1,
    seq_len=512,
    gradient_checkpointing=False,
    lora_r=8,
    lora_targets=["q", "v"],
)

ROWS: list[Row] = [
    Row(
        "torchtune 8B full 4090",
        dict(_TT_FULL, model="meta-llama/Llama-3.1-8B"),
        "rtx-4090",
        18.9 * GIB,
        1650,
    ),
    Row(
        "torchtune 8B lora 4090",
        dict(_TT_LORA, model="meta-llama/Llama-3.1-8B", method="lora"),
        "rtx-4090",
        16.2 * GIB,
        3083,
    ),
    Row(
        "torchtune 8B qlora 4090",
        dict(_TT_LORA, model="meta-llama/Llama-3.1-8B", method="qlora"),
        "rtx-4090",
        7.4 * GIB,
        2413,
    ),
    Row(
        "torchtune 70B lora 8xA100",
        dict(_TT_LORA, model="meta-llama/Llama-3.1-70B", method="lora", gpus=8),
        "a100-80gb",
        27.6 * GIB,
        3497,
    ),
    Row(
        "torchtune 405B qlora 8xA100",
        dict(_TT_LORA, model="meta-llama/Llama-3.1-405B", method="qlora", gpus=8, activation_offload=True),
        "a100-80gb",
        44.8,
        653,
        note="activation offload: the checkpointed inputs alone (16.9 GB/GPU) plus the NF4 shard exceed the "
        "published 44.8 GB, so the recipe must have offloaded them",
    ),
    Row(
        "torchtune 3B baseline (unpacked)",
        dict(_T3, packing=False, seq_len=768),
        "a100-80gb",
        25.5 * GIB,
        note="unpacked Alpaca padded to the batch's longest sample (~768 tokens); speed not compared: "
        "it depends on the dataset's length distribution",
    ),
    Row("torchtune 3B +packing", _T3_PACK, "a100-80gb", 60.0 * GIB, 7075),
    Row("torchtune 3B +compile", _T3_COMPILE, "a100-80gb", 51.0 * GIB, 8998),
    Row("torchtune 3B +chunked CE", _T3_CHUNK, "a100-80gb", 42.9 * GIB, 9174),
    Row("torchtune 3B +checkpointing", _T3_CKPT, "a100-80gb", 24.9 * GIB, 7210),
    Row("torchtune 3B +optimizer in backward", _T3_OIB, "a100-80gb", 23.1 * GIB, 7309),
    Row("torchtune 3B +activation offload", _T3_OFF, "a100-80gb", 21.8 * GIB, 7301),
    Row("torchtune 3B +8-bit AdamW", _T3_8BIT, "a100-80gb", 17.6 * GIB, 6960),
    Row("torchtune 3B lora", _T3_LORA, "a100-80gb", 8.5 * GIB, 8210),
    Row(
        "torchtune 3B qlora", dict(_T3_LORA, method="qlora", qlora_upcast=False), "a100-80gb", 4.6 * GIB, 8035
    ),
    Row("torchtune 2-7B lora qv r8", dict(_T2, lora_r=8, lora_targets=["q", "v"]), "a100-80gb", 15.57),
    Row("torchtune 2-7B lora all r8", dict(_T2, lora_r=8), "a100-80gb", 15.87),
    Row("torchtune 2-7B lora qv r64", dict(_T2, lora_r=64, lora_targets=["q", "v"]), "a100-80gb", 15.86),
    Row("torchtune 2-7B lora all r64", dict(_T2, lora_r=64), "a100-80gb", 17.04),
    Row(
        "torchtune 2-7B qlora",
        # torchtune 0.1.1's recipes/configs/llama2/7B_qlora_single_device.yaml: r=8 on q, k, v, output
        # and the MLP, gradient_accumulation_steps 16, compile False (so torchao dequantizes eagerly), and
        # the torchao 0.1 it pins, which quantizes each weight on the GPU in one piece: building and loading
        # the model reserves more than training allocates (bench/allocator_replay traces it: 9.23 GB).
        dict(
            _T2,
            method="qlora",
            lora_r=8,
            lora_targets="all-linear",
            grad_accum=16,
            nf4_quantizer="torchao-0.1",
        ),
        "a100-80gb",
        9.29,
    ),
    Row("peft metamath full l40s", dict(_PEFT, method="full"), "l40s", 37.3, 2315),
    Row(
        "peft metamath lora l40s",
        dict(_PEFT, method="lora", lora_r=32, lora_targets=["q", "v"]),
        "l40s",
        20.1,
        7194,
    ),
    Row("peft docs T0_3B full", dict(_PD, model="bigscience/T0_3B", method="full"), "a100-80gb", 47.1),
    Row("peft docs T0_3B lora", dict(_PD, model="bigscience/T0_3B", method="lora"), "a100-80gb", 14.4),
    Row(
        "peft docs bloomz-7b1 lora",
        dict(_PD, model="bigscience/bloomz-7b1", method="lora"),
        "a100-80gb",
        32.0,
    ),
    Row(
        "peft docs llama-2-70b qlora fsdp 2 gpus",
        dict(
            model="meta-llama/Llama-2-70b-hf",
            method="qlora",
            gpus=2,
            batch_size=2,
            seq_len=2048,
            gradient_checkpointing=True,
            attn="flash",
            lora_r=8,
            lora_targets="all-linear",
            # The run upcast its non-4-bit parameters (prepare_model_for_kbit_training, fp32 residual stream):
            # with CPU parameter offload the same run took 19.6 GB/GPU, ~18 GB beside the weights, which a
            # 16-bit stream (activations 5.4 GB, logits 2 GB) cannot fill. tunebot's runner skips the upcast
            # under FSDP.
            qlora_upcast=True,
        ),
        "a100-80gb",
        35.6,
    ),
    Row(
        "peft docs llama-2-70b qlora fsdp 2 gpus cpu offload",
        # The same run with FSDP's CPU offload of the parameters (accelerate's fsdp_offload_params: true): the
        # shards, their gradients and the optimizer live in CPU memory; the GPU keeps the units in flight, the
        # activations and the logits.
        dict(
            model="meta-llama/Llama-2-70b-hf",
            method="qlora",
            gpus=2,
            batch_size=2,
            seq_len=2048,
            gradient_checkpointing=True,
            attn="flash",
            lora_r=8,
            lora_targets="all-linear",
            qlora_upcast=True,
            fsdp_cpu_offload=True,
        ),
        "a100-80gb",
        19.6,
    ),
    # QLoRA paper: fine-tuning footprints (batch 1, r=64 on all linear layers, length 512).
    Row(
        "qlora paper 65B",
        dict(model="huggyllama/llama-65b", method="qlora", lora_r=64, batch_size=1, seq_len=512),
        "a100-80gb",
        41.0,
        convention="footprint",
    ),
    Row(
        "qlora paper 33B",
        dict(model="huggyllama/llama-30b", method="qlora", lora_r=64, batch_size=1, seq_len=512),
        "a100-80gb",
        21.0,
        convention="footprint",
    ),
    Row(
        "qlora paper 13B",
        dict(model="huggyllama/llama-13b", method="qlora", lora_r=64, batch_size=1, seq_len=512),
        "a100-80gb",
        10.0,
        convention="footprint",
    ),
    Row(
        "qlora paper 7B",
        dict(model="huggyllama/llama-7b", method="qlora", lora_r=64, batch_size=1, seq_len=512),
        "a100-80gb",
        5.0,
        convention="footprint",
    ),
]

# tunebot's own runs on one H200 (issue 29; bench/gpu_check/README.md "Results" has the tables):
# Llama-3.2-1B's architecture with random weights (transformers 5.17, peft 0.21, bitsandbytes 0.50.2, torch
# 2.11+cu130), LoRA/QLoRA r=16 on all linear layers, gradient checkpointing, SDPA.
# bench/gpu_check/gpu_check.py: micro-batch 1 of fixed-length random rows fed without a mask, torch's default
# (foreach) AdamW, the default allocator, the runner's losses; torch.cuda.max_memory_reserved on a card with
# room to spare (convention "torch", as the other reserved rows).
_H200 = dict(
    model="meta-llama/Llama-3.2-1B",
    lora_r=16,
    lora_targets="all-linear",
    batch_size=1,
    gradient_checkpointing=True,
    attn="sdpa",
    attention_mask=False,
    optimizer_impl="foreach",
    autocast=False,
)
# bench/gpu_check/mechanisms.py (at e23f87c): micro-batch 2, the plain loss, fused AdamW (LoRA) or the named
# AdamW (full fine-tunes of 2 x 1,024 tokens); torch.cuda.max_memory_allocated (convention "allocated": the
# tensors, no allocator cache), which the default and expandable allocators share.
_H200_MECH = dict(
    model="meta-llama/Llama-3.2-1B",
    gradient_checkpointing=True,
    attn="sdpa",
    loss="plain",
    batch_size=2,
    autocast=False,
)
ROWS += [
    Row(
        "tunebot h200 lora 1024 chunked",
        dict(_H200, method="lora", seq_len=1024, loss="chunked"),
        "h200",
        3.19,
    ),
    Row("tunebot h200 lora 1024 plain", dict(_H200, method="lora", seq_len=1024, loss="plain"), "h200", 4.81),
    Row(
        "tunebot h200 lora 4096 chunked",
        dict(_H200, method="lora", seq_len=4096, loss="chunked"),
        "h200",
        4.13,
    ),
    Row(
        "tunebot h200 lora 4096 plain", dict(_H200, method="lora", seq_len=4096, loss="plain"), "h200", 10.94
    ),
    Row(
        "tunebot h200 qlora 1024 chunked",
        dict(_H200, method="qlora", seq_len=1024, loss="chunked"),
        "h200",
        2.81,
    ),
    Row(
        "tunebot h200 qlora 1024 plain", dict(_H200, method="qlora", seq_len=1024, loss="plain"), "h200", 4.53
    ),
    Row(
        "tunebot h200 qlora 4096 chunked",
        dict(_H200, method="qlora", seq_len=4096, loss="chunked"),
        "h200",
        13.15,
        note="fp32 queries (prepare_model_for_kbit_training's residual stream) with GQA and no mask: SDPA's "
        "math kernel (memory.sdpa_math_fallback)",
    ),
    Row(
        "tunebot h200 mech lora 4096 fixed",
        dict(
            _H200_MECH, method="lora", lora_r=16, seq_len=4096, optimizer_impl="fused", attention_mask=False
        ),
        "h200",
        15.89,
        convention="allocated",
    ),
    Row(
        "tunebot h200 mech lora 8192 fixed",
        dict(
            _H200_MECH, method="lora", lora_r=16, seq_len=8192, optimizer_impl="fused", attention_mask=False
        ),
        "h200",
        29.10,
        convention="allocated",
    ),
    Row(
        "tunebot h200 mech lora 8192 varying",
        dict(_H200_MECH, method="lora", lora_r=16, seq_len=8192, optimizer_impl="fused", packing=False),
        "h200",
        29.24,
        convention="allocated",
        note="12 micro-batches of 2 rows, log-normal lengths padded to the longest (at most 8,192)",
    ),
    Row(
        "tunebot h200 mech full bf16 foreach",
        dict(_H200_MECH, method="full", precision="bf16", seq_len=1024, optimizer_impl="foreach"),
        "h200",
        12.43,
        convention="allocated",
    ),
    Row(
        "tunebot h200 mech full bf16 fused",
        dict(_H200_MECH, method="full", precision="bf16", seq_len=1024, optimizer_impl="fused"),
        "h200",
        11.01,
        convention="allocated",
    ),
    Row(
        "tunebot h200 mech full mixed foreach",
        dict(
            _H200_MECH,
            method="full",
            precision="mixed",
            seq_len=1024,
            optimizer_impl="foreach",
            autocast=True,
        ),
        "h200",
        24.78,
        convention="allocated",
    ),
    Row(
        "tunebot h200 mech full mixed fused",
        dict(
            _H200_MECH, method="full", precision="mixed", seq_len=1024, optimizer_impl="fused", autocast=True
        ),
        "h200",
        20.91,
        convention="allocated",
    ),
]

# Unsloth "minimum VRAM" (QLoRA GB, 16-bit LoRA GB): Unsloth's fused stack, batch 1, short sequences.
# A sizing guide rather than measurements: four of its twelve figures contradict the others (same blocks,
# different vocabulary; a per-parameter slope that changes with size). UNSLOTH_XFAIL in test_published.py
# states each contradiction with numbers.
UNSLOTH_MIN = {
    "meta-llama/Llama-3.2-3B": (3.5, 8.0),
    "mistralai/Mistral-7B-v0.1": (5.0, 19.0),
    "meta-llama/Llama-3.1-8B": (6.0, 22.0),
    "microsoft/Phi-3-medium-4k-instruct": (8.5, 33.0),
    "Qwen/Qwen2.5-32B": (26.0, 76.0),
    "meta-llama/Llama-3.1-70B": (41.0, 164.0),
}


# Where each row comes from: the unit that leave-one-source-out cross-validation holds out.
SOURCES = {
    "torchtune 8B": "torchtune README",
    "torchtune 70B": "torchtune README",
    "torchtune 405B": "torchtune README",
    "torchtune 3B": "torchtune 3B memory table",
    "torchtune 2-7B": "torchtune 2-7B tutorials",
    "peft metamath": "PEFT MetaMathQA benchmark",
    "peft docs": "PEFT docs",
    "qlora paper": "QLoRA paper",
    "unsloth min": "Unsloth minimum-VRAM table",
    "unsloth context": "Unsloth max-context table",
    "tunebot h200": "tunebot H200 runs (issue 29)",
}


def source_of(row_id: str) -> str:
    for prefix, source in SOURCES.items():
        if row_id.startswith(prefix):
            return source
    raise KeyError(row_id)


# Unsloth's "minimum VRAM" guidance, read as Unsloth's stack (fused kernels, chunked loss, offloaded
# checkpoints, 8-bit AdamW) at its default max_seq_length 2048 and batch 1, as torch reports it.
UNSLOTH_REQUEST = dict(
    loss="plain",  # Unsloth's own (chunked_ce, compiled), not the runner's
    stack="unsloth",
    batch_size=1,
    seq_len=2048,
    compile=True,
    chunked_ce=True,
    qlora_upcast=False,
    adapter_dtype="bf16",
    activation_offload=True,
    optimizer="adamw_8bit",
)
# Unsloth's max context for Llama-3.1-8B QLoRA r=32, batch 1, with plain Hugging Face + FlashAttention-2: the
# longest sequence that fits the card, i.e. at that length the job needs the whole card. Measured in 2024 with
# transformers < 4.45, whose forward returned fp32 logits and whose loss made a shifted copy (legacy_logits).
UNSLOTH_CONTEXT = {"rtx-4090": 5_789, "a100-80gb": 28_454}


def memory_rows(guidance: bool = False) -> list[Row]:
    """Every published memory measurement as a Row: the table rows and Unsloth's max-context pairs (the card's
    memory at the published length, device convention); with `guidance`, also Unsloth's minimum-VRAM cells,
    a sizing guide rather than measurements (four of its twelve cells contradict the others)."""
    rows = [r for r in ROWS if r.memory_gb is not None]
    if guidance:
        for model, (q, lora) in UNSLOTH_MIN.items():
            for method, gb in (("qlora", q), ("lora", lora)):
                request = dict(UNSLOTH_REQUEST, model=model, method=method)
                rows.append(Row(f"unsloth min {model} {method}", request, "a100-80gb", gb))
    from bot.planner.gpus import gpu

    for card, length in UNSLOTH_CONTEXT.items():
        request = dict(
            model="meta-llama/Llama-3.1-8B",
            method="qlora",
            lora_r=32,
            batch_size=1,
            seq_len=length,
            attn="flash",
            legacy_logits=True,
        )
        rows.append(Row(f"unsloth context {card}", request, card, gpu(card).memory_gb, convention="device"))
    return rows
