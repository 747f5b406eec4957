"""The runner's data pipeline: read jsonl (any fsspec URI), check, tokenize with loss masks, pack, batch.

Tokenizing, fitting to seq_len, splitting and planning batches are the contract's (runner/contract/
tokenize.py, fitting.py, packing.py, example.py): pure Python the bot imports to count what the runner will
train. Here: reading a job's dataset through them (prepare.py), and the tensors (batching.py, masks.py),
which need torch, so those names are imported on first use.
"""

from __future__ import annotations

from typing import Any

from runner.contract.example import IGNORE_INDEX, Example
from runner.contract.fitting import DataStats
from runner.contract.records import DatasetError
from runner.data.prepare import PreparedData, prepare

_TENSORS = {
    "Batch": "runner.data.batching",
    "Batches": "runner.data.batching",
    "label_tokens_in": "runner.data.batching",
    "make_batches": "runner.data.batching",
    "model_inputs": "runner.data.batching",
    "segment_starts": "runner.data.batching",
    "tokens_in": "runner.data.batching",
    "segment_ids": "runner.data.masks",
}

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "Batches",
    "DataStats",
    "DatasetError",
    "Example",
    "PreparedData",
    "label_tokens_in",
    "make_batches",
    "model_inputs",
    "prepare",
    "segment_ids",
    "segment_starts",
    "tokens_in",
]


def __getattr__(name: str) -> Any:
    if name in _TENSORS:
        import importlib

        return getattr(importlib.import_module(_TENSORS[name]), name)
    raise AttributeError(f"module 'runner.data' has no attribute {name!r}")
