"""What goes into the output folder besides the weights, and where it goes after: the model card, the merged
model, the Hugging Face Hub.

- ``model_card``: README.md with the base model, the data, every hyperparameter, the final (and eval) loss
  and the cost, plus the Hub's YAML header (base_model, library_name, tags), so the folder explains itself
  in the bucket and on the Hub.
- ``merge_adapter``: the base model in 16-bit with the adapter merged in (``<output>/merged``), loaded on
  the CPU so that it never competes with training for GPU memory (it needs the 16-bit model in host RAM).
- ``push_folder``: ``HfApi(endpoint=HF_ENDPOINT, token=HF_TOKEN)``: create the repo (private by default),
  upload the folder in one commit; returns the repo's URL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from runner.spec import HubSpec, JobSpec, Method


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def model_card(spec: JobSpec, *, status: str, steps: int, max_steps: int | None, final_loss: float | None,
               eval_loss: float | None, tokens: int, train_seconds: float, data: dict[str, Any] | None,
               cost: float | None) -> str:
    """README.md for the output folder (and the Hub repo)."""
    base = spec.base_model_name or spec.base_model
    adapter = spec.method is not Method.full
    tags = ["tunebot", spec.method.value, *(["peft", "lora"] if adapter else [])]
    hub_id = re.fullmatch(r"[\w.\-]+/[\w.\-]+", base) is not None  # the Hub's base_model must be a repo
    header = ["---", f"base_model: {base}" if hub_id else "",
              f"library_name: {'peft' if adapter else 'transformers'}", "tags:",
              *(f"- {t}" for t in dict.fromkeys(tags)), "---"]
    data = data or {}
    lora = spec.lora
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules)
    steps_rule = f"max {spec.max_steps} steps" if spec.max_steps else f"{spec.epochs:g} epoch(s)"
    rows = [
        ("method", spec.method.value),
        *([("LoRA", f"r {lora.r}, alpha {lora.alpha}, dropout {lora.dropout:g}, targets {targets}")]
          if adapter else []),
        ("learning rate", f"{spec.learning_rate:g} ({spec.lr_scheduler}, warmup {spec.warmup_ratio:.0%}, "
                          f"weight decay {spec.weight_decay:g})"),
        ("length", steps_rule),
        ("sequence length", str(spec.seq_len)),
        ("batch", f"micro-batch {spec.micro_batch_size} x grad accumulation {spec.grad_accum} per process"),
        ("optimizer", spec.optimizer),
        ("packing", "yes" if spec.packing else "no"),
        ("activation checkpointing", "yes" if spec.gradient_checkpointing else "no"),
        ("attention", spec.attn),
        ("eval split", f"{spec.dataset.eval_fraction:.0%}" if spec.dataset.eval_fraction else "none"),
        ("plateau stop", (f"on ({'eval' if spec.dataset.eval_fraction else 'train'} loss, patience "
                          f"{spec.plateau.patience})") if spec.plateau.enabled else "off"),
        ("seed", str(spec.seed)),
    ]
    where = f" on {spec.cost.where}" if spec.cost.where else ""
    price = f" at {_money(spec.cost.price_per_hour)}/h" if spec.cost.price_per_hour is not None else ""
    estimate = (f" (estimated {_money(spec.cost.estimated_total)})"
                if spec.cost.estimated_total is not None else "")
    load = (f'from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained('
            f'"{spec.push_to_hub.repo if spec.push_to_hub else "PATH"}")') if adapter else (
            f'from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained('
            f'"{spec.push_to_hub.repo if spec.push_to_hub else "PATH"}")')
    lines = [
        *(h for h in header if h),
        "",
        f"# {spec.job_id}: {spec.method.value} fine-tune of {base}",
        "",
        "Trained with [tunebot](https://github.com/tunebot/tunebot)'s runner.",
        "",
        "## Data",
        "",
        f"- dataset: `{spec.dataset.format.value}` records from `{spec.dataset.name or spec.dataset.uri}`",
        f"- records: {data.get('records', '-')} (truncated to the sequence length: "
        f"{data.get('truncated', 0)}, "
        f"dropped: {data.get('dropped', 0)}); train examples {data.get('train_examples', '-')}, "
        f"eval examples {data.get('eval_examples', 0)}",
        f"- tokens per epoch: {data.get('tokens', '-'):,}" if isinstance(data.get("tokens"), int)
        else "- tokens per epoch: -",
        "",
        "## Hyperparameters",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "## Results",
        "",
        f"- status: {status}, {steps} of {max_steps or steps} optimizer steps, {tokens:,} tokens trained",
        f"- final training loss: {_loss(final_loss)}",
        f"- eval loss: {_loss(eval_loss)}",
        f"- training time: {_duration(train_seconds)}",
        f"- cost: {_money(cost)}{where}{price}{estimate}",
        "",
        "## Use",
        "",
        "```python",
        load,
        "```",
        "",
    ]
    return "\n".join(lines)


def merge_adapter(adapter_dir: Path, model_dir: Path, out_dir: Path, *, dtype: Any) -> None:
    """Save the base model with the adapter merged in (16-bit, on the CPU) plus the tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, device_map={"": "cpu"})
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(str(out_dir))


def push_folder(folder: Path, hub: HubSpec, *, message: str) -> str:
    """Upload ``folder`` to the Hub repo (created if missing); returns its URL. HF_TOKEN and HF_ENDPOINT
    come from the environment."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None)
    url = api.create_repo(hub.repo, private=hub.private, exist_ok=True, repo_type="model")
    api.upload_folder(folder_path=str(folder), repo_id=hub.repo, repo_type="model", commit_message=message)
    return str(url)
