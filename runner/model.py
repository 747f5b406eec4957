"""Loading the base model and tokenizer, and making it trainable by method (full, LoRA, QLoRA).

Dtypes (runner.contract.spec.Defaults.precision_for): a full fine-tune on CUDA keeps fp32 master weights and
runs its forward under bf16 autocast (mixed precision; precision=bf16 asks for pure bf16 weights, fp32 for
fp32 compute); LoRA adapters (fp32, peft's default) train on a bf16 base; QLoRA computes in bf16 over NF4
weights. On CPU everything is float32, because bf16 matmuls on CPU are slow and numerically coarser, and CPU
runs exist for tests and demos only.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from runner.contract.spec import JobSpec, Method

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


def attn_implementation(spec: JobSpec, device: torch.device) -> str:
    if spec.attn == "flash":
        if device.type == "cuda":
            return "flash_attention_2"
        print("note: flash attention needs CUDA; using sdpa on this device", flush=True)
        return "sdpa"
    return spec.attn


def compute_dtype(device: torch.device, precision: str = "bf16") -> torch.dtype:
    """The dtype activations are computed in: bf16 on CUDA (also under mixed precision's autocast)."""
    return torch.bfloat16 if device.type == "cuda" and precision != "fp32" else torch.float32


def weights_dtype(spec: JobSpec, device: torch.device) -> torch.dtype:
    """The dtype the model is loaded in: fp32 master weights for a mixed-precision full fine-tune (the
    forward runs under autocast, see ``uses_autocast``) or with precision fp32; else bf16 on CUDA, fp32 on
    CPU."""
    precision = spec.resolved_precision
    if device.type != "cuda" or precision == "fp32" or (precision == "mixed" and spec.method is Method.full):
        return torch.float32
    return torch.bfloat16


def uses_autocast(spec: JobSpec, device: torch.device) -> bool:
    """fp32 master weights, bf16 matmuls: the full fine-tune's default on CUDA
    (runner.contract.spec.Defaults)."""
    return device.type == "cuda" and spec.method is Method.full and spec.resolved_precision == "mixed"


def load_model(
    spec: JobSpec,
    model_dir: Path,
    device: torch.device,
    *,
    fsdp: bool = False,
    target_modules: list[str] | str | None = None,
) -> Any:
    """The model ready to train: weights on `device`, adapters attached for LoRA/QLoRA (on
    ``target_modules``, default the spec's)."""
    from transformers import AutoModelForCausalLM

    dtype = compute_dtype(device, spec.resolved_precision)
    kwargs: dict[str, Any] = {
        "dtype": weights_dtype(spec, device),
        "attn_implementation": attn_implementation(spec, device),
    }
    if spec.method is Method.qlora:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
            # FSDP shards the 4-bit weights as flat tensors of the model dtype (docs/runner.md).
            bnb_4bit_quant_storage=dtype if fsdp else torch.uint8,
        )
        if not fsdp:
            kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if spec.method is not Method.qlora:
        model.to(device)
    model.config.use_cache = False  # the KV cache is for generation and costs memory in training

    if spec.method is Method.full:
        if spec.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if spec.method is Method.qlora and not fsdp:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=spec.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif spec.gradient_checkpointing:  # (sharded QLoRA skips the fp32 upcast: FSDP needs one dtype, as TRL)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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
    return get_peft_model(model, lora)


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing turned on in a loaded (possibly peft-wrapped) model, as load_model would have:
    the out-of-memory back-off's last step before asking for a bigger GPU (runner/oom.py)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "peft_config"):  # frozen embeddings: checkpointed blocks need an input that wants grad
        model.enable_input_require_grads()


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
