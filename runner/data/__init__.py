"""The runner's data pipeline: read jsonl (any fsspec URI), check, tokenize with loss masks, pack, batch."""

from __future__ import annotations

from runner.data.batching import Batch, Batches, label_tokens_in, make_batches, tokens_in
from runner.data.example import IGNORE_INDEX, Example
from runner.data.masks import block_causal_mask, cast_mask
from runner.data.prepare import DataStats, PreparedData, prepare
from runner.records import DatasetError

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "Batches",
    "DataStats",
    "DatasetError",
    "Example",
    "PreparedData",
    "block_causal_mask",
    "cast_mask",
    "label_tokens_in",
    "make_batches",
    "prepare",
    "tokens_in",
]
