"""jobs.plan replaces jobs.spec_overrides: the training plan is stored once (issue 22)

A job kept its training fields twice: the request, from which every launch derived the runner's fields
again, and ``spec_overrides`` (the estimate's plan as JobSpec fields, merged over them). Now ``plan`` alone
holds them (bot/engine/launching/launch.py build_spec reads nothing else). Rows are converted:
``spec_overrides`` as it was where it holds the plan; for jobs older than the stored plan (no ``base_model``
in it), the fields a launch used to derive from the request, with what ``spec_overrides`` held merged over
them.

Frozen: what a launch derived from a request is copied below as it was when this migration was written
(bot/planner/request.py's EstimateRequest with runner.contract.spec.Defaults' values written out,
bot/planner/training.py training_plan_without_model and bot/engine/launching/jobspec.py spec_fields), so the
migration does the same thing whatever the bot becomes; tests/store/test_db.py holds the copy against the
live code of today.

Revision ID: 0012_i22
Revises: 0011_i19
Create Date: 2026-12-03 23:00:00
"""

# No ``from __future__ import annotations``: alembic loads this file outside sys.modules, where pydantic
# could not resolve the request's annotations from strings.
import logging
from pathlib import Path
from typing import Any, Literal, Self

import sqlalchemy as sa
from alembic import op
from pydantic import BaseModel, ConfigDict, Field, model_validator

revision = "0012_i22"
down_revision = "0011_i19"
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String()),
    sa.column("request", sa.JSON()),
    sa.column("spec_overrides", sa.JSON()),
    sa.column("plan", sa.JSON()),
)


