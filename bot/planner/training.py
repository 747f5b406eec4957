"""The training plan of an estimate: what the runner will do, resolved from the request and the model.

Pure except for reading the first record of a dataset (its format). The plan is what the estimate card
lists and what the launch copies into the JobSpec, so nothing the planner priced changes on the way to the
GPU: LoRA targets become the model's own module names, the alias the person typed becomes the hub id the
runner loads, the dataset format is the one the data has.
"""

from __future__ import annotations

from bot.planner.architectures import Architecture
from bot.planner.errors import BadRequestError
from bot.planner.request import EstimateRequest
from bot.planner.result import TrainingPlan


def resolved_targets(arch: Architecture, targets: list[str] | str) -> list[str] | str:
    """The model's own Linear module names for what the person typed (`q,v` -> `q_proj, v_proj` on Llama,
    `query_key_value` on Falcon/GPT-NeoX); "all-linear" stays as is (peft resolves it the same way)."""
    if targets == "all-linear":
        return targets
    names: list[str] = []
    for lin in arch.lora_targets(targets):  # BadRequestError naming the model's layers when none match
        if lin.name not in names:
            names.append(lin.name)
    return names


def dataset_format(path: str, given: str) -> str:
    """The format of a dataset: as given, else what its first record's keys say (runner.records rules)."""
    if given != "auto":
        return given
    import json

    import fsspec

    from runner.records import detect_format

    try:
        with fsspec.open(path, "rt", encoding="utf-8", compression="infer") as stream:
            first = next((line for line in stream if line.strip()), None)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadRequestError(f"cannot read dataset {path}: {exc}") from None
    if first is None:
        raise BadRequestError(f"dataset {path} has no examples")
    try:
        fmt = detect_format(json.loads(first))
    except json.JSONDecodeError:
        raise BadRequestError(f"{path}:1 is not valid JSON") from None
    if fmt is None:
        raise BadRequestError(
            f"{path}:1: cannot tell the dataset format from its keys; expected alpaca (instruction, output), "
            "messages, prompt/completion or text, or give format=..."
        )
    return fmt.value


def training_plan(arch: Architecture, req: EstimateRequest, *, sharding: str) -> TrainingPlan:
    full = req.method == "full"
    return TrainingPlan(
        base_model=arch.name,
        method=req.method,
        dataset=req.dataset,
        dataset_format=dataset_format(req.dataset, req.dataset_format) if req.dataset else None,
        lora_r=req.lora_r,
        lora_alpha=req.alpha,
        lora_dropout=req.lora_dropout,
        lora_targets="all-linear" if full else resolved_targets(arch, req.lora_targets),
        seq_len=req.seq_len,
        micro_batch_size=req.batch_size,
        grad_accum=req.grad_accum,
        epochs=req.epochs,
        max_steps=req.max_steps,
        learning_rate=req.learning_rate,
        lr_scheduler=req.lr_scheduler,
        warmup_ratio=req.warmup_ratio,
        weight_decay=req.weight_decay,
        optimizer=req.optimizer,
        attn=req.attn,
        gradient_checkpointing=req.gradient_checkpointing,
        packing=req.packing,
        gpus=req.gpus,
        sharding=sharding,
        eval_split=req.eval_split,
        seed=req.seed,
        plateau=req.plateau,
        plateau_patience=req.plateau_patience,
        plateau_on="eval loss" if req.eval_split > 0 else "train loss",
        push_to_hub=req.push_to_hub,
        hub_private=not req.hub_public,
        merge=req.merge,
    )
