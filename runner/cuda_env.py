"""The CUDA caching allocator's settings the runner trains with, set before CUDA starts.

`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (torch/cuda/memory.py and CUDACachingAllocator.cpp: one
segment of address space per stream and pool, mapped in pages as it grows): a request no free block fits
extends the free block at the end of the segment instead of asking the driver for a new segment of its own
size, so batches whose shape changes step to step (unpacked, varying lengths) no longer leave whole cached
segments behind, and the reserved memory stays close to the allocated peak. The planner prices the runner with
it (bot/planner/request.EstimateRequest.expandable_segments, bot/planner/memory.allocator_slack). The setting
is read once, when CUDA initializes, so it is set here before torch touches the GPU: in the runner's entry
point (runner/cli.py) and again at the start of training for callers that skip the CLI; the launcher's
workers inherit it. An operator's own PYTORCH_CUDA_ALLOC_CONF that names expandable_segments is kept as is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def configure_allocator(environ: MutableMapping[str, str] | None = None) -> str:
    """Add expandable segments to PYTORCH_CUDA_ALLOC_CONF (other settings kept); returns the value."""
    env = os.environ if environ is None else environ
    current = env.get(ALLOC_CONF_ENV, "").strip()
    if "expandable_segments" in current:
        return current
    value = f"{current},{EXPANDABLE}" if current else EXPANDABLE
    env[ALLOC_CONF_ENV] = value
    return value
