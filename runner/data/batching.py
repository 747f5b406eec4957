"""Micro-batches of tensors from examples, deterministic for (seed, epoch) so a resume can skip by index.

``make_batches`` plans the whole epoch at once (ints only) and returns a ``Batches`` sequence that builds
each batch's tensors when it is indexed, so a long epoch of packed rows with [b, 1, s, s] masks never
sits in memory at once. Each batch is a ``Batch`` (a dict, so ``model(**batch)`` works) holding:

- ``input_ids``, ``labels`` (IGNORE_INDEX on prompts and padding), ``position_ids`` ([b, s] long);
- ``attention_mask``: without packing a [b, s] 0/1 padding mask; with packing and attn "eager"/"sdpa" a
  [b, 1, s, s] additive block-diagonal causal mask (see masks.py); with packing and attn "flash" there is
  NO attention_mask key: flash-attention's varlen path finds the example boundaries from position_ids
  restarting at 0, and a 2D mask would make it treat the whole row as one sequence.

``Batch.num_tokens`` counts the non-pad tokens (``tokens_in``), ``Batch.num_label_tokens`` the tokens
that carry loss after the causal shift (for normalising the loss over gradient accumulation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import overload

import torch

from runner.contract.example import IGNORE_INDEX, Example
from runner.contract.packing import Plan, epoch_rng, plan_packed, plan_unpacked
from runner.data.masks import block_causal_mask, segment_ids

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash")


class Batch(dict[str, torch.Tensor]):
    """A model-ready dict of tensors that also knows how many real tokens it holds."""

    num_tokens: int = 0
    num_label_tokens: int = 0


class Batches(Sequence[Batch]):
    """The batches of one epoch; tensors are built on access, identical for the same (seed, epoch)."""

    def __init__(
        self,
        examples: Sequence[Example],
        plan: Plan,
        *,
        seq_len: int,
        packing: bool,
        attn: str,
        pad_id: int,
        mask_dtype: torch.dtype,
    ) -> None:
        self._examples = examples
        self.plan = plan
        self.seq_len = seq_len
        self.packing = packing
        self.attn = attn
        self.pad_id = pad_id
        self.mask_dtype = mask_dtype

    def __len__(self) -> int:
        return len(self.plan)

    @overload
    def __getitem__(self, index: int) -> Batch: ...

    @overload
    def __getitem__(self, index: slice) -> Batches: ...

    def __getitem__(self, index: int | slice) -> Batch | Batches:
        if isinstance(index, slice):
            return Batches(
                self._examples,
                self.plan[index],
                seq_len=self.seq_len,
                packing=self.packing,
                attn=self.attn,
                pad_id=self.pad_id,
                mask_dtype=self.mask_dtype,
            )
        return self._build(self.plan[index])

    @property
    def num_tokens(self) -> int:
        """Non-pad tokens in the whole epoch, without building any tensor."""
        return sum(
            min(len(self._examples[i]), self.seq_len) for rows in self.plan for row in rows for i in row
        )

    def _build(self, rows: list[list[int]]) -> Batch:
        pieces = [[self._examples[i] for i in row] for row in rows]
        lengths = [[min(len(e), self.seq_len) for e in row] for row in pieces]
        width = max(sum(row) for row in lengths)
        n = len(rows)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.zeros((n, width), dtype=torch.long)
        segments = []
        for r, (row, sizes) in enumerate(zip(pieces, lengths, strict=True)):
            start = 0
            for example, size in zip(row, sizes, strict=True):
                input_ids[r, start : start + size] = torch.tensor(example.input_ids[:size])
                row_labels = torch.tensor(example.labels[:size])
                row_labels[0] = IGNORE_INDEX  # never learn across the boundary with the previous example
                labels[r, start : start + size] = row_labels
                position_ids[r, start : start + size] = torch.arange(size)
                start += size
            position_ids[r, start:] = torch.arange(width - start)
            segments.append(segment_ids(sizes, width))
        batch = Batch(input_ids=input_ids, labels=labels, position_ids=position_ids)
        if not self.packing:
            batch["attention_mask"] = (torch.stack(segments) == 0).long()
        elif self.attn != "flash":
            batch["attention_mask"] = block_causal_mask(torch.stack(segments), dtype=self.mask_dtype)
        batch.num_tokens = sum(sum(sizes) for sizes in lengths)
        batch.num_label_tokens = int((labels[:, 1:] != IGNORE_INDEX).sum())
        return batch


def mask_dtype_for(attn: str) -> torch.dtype:
    """The packed-row mask's dtype for an attention kernel. SDPA takes a boolean mask whatever the query's
    dtype (a float mask must match the query, and a query is fp32 wherever fp32 LoRA adapters or QLoRA's
    fp32 upcasts meet bf16 weights: a bf16 mask then fails on the GPU, as it did on an H200); eager attention
    adds the mask to the scores, where an fp32 mask promotes any score dtype."""
    return torch.bool if attn == "sdpa" else torch.float32


def make_batches(
    examples: Sequence[Example],
    *,
    seq_len: int,
    micro_batch_size: int,
    packing: bool,
    attn: str,
    seed: int,
    epoch: int,
    pad_id: int = 0,
    mask_dtype: torch.dtype = torch.float32,
) -> Batches:
    """Plan and return the micro-batches of one epoch (see the module docstring for their contents).

    ``pad_id`` only fills padding (masked and ignored by the loss); ``mask_dtype``: ``mask_dtype_for(attn)``.
    """
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn must be one of {ATTN_IMPLEMENTATIONS}, not {attn!r}")
    if mask_dtype == torch.bool and attn == "eager":
        raise ValueError("eager attention adds the mask to the scores: use a float mask_dtype, not bool")
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError("seq_len and micro_batch_size must be positive")
    lengths = [min(len(e), seq_len) for e in examples]
    rng = epoch_rng(seed, epoch)
    if packing:
        plan = plan_packed(lengths, seq_len=seq_len, micro_batch_size=micro_batch_size, rng=rng)
    else:
        plan = plan_unpacked(lengths, micro_batch_size=micro_batch_size, rng=rng)
    return Batches(
        examples, plan, seq_len=seq_len, packing=packing, attn=attn, pad_id=pad_id, mask_dtype=mask_dtype
    )


def tokens_in(batches: Batch | Iterable[dict[str, torch.Tensor]]) -> int:
    """Non-pad tokens in one batch or in many (exact for Batch/Batches; a 2D attention_mask otherwise)."""
    if isinstance(batches, Batches):
        return batches.num_tokens
    if isinstance(batches, dict):
        return _tokens_in_one(batches)
    return sum(_tokens_in_one(batch) for batch in batches)


def _tokens_in_one(batch: dict[str, torch.Tensor]) -> int:
    if isinstance(batch, Batch):
        return batch.num_tokens
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum())
    raise ValueError(
        "cannot count tokens of a packed batch that is not a runner.data.Batch; "
        "count before moving it to the device"
    )


def label_tokens_in(batches: Batch | Iterable[dict[str, torch.Tensor]]) -> int:
    """Tokens that carry loss after the causal shift, in one batch or many."""
    if isinstance(batches, dict):
        return int((batches["labels"][:, 1:] != IGNORE_INDEX).sum())
    return sum(label_tokens_in(batch) for batch in batches)
