"""Micro-batches of tensors from examples, deterministic for (seed, epoch) so a resume can skip by index.

``make_batches`` plans the whole epoch at once (ints only) and returns a ``Batches`` sequence that builds
each batch's tensors when it is indexed. Each batch is a ``Batch`` (a dict, so ``model(**batch)`` works)
holding:

- ``input_ids``, ``labels`` (IGNORE_INDEX on prompts and padding), ``position_ids`` ([b, s] long, restarting
  at 0 for every example and for the padding after the last one);
- ``attention_mask``: without packing a [b, s] 0/1 padding mask; with packing none at all - nothing s x s is
  built on the host. What keeps packed examples apart is where they start: ``model_inputs`` turns the
  position ids into FlashAttention's ``cu_seq_lens`` keywords for runner/attention.py's varlen kernel (and
  flash_attention_2), and transformers' SDPA and eager paths derive their block mask from the restarting
  position ids on the device.

``Batch.num_tokens`` counts the non-pad tokens (``tokens_in``), ``Batch.num_label_tokens`` the tokens
that carry loss after the causal shift (for normalising the loss over gradient accumulation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, overload

import torch

from runner.contract.example import IGNORE_INDEX, Example
from runner.contract.packing import Plan, epoch_rng, plan_packed, plan_unpacked
from runner.data.masks import segment_ids

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
    ) -> None:
        self._examples = examples
        self.plan = plan
        self.seq_len = seq_len
        self.packing = packing
        self.attn = attn
        self.pad_id = pad_id

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
        batch.num_tokens = sum(sum(sizes) for sizes in lengths)
        batch.num_label_tokens = int((labels[:, 1:] != IGNORE_INDEX).sum())
        return batch


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
) -> Batches:
    """Plan and return the micro-batches of one epoch (see the module docstring for their contents).

    ``pad_id`` only fills padding (masked and ignored by the loss)."""
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn must be one of {ATTN_IMPLEMENTATIONS}, not {attn!r}")
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError("seq_len and micro_batch_size must be positive")
    lengths = [min(len(e), seq_len) for e in examples]
    rng = epoch_rng(seed, epoch)
    if packing:
        plan = plan_packed(lengths, seq_len=seq_len, micro_batch_size=micro_batch_size, rng=rng)
    else:
        plan = plan_unpacked(lengths, micro_batch_size=micro_batch_size, rng=rng)
    return Batches(examples, plan, seq_len=seq_len, packing=packing, attn=attn, pad_id=pad_id)


def segment_starts(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cu_seq_lens, longest segment) of [b, s] position ids over the flattened rows, computed on the host:
    a segment starts wherever the position restarts at 0 (every row, every packed example, the padding)."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    cu = torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return cu, longest


def model_inputs(
    batch: dict[str, torch.Tensor], device: torch.device | str
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """(the model's keyword arguments, labels, loss index) of a host batch, on ``device``.

    Everything the device needs to know is worked out here, on the host, so the forward and the loss never
    wait for the device to tell the host a size: the segments' bounds for the varlen kernels
    (``cu_seq_lens_q/k`` and ``max_length_q/k``, FlashAttention's keyword names, which transformers passes to
    every attention layer; SDPA and eager ignore them) and the flattened [b, s - 1] positions whose next token
    carries loss (runner/loss.py picks the hidden states there with a fixed-size ``index_select`` instead of
    a boolean mask, which would sync)."""
    device = torch.device(device)
    pinned = device.type == "cuda"

    def move(t: torch.Tensor) -> torch.Tensor:
        return (t.pin_memory() if pinned else t).to(device, non_blocking=pinned)

    labels = batch["labels"]
    index = (labels[:, 1:] != IGNORE_INDEX).reshape(-1).nonzero().flatten()
    inputs: dict[str, Any] = {k: move(v) for k, v in batch.items() if k != "labels"}
    if "position_ids" in batch:
        cu, longest = segment_starts(batch["position_ids"])
        cu = move(cu)
        inputs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return inputs, move(labels), move(index)


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