def plan_of_row(request: dict[str, Any] | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The stored plan of an existing row: what its next launch would have used for training fields."""
    overrides = dict(overrides or {})
    if "base_model" in overrides:
        return overrides
    try:
        req = _Request.model_validate(request or {})
    except ValueError as exc:  # a request this version cannot read: kept as it was (it cannot launch)
        log.warning("a job's request is unreadable; its plan keeps only its overrides: %s", exc)
        return overrides
    return _deep_merge(_spec_fields(req), overrides)


# --- frozen: the request and the fields a launch derived from it, as of this migration --------------------
class _Request(BaseModel):
    """bot/planner/request.py EstimateRequest as it was (its fields, bounds and method defaults)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    method: Literal["full", "lora", "qlora"] = "lora"
    lora_r: int = Field(16, ge=1, le=4096)
    lora_alpha: int | None = Field(None, ge=1, le=65536)
    lora_targets: list[str] | Literal["all-linear"] = "all-linear"
    batch_size: int = Field(1, ge=1, le=4096)
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    grad_accum: int = Field(1, ge=1, le=65536)
    gradient_checkpointing: bool = True
    attn: Literal["eager", "sdpa", "flash"] = "sdpa"
    loss: Literal["chunked", "plain", "liger"] = "chunked"
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw"
    gpus: int = Field(1, ge=1, le=1024)
    gpu: str | None = None
    dataset: str | None = None
    dataset_format: Literal["auto", "alpaca", "messages", "prompt_completion", "text"] = "auto"
    tokens: int | None = Field(None, ge=1, le=10**13)
    epochs: float = Field(1.0, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1, le=10**9)
    interruptible: bool | None = None
    packing: bool = True
    max_cost: float | None = Field(None, gt=0)
    learning_rate: float = Field(None, gt=0, lt=1)  # type: ignore[assignment]
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, le=10)
    eval_split: float | None = Field(None, ge=0, lt=0.5)
    keep: Literal["best", "last"] | None = None
    samples: int = Field(3, ge=0, le=8)
    prompts: str | None = Field(None, max_length=1000)
    sample_tokens: int = Field(48, ge=1, le=512)
    seed: int = Field(42, ge=0, le=2**32 - 1)
    plateau: bool = True
    plateau_patience: int = Field(10, ge=1, le=10_000)
    push_to_hub: str | None = Field(None, max_length=200, pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
    hub_public: bool = False
    merge: bool = False
    precision: Literal["bf16", "mixed", "fp32"] = Field(None)  # type: ignore[assignment]
    adapter_dtype: Literal["fp32", "bf16"] = "fp32"
    double_quant: bool = True
    nf4_quantizer: Literal["bitsandbytes", "torchao", "torchao-0.1", "prequantized"] | None = None
    stack: Literal["hf", "torchtune", "unsloth"] = "hf"
    compile: bool = False
    chunked_ce: bool = False
    optimizer_in_backward: bool = False
    fsdp_wrap: Literal["peft", "blocks"] = "peft"
    fsdp_version: Literal[1, 2] = 1
    fsdp_orig_params: bool = False
    fsdp_cpu_offload: bool = False
    activation_offload: bool = False
    autocast: bool = Field(None)  # type: ignore[assignment]
    qlora_upcast: bool = True
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    loss_upcast: bool = True
    legacy_logits: bool = False
    optimizer_impl: Literal["foreach", "fused", "for-loop"] | None = None
    expandable_segments: bool = True
    attention_mask: bool | None = None

    @model_validator(mode="after")
    def _method_defaults(self) -> Self:
        if self.learning_rate is None:
            self.__dict__["learning_rate"] = 2e-5 if self.method == "full" else 2e-4
        if self.precision is None:
            self.__dict__["precision"] = "mixed" if self.method == "full" else "bf16"
        elif self.precision == "mixed" and self.method != "full":
            self.__dict__["precision"] = "bf16"
        if self.autocast is None:
            self.__dict__["autocast"] = self.method == "full" and self.precision == "mixed"
        return self


def _spec_fields(req: _Request) -> dict[str, Any]:
    """The JobSpec fields of a plan made from the request alone (training_plan_without_model, then
    spec_fields without staged copies or prompts)."""
    dataset: dict[str, Any] = {
        "uri": req.dataset or "",
        "name": _display_name(req.dataset) if req.dataset else None,
        "eval_fraction": req.eval_split,
    }
    if req.dataset_format != "auto":
        dataset["format"] = req.dataset_format
    optimizer_impl = req.optimizer_impl or "fused"
    fields: dict[str, Any] = {
        "base_model": req.model,
        "base_model_name": _display_name(req.model),
        "dataset": dataset,
        "method": req.method,
        "lora": {
            "r": min(req.lora_r, 1024),
            "alpha": req.lora_alpha or req.lora_r * 2,
            "dropout": req.lora_dropout,
            "target_modules": req.lora_targets,
        },
        "seq_len": req.seq_len,
        "micro_batch_size": req.batch_size,
        "grad_accum": req.grad_accum,
        "epochs": req.epochs,
        "max_steps": req.max_steps,
        "learning_rate": req.learning_rate,
        "precision": req.precision,
        "lr_scheduler": req.lr_scheduler,
        "warmup_ratio": req.warmup_ratio,
        "weight_decay": req.weight_decay,
        "optimizer": req.optimizer,
        "packing": req.packing,
        "gradient_checkpointing": req.gradient_checkpointing,
        "attn": req.attn,
        "loss": req.loss,
        "sharding": "fsdp",
        "plateau": {"enabled": req.plateau, "patience": req.plateau_patience},
        "seed": req.seed,
        "merge": req.merge,
        "keep": req.keep,
        "samples": {"count": req.samples, "max_new_tokens": req.sample_tokens, "prompts": None},
    }
    if optimizer_impl != "fused":
        fields["optimizer_impl"] = optimizer_impl
    if req.push_to_hub:
        fields["push_to_hub"] = {"repo": req.push_to_hub, "private": not req.hub_public}
    return fields


def _display_name(name: str) -> str:
    if "://" in name and not name.startswith("file://"):
        return name
    path = name.removeprefix("file://")
    looks_like_path = path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()
    return Path(path).name if looks_like_path else name


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _deep_merge(out[key], value) if nested else value
    return out


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("plan", sa.JSON(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.request, jobs.c.spec_overrides)).all()
    for row in rows:
        plan = plan_of_row(row.request, row.spec_overrides)
        conn.execute(jobs.update().where(jobs.c.id == row.id).values(plan=plan))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("plan", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("spec_overrides")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec_overrides", sa.JSON(), nullable=True))
    conn = op.get_bind()
    conn.execute(jobs.update().values(spec_overrides=jobs.c.plan))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("spec_overrides", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("plan")
