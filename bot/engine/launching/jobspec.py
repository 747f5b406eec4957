"""From a request and its estimate's training plan to the runner's JobSpec fields. Pure.

The plan (bot/planner/training.py) is what the estimate priced and showed; every field of it is copied
here unchanged, so the runner trains what the person saw: the model's own LoRA module names, the dataset
format read from the data, FSDP on several GPUs, the optimizer, attention kernel and hyperparameters.
Fields decided per launch (checkpoint folder, report token, GPUs of the offer, W&B, cost so far) are
added by bot/engine/launching/launch.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.planner.request import EstimateRequest
from bot.planner.result import TrainingPlan
from bot.planner.training import training_plan_without_model


def plan_of(request: EstimateRequest, plan: TrainingPlan | None) -> TrainingPlan:
    """The estimate's plan, or (for estimates made by hand, e.g. in tests) one from the request alone."""
    return plan if plan is not None else training_plan_without_model(request)


def spec_fields(
    plan: TrainingPlan,
    *,
    base_model: str | None = None,
    dataset_uri: str | None = None,
    dataset_format: str | None = None,
    prompts: list[dict[str, Any]] | None = None,
    gpu: str | None = None,
    gpu_count: int | None = None,
) -> dict[str, Any]:
    """JobSpec fields of the training itself. ``base_model`` / ``dataset_uri`` override where the runner
    reads them (staged copies); the plan's names stay for the model card. ``prompts``: the lines of the plan's
    prompts file as read on the bot's side (bot/engine/launching/staging.py), sent inline. ``gpu`` /
    ``gpu_count``: the offer the job was created for, whose micro-batch, accumulation, checkpointing and loss
    the planner chose on its card (TrainingPlan.batch_by_gpu; the plan's own fields otherwise)."""
    dataset: dict[str, Any] = {
        "uri": dataset_uri or plan.dataset or "",
        "name": display_name(plan.dataset) if plan.dataset else None,
        "eval_fraction": plan.eval_split,
    }
    fmt = dataset_format or plan.dataset_format
    if fmt:
        dataset["format"] = fmt
    fields: dict[str, Any] = {
        "base_model": base_model or plan.base_model,
        "base_model_name": display_name(plan.base_model),
        "dataset": dataset,
        "method": plan.method,
        "lora": {
            "r": min(plan.lora_r, 1024),
            "alpha": plan.lora_alpha,
            "dropout": plan.lora_dropout,
            "target_modules": plan.lora_targets,
        },
        "seq_len": plan.seq_len,
        "micro_batch_size": plan.micro_batch_size,
        "grad_accum": plan.grad_accum,
        "epochs": plan.epochs,
        "max_steps": plan.max_steps,
        "learning_rate": plan.learning_rate,
        "precision": plan.precision,
        "lr_scheduler": plan.lr_scheduler,
        "warmup_ratio": plan.warmup_ratio,
        "weight_decay": plan.weight_decay,
        "optimizer": plan.optimizer,
        "packing": plan.packing,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "attn": plan.attn,
        "loss": plan.loss,
        # The planner prices every method on several GPUs as FSDP-sharded (bot/planner/memory.py).
        "sharding": "fsdp",
        "plateau": {"enabled": plan.plateau, "patience": plan.plateau_patience},
        "seed": plan.seed,
        "merge": plan.merge,
        "keep": plan.keep,
        "samples": {"count": plan.samples, "max_new_tokens": plan.sample_tokens, "prompts": prompts},
    }
    on_card = (plan.batch_by_gpu or {}).get(f"{gpu}x{gpu_count or 1}") if gpu else None
    if on_card:  # the configuration this offer was priced with (bot/planner/batch_choice.py)
        keys = ("micro_batch_size", "grad_accum", "gradient_checkpointing", "loss")
        fields.update(dict(zip(keys, on_card, strict=True)))
    if plan.eval_every is not None:  # the cadence the estimate priced (None: the runner's automatic one)
        fields["plateau"]["every_steps"] = plan.eval_every
    if plan.optimizer_impl != "fused":  # the runner's default; a spec without it also suits older runners
        fields["optimizer_impl"] = plan.optimizer_impl
    if plan.push_to_hub:
        fields["push_to_hub"] = {"repo": plan.push_to_hub, "private": plan.hub_private}
    return fields


def display_name(name: str) -> str:
    """What the model card calls an input: a hub id or URI as is, a path on the bot's disk by its last
    part (the host never sees the bot's paths, not even as names)."""
    if "://" in name and not name.startswith("file://"):
        return name
    path = name.removeprefix("file://")
    looks_like_path = path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()
    return Path(path).name if looks_like_path else name


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = deep_merge(out[key], value) if nested else value
    return out
