"""What a person asks for: one fine-tune request, the same from `tunebot estimate`, `tunebot launch` and
`/tune estimate|launch` (their options are bot/planner/options.py). The planner prices it; the launch turns
it, with the estimate's training plan, into the runner's JobSpec. Training defaults come from
``runner.contract.spec.Defaults``, so an option not given means the same thing to the estimate and to the
runner.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runner.contract.spec import Defaults


def runner_autocast(method: str, precision: str) -> bool:
    """Whether the runner's forward runs under bf16 autocast on CUDA (runner/model.precision_for): fp32 master
    weights of a mixed-precision full fine-tune, and LoRA / QLoRA on their bf16 base (issue 37; they ran
    without autocast before); not a pure-bf16 full fine-tune (nothing to cast) nor fp32."""
    if method == "full":
        return precision == "mixed"
    return precision != "fp32"


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str  # hub id, built-in name, config.json path or model folder
    method: Literal["full", "lora", "qlora"] = "lora"
    lora_r: int = Field(Defaults.lora_r, ge=1, le=4096)
    lora_alpha: int | None = Field(None, ge=1, le=65536)  # None: lora_r x Defaults.lora_alpha_per_r
    lora_targets: list[str] | Literal["all-linear"] = "all-linear"
    batch_size: int = Field(1, ge=1, le=4096)  # micro-batch per GPU
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    grad_accum: int = Field(1, ge=1, le=65536)
    gradient_checkpointing: bool = True
    attn: Literal["eager", "sdpa", "flash"] = "sdpa"
    # The runner's loss (runner/loss.py): "chunked" never holds the whole sequence's logits; "plain" is the
    # model's logits upcast to fp32 (the Hugging Face Trainer, and every published stack's own path, which the
    # flags below refine); "liger" Liger's fused kernel. Priced by bot/planner/memory.loss_path_bytes.
    loss: Literal["chunked", "plain", "liger"] = Defaults.loss  # type: ignore[assignment]
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw"
    gpus: int = Field(1, ge=1, le=1024)
    gpu: str | None = None  # canonical GPU name for speed/time (default: best fitting)
    dataset: str | None = None
    dataset_format: Literal["auto", "alpaca", "messages", "prompt_completion", "text"] = "auto"
    tokens: int | None = Field(None, ge=1, le=10**13)
    epochs: float = Field(Defaults.epochs, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1, le=10**9)  # caps the steps the epochs would make
    interruptible: bool | None = None  # None = rank both
    packing: bool = True
    max_cost: float | None = Field(None, gt=0)
    # Training hyperparameters: they do not change memory or speed, but they reach the runner unchanged.
    learning_rate: float = Field(None, gt=0, lt=1)  # type: ignore[assignment]  # None: by method (Defaults)
    lr_scheduler: Literal["cosine", "linear", "constant"] = Defaults.lr_scheduler  # type: ignore[assignment]
    warmup_ratio: float = Field(Defaults.warmup_ratio, ge=0, lt=1)
    weight_decay: float = Field(Defaults.weight_decay, ge=0, le=10)
    # None: the automatic split (runner/contract/fitting.eval_size: 5% of 1,000+ examples, at most 200).
    eval_split: float | None = Field(Defaults.eval_fraction, ge=0, lt=0.5)
    # The result: "best" (lowest eval loss) or "last"; None: best with an eval split, else last.
    keep: Literal["best", "last"] | None = None
    # Side-by-side answers of the base and the tuned model: this many prompts (held-out examples', or the
    # first lines of ``prompts``, a jsonl file or URI the bot reads), greedy, at most sample_tokens new each.
    samples: int = Field(Defaults.samples, ge=0, le=Defaults.max_samples)
    prompts: str | None = Field(None, max_length=1000)
    sample_tokens: int = Field(Defaults.sample_tokens, ge=1, le=512)
    seed: int = Field(Defaults.seed, ge=0, le=2**32 - 1)
    plateau: bool = Defaults.plateau
    plateau_patience: int = Field(Defaults.plateau_patience, ge=1, le=10_000)
    # How often the runner evaluates (runner.contract.spec.PlateauSpec.every_steps); None: the automatic
    # cadence. Not an option: a sweep sets it to its first stage's step, so its estimate prices the passes its
    # runs make.
    eval_every: int | None = Field(None, ge=1, le=10**9)
    # Runs of this request that train at once (a sweep's first stage): where they share one machine (the
    # local provider's CPU) each is priced for its share of it. Not an option: a sweep sets it.
    runs_at_once: int = Field(1, ge=1, le=64)
    # How the run logs to W&B (runner/wandb_log.py): its start is priced where it does. Not an option: the
    # bot's own setting (a WANDB_API_KEY: online; WANDB_MODE), set by the engine for every door.
    wandb: Literal["disabled", "offline", "online"] = "disabled"
    # Outputs.
    push_to_hub: str | None = Field(None, max_length=200, pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
    hub_public: bool = not Defaults.hub_private
    merge: bool = False
    # Techniques and precisions beyond the defaults (the defaults are the plain Hugging Face path:
    # Trainer + PEFT, bf16 weights, no compile). Published rows that used them set them explicitly.
    # mixed: fp32 master weights + bf16 autocast (a full fine-tune's default, what the runner does); bf16:
    # pure bf16 weights (full) or a bf16 frozen base (LoRA/QLoRA: their default; "mixed" means the same
    # there); fp32: fp32 compute. Not given: Defaults.precision_for(method).
    precision: Literal["bf16", "mixed", "fp32"] = Field(None)  # type: ignore[assignment]
    adapter_dtype: Literal["fp32", "bf16"] = "fp32"  # PEFT keeps adapters in fp32; torchtune in bf16
    double_quant: bool = True  # QLoRA: bnb_4bit_use_double_quant
    # QLoRA: what turns the 16-bit checkpoint into NF4 on the GPU (bot/planner/load_phase.py); None = the
    # stack's own (hf: bitsandbytes, torchtune: torchao, unsloth: prequantized -bnb-4bit checkpoints).
    nf4_quantizer: Literal["bitsandbytes", "torchao", "torchao-0.1", "prequantized"] | None = None
    stack: Literal["hf", "torchtune", "unsloth"] = "hf"  # training code: sets the calibrated utilization
    compile: bool = False  # torch.compile / fused kernels (torchtune, Unsloth)
    chunked_ce: bool = False  # chunked cross-entropy (logits never fully upcast to fp32)
    optimizer_in_backward: bool = False  # optimizer step fused into backward: no full gradient buffer
    # FSDP on several GPUs, as the runner does it by default (runner/distributed.py): peft's wrap policy
    # (every adapter its own unit), use_orig_params=False, nothing offloaded. Published runs that wrapped
    # whole blocks with use_orig_params=True (frozen and trainable tensors in one flat parameter) or offloaded
    # to the CPU say so (bot/planner/memory.fsdp_terms).
    fsdp_wrap: Literal["peft", "blocks"] = "peft"
    # 1: FullyShardedDataParallel (the runner, accelerate, the HF Trainer); 2: fully_shard (torchtune >= 0.2).
    fsdp_version: Literal[1, 2] = 1
    fsdp_orig_params: bool = False
    fsdp_cpu_offload: bool = False
    activation_offload: bool = False  # checkpointed layer inputs offloaded to CPU
    # Forward under torch.autocast (the HF Trainer's bf16=True): fp32 adapters see bf16 copies. None: what the
    # runner does (runner/model.precision_for: every method on CUDA but pure bf16 and fp32; runner_autocast).
    autocast: bool = Field(None)  # type: ignore[assignment]
    # peft.prepare_model_for_kbit_training casts QLoRA's non-4-bit params (embeddings, norms, lm_head) to
    # fp32: the Hugging Face path (published rows say so). None: what the runner does, which since issue 37
    # keeps them bf16 (runner/model.load_model).
    qlora_upcast: bool = Field(None)  # type: ignore[assignment]
    lora_dropout: float = Field(Defaults.lora_dropout, ge=0, lt=1)  # >0 keeps a dropout copy of each input
    # The loss upcasts the logits to fp32 (transformers' ForCausalLMLoss calls logits.float()); False for a
    # 16-bit loss (fp16 + DeepSpeed without autocast, model code that never upcasts its logits).
    loss_upcast: bool = True
    # transformers < 4.45: the model's forward upcast the logits to fp32 and returned them, and the loss made
    # a shifted fp32 copy (~18 B per token and vocabulary entry at the peak instead of 12). For 2024
    # measurements.
    legacy_logits: bool = False
    # How torch's AdamW runs: None = fused (tunebot's runner on CUDA, torchtune's configs); "foreach" =
    # torch's own default when fused is not asked for (the HF Trainer's adamw_torch before torch 2.8);
    # "for-loop" = torch < 2.0's default.
    optimizer_impl: Literal["foreach", "fused", "for-loop"] | None = None
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the runner sets it before CUDA starts
    # (runner/cuda_env.py), so the caching allocator grows one segment instead of caching a new one for every
    # larger shape; published rows from stacks that did not set it say False
    # (bot/planner/memory.allocator_mode).
    expandable_segments: bool = True
    # Whether the model gets an attention mask. None: what the runner passes (a block-causal mask when it
    # packs, a padding mask without packing, which transformers drops for a single unpadded row); False:
    # fixed-length rows fed without one (bench/gpu_check, most benchmarks). Without a mask transformers hands
    # grouped-query attention to SDPA as enable_gqa (bot/planner/memory.sdpa_math_fallback).
    attention_mask: bool | None = None

    @model_validator(mode="after")
    def _method_defaults(self) -> EstimateRequest:
        """The learning rate and precision the runner uses for this method when they are not given."""
        # Written past pydantic's __setattr__ so model_fields_set still tells what the person gave (warnings).
        if self.learning_rate is None:
            self.__dict__["learning_rate"] = Defaults.learning_rate_for(self.method)
        if self.precision is None:
            self.__dict__["precision"] = Defaults.precision_for(self.method)
        elif self.precision == "mixed" and self.method != "full":
            self.__dict__["precision"] = "bf16"  # fp32 adapters on a 16-bit base: peft's mixed precision
        if self.autocast is None:
            self.__dict__["autocast"] = runner_autocast(self.method, self.precision)
        if self.qlora_upcast is None:
            self.__dict__["qlora_upcast"] = False  # the runner's QLoRA keeps its 16-bit weights 16-bit
        return self

    def for_method(self, method: str) -> EstimateRequest:
        """This request with another method and that method's defaults where the person gave none."""
        data = self.model_dump(exclude_unset=True)
        return EstimateRequest(**{**data, "method": method})

    @property
    def alpha(self) -> int:
        """LoRA alpha as trained: given, or lora_r x Defaults.lora_alpha_per_r."""
        return self.lora_alpha or self.lora_r * Defaults.lora_alpha_per_r
