"""The training plan of an estimate: what the runner will do, resolved from the request and the model.

Pure: the dataset's format comes in (read once by bot/planner/inputs.py). The plan is what the estimate card
lists and what the launch copies into the JobSpec, so nothing the planner priced changes on the way to the
GPU: LoRA targets become the model's own module names, a short alias the person typed becomes the hub id the
runner loads (a hub id, -Instruct variants included, stays exactly as typed), the dataset format is the one
the data has.
"""

from __future__ import annotations

from bot.planner.architectures import Architecture
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


def training_plan(
    arch: Architecture, req: EstimateRequest, *, sharding: str, dataset_format: str | None
) -> TrainingPlan:
    """The plan for ``req`` on this model: its hub id, its own LoRA module names, the data's format (as
    read: inputs.PlanInputs.dataset_format)."""
    return training_plan_without_model(req).model_copy(
        update={
            "base_model": arch.name,
            "dataset_format": dataset_format if req.dataset else None,
            "lora_targets": "all-linear"
            if req.method == "full"
            else resolved_targets(arch, req.lora_targets),
            "sharding": sharding,
        }
    )


def describe(plan: TrainingPlan) -> list[tuple[str, str]]:
    """The plan as (name, value) pairs for the estimate card and the CLI, with the option keys people use."""
    from bot.planner.options import as_text

    pairs: list[tuple[str, str]] = []
    if plan.method != "full":
        targets = as_text(plan.lora_targets)
        pairs.append(
            (
                "LoRA",
                f"r {plan.lora_r}, alpha {plan.lora_alpha}, dropout {plan.lora_dropout:g}, targets {targets}",
            )
        )
    if plan.method == "full":
        pairs.append(
            (
                "precision",
                {
                    "mixed": "mixed (fp32 master weights, bf16 compute)",
                    "bf16": "pure bf16",
                    "fp32": "fp32",
                }.get(plan.precision, plan.precision),
            )
        )
    decay = f", weight decay {plan.weight_decay:g}" if plan.weight_decay else ""
    pairs.append(
        (
            "learning rate",
            f"{plan.learning_rate:g} {plan.lr_scheduler}, warmup {plan.warmup_ratio:.0%}{decay}",
        )
    )
    length = (
        f"{plan.max_steps} steps (steps=: the data repeats or is cut to fit)"
        if plan.max_steps
        else f"{plan.epochs:g} epoch(s)"
    )
    pairs.append(("length", length))
    if plan.optimizer != "adamw" or plan.optimizer_impl != "fused":
        impl = f" ({plan.optimizer_impl})" if plan.optimizer == "adamw" else ""
        pairs.append(("optimizer", f"{plan.optimizer}{impl}"))
    gpus = f" x {plan.gpus} GPUs ({plan.sharding})" if plan.gpus > 1 else ""
    batch = f"seq {plan.seq_len} x micro-batch {plan.micro_batch_size} x accum {plan.grad_accum}{gpus}"
    if plan.batch_choice:  # what the planner chose for the card, and why (bot/planner/batch_choice.py)
        ckpt = "checkpointing" if plan.gradient_checkpointing else "no checkpointing"
        batch += f", {ckpt}, {plan.loss} loss (chosen: {plan.batch_choice})"
    pairs.append(("batch", batch))
    split = _split_text(plan)
    pairs.append(("data", (plan.dataset_format or "none yet") + split))
    plateau = f"on ({plan.plateau_on}, patience {plan.plateau_patience})" if plan.plateau else "off"
    pairs.append(("plateau stop", plateau))
    pairs.append(("seed", str(plan.seed)))
    result = _result_text(plan)
    if result:
        pairs.append(("result", result))
    outputs = []
    if plan.push_to_hub:
        outputs.append(f"push to {plan.push_to_hub} ({'private' if plan.hub_private else 'public'})")
    if plan.merge:
        outputs.append("merged model")
    if outputs:
        pairs.append(("output", ", ".join(outputs)))
    return pairs


def _split_text(plan: TrainingPlan) -> str:
    held = f": {plan.eval_examples:,} examples held out" if plan.eval_examples else ""
    if plan.eval_split is None:
        if plan.eval_examples is None:
            return ", eval split automatic (5% of 1,000+ examples, at most 200)"
        return f", eval split automatic{held}" if held else ", no eval split (automatic: < 1,000 examples)"
    return f", eval split {plan.eval_split:.0%}{held}" if plan.eval_split else ", no eval split"


def _result_text(plan: TrainingPlan) -> str:
    """'best eval loss; 3 side-by-side answers (held-out prompts)': what the run measures and keeps."""
    evaluated = bool(plan.eval_examples) or bool(plan.eval_split)
    keep = plan.keep or ("best" if evaluated else "last")
    parts = ["the step with the lowest eval loss" if keep == "best" and evaluated else "the last step"]
    if evaluated:
        parts.append("eval loss of the base model before training and of the result after")
    if plan.samples and (plan.prompts or evaluated):
        source = f"prompts from {plan.prompts}" if plan.prompts else "held-out prompts"
        parts.append(
            f"{plan.samples} side-by-side answers ({source}, greedy, at most {plan.sample_tokens} tokens)"
        )
    return "; ".join(parts)


def training_plan_without_model(req: EstimateRequest) -> TrainingPlan:
    """A plan from the request alone (no architecture: targets as typed, format as given)."""
    return TrainingPlan(
        base_model=req.model,
        method=req.method,
        dataset=req.dataset,
        dataset_format=None if req.dataset_format == "auto" else req.dataset_format,
        lora_r=req.lora_r,
        lora_alpha=req.alpha,
        lora_dropout=req.lora_dropout,
        lora_targets=req.lora_targets,
        seq_len=req.seq_len,
        micro_batch_size=req.batch_size,
        grad_accum=req.grad_accum,
        epochs=req.epochs,
        max_steps=req.max_steps,
        learning_rate=req.learning_rate,
        precision=req.precision,
        lr_scheduler=req.lr_scheduler,
        warmup_ratio=req.warmup_ratio,
        weight_decay=req.weight_decay,
        optimizer=req.optimizer,
        optimizer_impl=req.optimizer_impl or "fused",
        attn=req.attn,
        loss=req.loss,
        gradient_checkpointing=req.gradient_checkpointing,
        packing=req.packing,
        gpus=req.gpus,
        sharding="fsdp" if req.gpus > 1 else "none",
        eval_split=req.eval_split,
        keep=req.keep,
        samples=req.samples,
        prompts=req.prompts,
        sample_tokens=req.sample_tokens,
        seed=req.seed,
        plateau=req.plateau,
        plateau_patience=req.plateau_patience,
        plateau_on="eval loss" if req.eval_split else "train loss",
        eval_every=req.eval_every,
        push_to_hub=req.push_to_hub,
        hub_private=not req.hub_public,
        merge=req.merge,
    )
