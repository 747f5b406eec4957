"""Loading the base model and tokenizer, and making it trainable by method (full, LoRA, QLoRA).

Precision (``precision_for``: a pure function of the spec and the device type, so a test can reproduce the
CUDA settings on the CPU): on CUDA every method computes in bf16 under ``torch.autocast`` - linear layers,
matmuls and scaled_dot_product_attention take bf16, as the Hugging Face Trainer with ``bf16=True`` does - and
fp32 stays only where the numerics need it: the norms' statistics (transformers' RMSNorm upcasts inside), the
loss's log-softmax and reduction (runner/loss.py), the adapters' master weights (peft keeps them fp32; under
autocast their inputs are no longer copied to fp32 first) and a full fine-tune's master weights
(precision=mixed). QLoRA's frozen embeddings, norms and lm_head stay bf16 (no
``prepare_model_for_kbit_training`` upcast: it made the residual stream, q/k/v at attention and the lm_head
matmul fp32), and TF32 is on for the fp32 matmuls that remain. precision=fp32 computes in fp32. On CPU
everything is float32 without autocast, because bf16 matmuls on CPU are slow and numerically coarser, and CPU
runs exist for tests, demos and the local provider.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runner.contract.spec import JobSpec, Method
from runner.quiet import enable_checkpointing_on

# Files of a model folder that are not weights: enough to read the config, build the model on the meta
# device (to check LoRA targets) and load the tokenizer before the weights are fetched.
LIGHT_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def resolve_base_model(base_model: str, *, weights: bool = True, into: Path | None = None) -> Path:
    """A local folder for the base model: a local path as is, an fsspec URI downloaded, a hub id fetched.

    ``weights=False`` fetches only the light files (config, tokenizer), so a job can be checked before
    gigabytes are downloaded; a second call with the same ``into`` folder adds the weights.
    """
    if "://" in base_model and not base_model.startswith("file://"):
        import fsspec

        fs, root = fsspec.core.url_to_fs(base_model)
        local = into or Path(tempfile.mkdtemp(prefix="tunebot-base-"))
        root = root.rstrip("/")
        files = [f for f in fs.find(root) if not f.endswith("/")]
        if not files:
            raise FileNotFoundError(f"no model files under {base_model}")
        for remote in files:
            rel = remote[len(root) :].lstrip("/")
            if rel.endswith(WEIGHT_SUFFIXES) and not weights:
                continue
            target = local / rel
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
        return local
    path = Path(base_model.removeprefix("file://")).expanduser()
    if path.exists():
        return path
    from huggingface_hub import snapshot_download

    token = os.environ.get("HF_TOKEN") or None
    if not weights:
        return Path(snapshot_download(base_model, token=token, allow_patterns=list(LIGHT_FILES)))
    ignore = unused_weight_files(base_model, token)
    return Path(snapshot_download(base_model, token=token, ignore_patterns=ignore))


# Files transformers never loads for a PyTorch model: other frameworks' weights, the original checkpoints some
# repos keep beside the converted ones (Llama's original/: another copy of every weight).
NOT_LOADED = (
    "original/*",
    "*.pth",
    "*.pt",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.ot",
    "*.tflite",
    "onnx/*",
    "coreml/*",
)


def ignored_weight_files(files: list[str]) -> list[str]:
    """The download's ignore patterns: what is not loaded, and the .bin copies where safetensors exist (the
    host's disk is sized for one 16-bit copy of the weights, bot/planner/disk.py)."""
    ignore = list(NOT_LOADED)
    if any(f.endswith(".safetensors") for f in files):
        ignore.append("*.bin")
    return ignore


def unused_weight_files(repo_id: str, token: str | None) -> list[str]:
    try:
        from huggingface_hub import list_repo_files

        files = list_repo_files(repo_id, token=token)
    except Exception:  # noqa: BLE001 - without the listing, skip only what is never loaded
        files = []
    return ignored_weight_files(files)


