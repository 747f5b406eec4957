"""What the planner answers: the Estimate, whose JSON form is a stable contract (`tunebot estimate --json`).

Stable keys: model.parameters, memory.per_gpu_gb, memory.breakdown_gb{...},
speed.tokens_per_second, speed.step_seconds, time.hours,
offers[] {provider, gpu, gpu_count, interruptible, price_per_hour, hours, total_cost, fits, reason}.
New keys may be added; these are never renamed or removed. Ranges: memory.per_gpu_gb_range,
speed.tokens_per_second_range, time.hours_range, offers[].total_cost_range, each [low, high] (90% prediction
intervals of the planner's held-out errors for the job's class, bot/planner/ranges.py); per offer
memory_need_gb [low, high], memory_capacity_gb and memory_tight (issue 21).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class ModelInfo(BaseModel):
    name: str
    architecture: str
    parameters: int  # total
    active_parameters: int  # per token (differs for mixture-of-experts)
    trainable_parameters: int
    layers: int
    hidden_size: int
    vocab_size: int
    source: str  # "config file" | "hub" | "built-in table" | "hub cache"


class MemoryEstimate(BaseModel):
    per_gpu_gb: float  # peak reserved memory per GPU (GB = 1e9 bytes)
    # weights, adapters, gradients, optimizer, activations, logits, cuda_context, cublas_workspace, allocator
    breakdown_gb: dict[str, float]
    gpus: int
    sharding: str  # "none" | "fsdp"
    per_gpu_gb_range: list[float] | None = None  # [low, high]: offers must fit the high end (+ margin)


class SpeedEstimate(BaseModel):
    gpu: str
    gpus: int
    tokens_per_second: float  # all GPUs together
    step_seconds: float  # one optimizer step
    # Model FLOPs utilization: model FLOPs per second over the GPUs' peak dense bf16 rate (the datasheet's,
    # docs/estimation.md), as MFU is defined.
    mfu: float
    flops_per_token: float
    # The same FLOPs over the GPU's *measured* dense bf16 matmul rate (what the roofline runs on): its share
    # of what the card really does on big square matmuls, not MFU.
    matmul_share: float | None = None
    # False: the job does not fit this GPU at this count (nothing fits: the speed and time are what it would
    # take if it did, shown as such; the suggestions say what fits)
    fits: bool = True
    tokens_per_second_range: list[float] | None = None  # [low, high]
    calibrated_runs: int = 0  # finished runs behind the calibration of this GPU class (0 = physics alone)
    calibration: str | None = None  # "calibrated from 6 runs on rtx-4090 (...)"


class TimeEstimate(BaseModel):
    tokens: int  # tokens per epoch (non-pad, as the runner counts them)
    epochs: float  # passes over the data the steps make (steps= decides when given)
    steps: int  # optimizer steps in total: exactly what the runner trains
    hours: float  # compute hours on --gpu, eval passes included (without preemption overhead)
    token_source: str  # "runner's tokenizer, template and packing" | "tokens=" | "chars/4 approximation"...
    hours_range: list[float] | None = None  # [low, high]
    # The run's length as the runner computes it (runner/contract/steps.py): steps per epoch (None without a
    # counted dataset), eval passes and the tokens of one, the hours they take (included in `hours`), and the
    # runner's own "length:" line.
    steps_per_epoch: int | None = None
    evaluations: int = 0
    eval_tokens: int = 0
    eval_hours: float = 0.0
    # The side-by-side answers (runner/samples.py): prompts, most new tokens each, their hours (in `hours`).
    samples: int = 0
    sample_tokens: int = 0
    sample_hours: float = 0.0
    length: str | None = None
    # The whole run by phase (runner/contract/phases.py; bot/planner/phases.py), seconds, on the card's offer
    # (its start, download and checkpoint saves included): what `status JOB` sets the run's phases against.
    phases: dict[str, float] | None = None


class DiskEstimate(BaseModel):
    """The disk a launch asks for (GB = 1e9 bytes), passed to every provider's create call."""

    gb: float
    breakdown_gb: dict[str, float]  # image, weights, checkpoints, data, outputs, headroom


