"""What the planner's I/O edge (bot/planner/inputs.py) found out for one request, handed to the pure core.

estimate() reads nothing itself: the model's config, the dataset's token count (or the runner's view of
it), its format and its size on disk come in here, resolved once per request by the engine or the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.planner.architectures import Architecture
from bot.planner.request import EstimateRequest

DEFAULT_TOKENS = 10_000_000  # assumed when neither a dataset nor tokens= is given


@dataclass(frozen=True)
class DataPlan:
    """The dataset as the runner will see it: token lengths of the kept train and eval examples."""

    train_lengths: list[int]
    eval_lengths: list[int]
    records: int
    tokenized: int  # records tokenized exactly (all of them up to MAX_EXACT_RECORDS)
    truncated: int
    dropped: int
    _plans: dict[tuple[int, int, bool, int], Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def source(self) -> str:
        if self.tokenized >= self.records:
            return "runner's tokenizer, template and packing"
        return (
            f"runner's tokenizer on {self.tokenized:,} of {self.records:,} records, the rest scaled by "
            "their characters"
        )

    def length(self, req: EstimateRequest, processes: int) -> Any:
        """runner.contract.steps.RunLength of this data for ``req`` on ``processes`` GPUs."""
        from runner.contract.spec import PlateauSpec
        from runner.contract.steps import plan_batches, run_length

        key = (req.seq_len, req.batch_size, req.packing, req.seed)
        if key not in self._plans:  # the batch plans do not depend on the GPU count: made once
            self._plans[key] = tuple(
                plan_batches(
                    lengths,
                    seq_len=req.seq_len,
                    micro_batch_size=req.batch_size,
                    packing=req.packing,
                    seed=req.seed,
                    epoch=0,
                )
                for lengths in (self.train_lengths, self.eval_lengths)
            )
        return run_length(
            self.train_lengths,
            self.eval_lengths,
            seq_len=req.seq_len,
            micro_batch_size=req.batch_size,
            grad_accum=req.grad_accum,
            processes=processes,
            packing=req.packing,
            seed=req.seed,
            epochs=req.epochs,
            max_steps=req.max_steps,
            plateau=PlateauSpec(
                enabled=req.plateau, patience=req.plateau_patience, every_steps=req.eval_every
            ),
            plans=self._plans[key],
            keep=req.keep,
        )


@dataclass(frozen=True)
class PlanInputs:
    """Everything estimate() needs from outside the planner for one request (see inputs.resolve_inputs)."""

    arch: Architecture  # the model, its LoRA targets already resolved for the request (Architecture.adapt)
    model_source: str  # "built-in table", "hub", "hub cache" or "config file"
    config_of: str | None  # the built-in table entry whose config the model uses (None: not from the table)
    tokens: int  # training tokens per epoch as counted
    token_source: str  # how they were counted: "tokens=", "default", the tokenizer, the approximation
    data: DataPlan | None  # the runner's view of the dataset (None without the model's tokenizer)
    dataset_format: str | None  # the dataset's format as read (None without a dataset)
    dataset_bytes: int | None  # a local dataset file's size (None: remote, unreadable or no dataset)
