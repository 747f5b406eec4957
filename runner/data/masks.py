"""Segments of a row: which example each position belongs to (padding after the last one is a segment too).

No attention mask is built here any more: packed examples are kept apart by where they start (position ids
restarting at 0; runner/data/batching.py ``model_inputs`` and runner/attention.py), never by a
[b, 1, s, s] mask on the host.
"""

from __future__ import annotations

import torch


def segment_ids(lengths: list[int], total: int) -> torch.Tensor:
    """Per-position segment number; positions after the examples (padding) form one last segment."""
    ids = torch.full((total,), len(lengths), dtype=torch.long)
    start = 0
    for number, length in enumerate(lengths):
        ids[start : start + length] = number
        start += length
    return ids