class RankedOffer(BaseModel):
    provider: str
    offer_id: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float
    interruptible: bool
    price_per_hour: float
    hours: float  # expected wall hours including preemption overhead
    total_cost: float  # expected total: compute + storage + egress + preemption overhead
    compute_cost: float = 0.0
    storage_cost: float = 0.0
    egress_cost: float = 0.0
    preemption_cost: float = 0.0
    total_cost_range: list[float] | None = None  # [low, high]: the compute-time range priced the same way
    checkpoint_minutes: float | None = None  # Young/Daly interval for interruptible offers
    checkpoint_save_seconds: float | None = None  # one checkpoint save there (written, signed, uploaded)
    # The quote by phase on this offer (runner/contract/phases.py, and "preemption": the work an interruptible
    # offer is expected to lose and redo), seconds: they add up to ``hours``. A job keeps its offer's.
    phases: dict[str, float] | None = None
    # [low, high] GB per GPU the job needs on this offer's GPU (the memory range; "fits" is judged on the high
    # end plus the safety margin), and whether that high end is within TIGHT_SHARE of the card's memory.
    memory_need_gb: list[float] | None = None
    memory_capacity_gb: float | None = None  # the card's memory as the fit is judged (GB = 1e9 bytes)
    memory_tight: bool = False
    fits: bool
    reason: str  # why it was rejected, or why it is recommended
    labels: list[str] = Field(default_factory=list)  # "cheapest" | "fastest" | "safest"
    # Why it was rejected, as a key: "memory" | "budget" | "class" | "gpu_count" | "gpu" | "unknown_gpu" |
    # "disk"
    rejected_by: str | None = None
    max_disk_gb: float | None = None  # the most disk this host offers (None: not stated)
    reliability: float | None = None
    source: str = "snapshot"
    # The local offer's: the CPU its quote priced the run on (plan.cpu_conditions: cores, runs sharing them,
    # threads, Python speed); kept with the finished run's measurement (bot/engine/outcome/calibration.py).
    cpu: dict[str, float] | None = None


class TrainingPlan(BaseModel):
    """What the runner will do, as priced: every field reaches the JobSpec unchanged
    (bot/engine/launching/jobspec.py).

    LoRA targets are the model's own module names (``q,v`` -> ``q_proj, v_proj`` on Llama-style models);
    the dataset format is the one read from the data (or given); alpha, plateau and the rest are resolved
    from the request and ``runner.contract.spec.Defaults``.
    """

    base_model: str  # the hub id or folder the runner loads (aliases resolved)
    method: str
    dataset: str | None = None
    dataset_format: str | None = None  # alpaca | messages | prompt_completion | text; None without a dataset
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_targets: list[str] | str  # "all-linear" or module names
    seq_len: int
    micro_batch_size: int
    grad_accum: int
    epochs: float
    max_steps: int | None = None
    learning_rate: float
    precision: str = "bf16"  # mixed | bf16 | fp32 (runner.contract.spec.Defaults.precision_for)
    lr_scheduler: str
    warmup_ratio: float
    weight_decay: float
    optimizer: str
    optimizer_impl: str = "fused"  # fused | foreach | for-loop: how torch's AdamW steps (runner/train.py)
    attn: str
    loss: str = "chunked"  # chunked | plain | liger (runner/loss.py)
    gradient_checkpointing: bool
    packing: bool
    gpus: int
    sharding: str  # "none" | "fsdp": what the memory estimate assumed
    # Why this micro-batch, accumulation, checkpointing and loss (bot/planner/batch_choice.py): the fastest
    # that fits the card the estimate shows; None when nothing was left to choose.
    batch_choice: str | None = None
    # The same choice on the other fitting offers' cards, where it differs: "<gpu>x<count>" -> [micro-batch,
    # accumulation, checkpointing, loss]. A job launched on one of them trains what its offer was priced with
    # (bot/engine/launching/jobspec.py spec_fields(..., gpu=, gpu_count=)).
    batch_by_gpu: dict[str, list[Any]] | None = None
    eval_split: float | None  # None: the automatic split (runner/contract/fitting.eval_size)
    eval_examples: int | None = None  # held out, as counted from the data (None: not counted)
    keep: str | None = None  # best | last | None (best with an eval split)
    samples: int = 0  # prompts both models answer (held-out examples', or the prompts file's)
    prompts: str | None = None  # the prompts file as given
    sample_tokens: int = 48
    seed: int
    plateau: bool
    plateau_patience: int
    plateau_on: str  # "eval loss" | "train loss"
    eval_every: int | None = None  # the runner's eval cadence in steps (None: PlateauSpec's automatic one)
    push_to_hub: str | None = None
    hub_private: bool = True
    merge: bool = False


class Estimate(BaseModel):
    model: ModelInfo
    method: str
    memory: MemoryEstimate
    speed: SpeedEstimate
    time: TimeEstimate
    offers: list[RankedOffer]
    assumptions: list[str]
    suggestions: list[str] = Field(default_factory=list)  # when nothing fits: what would
    prices_as_of: datetime | None = None
    prices_source: str = "snapshot"
    training: TrainingPlan | None = None  # what the runner gets (None only in hand-made estimates)
    warnings: list[str] = Field(default_factory=list)  # risky settings the person chose (the card shows them)
    disk: DiskEstimate | None = None  # the host's disk (None only in hand-made estimates)