def linear_module_names(model_dir: Path) -> list[str]:
    """The names of the model's Linear layers (built on the meta device from config.json: nothing loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def check_target_modules(targets: list[str] | str, linear_names: list[str]) -> list[str] | str:
    """The LoRA targets as peft matches them (suffixes of module names); ValueError naming the model's own
    Linear layers when one matches nothing (peft would fail only after the weights were loaded)."""
    if targets == "all-linear":
        return targets
    suffixes = sorted({name.rsplit(".", 1)[-1] for name in linear_names if name != "lm_head"})
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in linear_names)]
    if missing:
        raise ValueError(
            f"LoRA target(s) {', '.join(missing)} match no Linear layer of this model; its Linear layers "
            f"are: {', '.join(suffixes)} (or use all-linear)"
        )
    return list(targets)


def has_flash_attention() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token is None:  # Llama tokenizers ship without one; padding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def attn_implementation(
    spec: JobSpec, device: torch.device, precision: Precision | None = None, config: Any = None
) -> str:
    """The attention kernel transformers is asked for. ``flash``: FlashAttention 2 (CUDA). ``sdpa`` on CUDA
    with 16-bit compute: runner/attention.py's varlen attention (each packed example attends only to itself
    through a variable-length kernel, flash-attn's or torch's, with no mask at all), where such a kernel
    exists here and trains correctly on ``device`` (``attention.resolve``) and the model's attention is plain
    causal (``config``: no sliding window, no logit soft-capping); else, and on the CPU, transformers' SDPA
    (packed rows: the block mask transformers makes on the device from the position ids, never one built on
    the host)."""
    if spec.attn == "flash":
        if device.type == "cuda":
            return "flash_attention_2"
        print("note: flash attention needs CUDA; using sdpa on this device", flush=True)
        return "sdpa"
    plan = precision or precision_for(spec, device.type)
    if spec.attn == "sdpa" and device.type == "cuda" and plan.compute != torch.float32:
        from runner import attention

        if attention.plain_causal(config) and attention.resolve(device, plan.compute, config).kernel:
            return attention.register()
    return spec.attn


@dataclass(frozen=True)
class Precision:
    """How a run holds and computes its numbers (``precision_for``)."""

    weights: torch.dtype  # the frozen base (and a full fine-tune's master weights) as loaded
    compute: torch.dtype  # what the forward's matmuls and attention run in
    autocast: bool  # the forward (and the loss) under torch.autocast(compute)
    tf32: bool  # fp32 matmuls that remain (adapters' weight gradients, the optimizer) may use TF32
    name: str  # what ran, for job.json and the card: "mixed", "bf16" or "fp32"

    def context(self, device_type: str) -> Any:
        """The forward's context: bf16 autocast on ``device_type`` (the loss and backward follow it), else
        nothing."""
        if self.autocast:
            return torch.autocast(device_type, dtype=self.compute)
        return contextlib.nullcontext()


def precision_for(spec: JobSpec, device_type: str) -> Precision:
    """The precision a spec trains with on a device type. Pure (no device is touched), so tests reproduce
    the CUDA settings on a CPU: ``precision_for(spec, "cuda").context("cpu")``."""
    precision = spec.resolved_precision
    if device_type != "cuda" or precision == "fp32":
        return Precision(torch.float32, torch.float32, False, device_type == "cuda", "fp32")
    if spec.method is Method.full and precision == "mixed":  # fp32 master weights, bf16 compute
        return Precision(torch.float32, torch.bfloat16, True, True, "mixed")
    if spec.method is Method.full:  # pure bf16 weights: nothing for autocast to cast
        return Precision(torch.bfloat16, torch.bfloat16, False, True, "bf16")
    # LoRA / QLoRA: a bf16 (or NF4 with bf16 compute) base, fp32 adapters whose matmuls run in bf16
    return Precision(torch.bfloat16, torch.bfloat16, True, True, "bf16")


def enable_tf32() -> None:
    """TF32 for the fp32 matmuls and convolutions that remain (CUDA only; no effect elsewhere)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def compute_dtype(device: torch.device, precision: str = "bf16") -> torch.dtype:
    """The dtype activations are computed in: bf16 on CUDA (also under mixed precision's autocast)."""
    return torch.bfloat16 if device.type == "cuda" and precision != "fp32" else torch.float32


def weights_dtype(spec: JobSpec, device: torch.device) -> torch.dtype:
    """The dtype the model is loaded in (``precision_for``): fp32 master weights for a mixed-precision full
    fine-tune or with precision fp32; else bf16 on CUDA, fp32 on CPU."""
    return precision_for(spec, device.type).weights


def uses_autocast(spec: JobSpec, device: torch.device) -> bool:
    """Whether the forward runs under bf16 autocast (``precision_for``): every method on CUDA unless
    precision is fp32 or a full fine-tune's pure bf16."""
    return precision_for(spec, device.type).autocast


def load_model(
    spec: JobSpec,
    model_dir: Path,
    device: torch.device,
    *,
    fsdp: bool = False,
    target_modules: list[str] | str | None = None,
    precision: Precision | None = None,
) -> Any:
    """The model ready to train: weights on `device`, adapters attached for LoRA/QLoRA (on
    ``target_modules``, default the spec's). ``precision``: ``precision_for(spec, device.type)`` unless given
    (a test gives the CUDA one on the CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    plan = precision or precision_for(spec, device.type)
    config = AutoConfig.from_pretrained(str(model_dir))
    kwargs: dict[str, Any] = {
        "dtype": plan.weights,
        "attn_implementation": attn_implementation(spec, device, plan, config),
    }
    if spec.method is Method.qlora:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=plan.compute,
            # FSDP shards the 4-bit weights as flat tensors of the model dtype (docs/runner.md).
            bnb_4bit_quant_storage=plan.compute if fsdp else torch.uint8,
        )
        if not fsdp:
            kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if spec.method is not Method.qlora:
        model.to(device)
    model.config.use_cache = False  # the KV cache is for generation and costs memory in training

    if spec.method is Method.full:
        if spec.gradient_checkpointing:
            enable_checkpointing_on(model)  # non-reentrant, by the library's current name
        return model

    from peft import LoraConfig, get_peft_model

    # QLoRA's frozen embeddings, norms and lm_head stay in the compute dtype: peft's
    # prepare_model_for_kbit_training would upcast them to fp32 (an fp32 residual stream, fp32 q/k/v at
    # attention and an fp32 lm_head matmul); the norms compute their statistics in fp32 anyway.
    for param in model.parameters():
        param.requires_grad = False
    if spec.gradient_checkpointing:
        enable_checkpointing_on(model)  # non-reentrant, by the library's current name
        model.enable_input_require_grads()
    lora = LoraConfig(
        r=spec.lora.r,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=spec.lora.target_modules if target_modules is None else target_modules,
        task_type="CAUSAL_LM",
    )
    # Under FSDP the adapters stay fp32 as priced: peft's wrap policy gives every trainable Linear its own
    # FSDP unit, so no flat parameter mixes dtypes or frozen and trainable tensors (runner/distributed.py).
    model = get_peft_model(model, lora)
    if plan.autocast:
        keep_adapter_inputs(model)
    return model


def keep_adapter_inputs(model: Any) -> None:
    """Under autocast the adapters read their bf16 input as it is: peft would first copy it to the fp32
    adapter dtype (a copy of every adapted input, which autocast then casts back to bf16 for the matmul)."""
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing turned on in a loaded (possibly peft-wrapped) model, as load_model would have:
    the out-of-memory back-off's last step before asking for a bigger GPU (runner/oom.py)."""
    enable_checkpointing_on(model)  # non-reentrant, by the library's current name
    if hasattr(model, "peft_config"):  # frozen embeddings: checkpointed blocks need an input that wants grad
        model.enable_input_require_grads()


def disable_checkpointing(model: Any) -> None:
    """Activation checkpointing off again (runner/oom.py: a back-off that turned it on, grown back)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.gradient_checkpointing_disable()


def trainable_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts, printed at start so the user sees what is trained."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def save_final(
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    *,
    state_dict: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """The adapter (LoRA/QLoRA) or the whole model (full) plus the tokenizer, loadable with transformers.

    ``dtype``: the dtype a whole model is written in (bf16 after mixed precision). ``state_dict``: the full
    weights gathered from FSDP shards. For an adapter its LoRA tensors are taken
    from it by name and written in peft's format (the adapter name dropped from the keys, as
    ``get_peft_model_state_dict`` does): peft's own helper walks the module tree, which FSDP has rewrapped,
    and found nothing (an empty adapter).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if state_dict is not None and hasattr(model, "peft_config"):
        from safetensors.torch import save_file

        name = getattr(model, "active_adapter", "default")
        adapter = {
            k.replace(f".{name}.", "."): v.detach().cpu().contiguous()
            for k, v in state_dict.items()
            if "lora_" in k and f".{name}." in k
        }
        save_file(adapter, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
        model.peft_config[name].save_pretrained(str(out_dir))
    elif dtype is not None and not hasattr(model, "peft_config"):
        # A mixed-precision full fine-tune trained fp32 master weights; the model people load is bf16 (half
        # the download, what the planner prices as the output). Checkpoints keep fp32 for an exact resume.
        state = model.state_dict() if state_dict is None else state_dict
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        model.save_pretrained(str(out_dir), state_dict=state)
        config = json.loads((out_dir / "config.json").read_text())
        config["dtype"] = config["torch_dtype"] = str(dtype).removeprefix("torch.")
        (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    elif state_dict is not None:  # gathered from FSDP shards
        model.save_pretrained(str(out_dir), state_dict=state_dict)
    else:
        model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
