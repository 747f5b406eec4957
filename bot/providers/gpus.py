"""One normalizer from every provider's GPU names to tunebot's canonical names (``GPU_NAMES``): the planner's
``canonical`` (bot/planner/gpus.py), which also reads what people type in ``gpu=``.

Providers spell the same card differently: Vast "RTX 4090", RunPod "NVIDIA GeForce RTX 4090",
Lambda "A100 (40 GB SXM4)", TensorDock "geforcertx4090-pcie-24gb". Cards we do not plan for
(T4, A10, L4, the Turing "RTX 6000", ...) map to None and their offers are dropped.
"""

from __future__ import annotations

import functools

from bot.planner.gpus import GPUS, canonical
from bot.planner.offer import GPU_NAMES

# Memory per GPU in decimal GB, the planner's figures (nvidia-smi MiB -> GB: a "24 GB" 4090 is 25.76 GB),
# so live offers and the planner's snapshot agree on what fits.
GPU_MEMORY_GB: dict[str, float] = {name: gpu.memory_gb for name, gpu in GPUS.items()}


@functools.lru_cache(maxsize=4096)
def normalize_gpu(name: str | None, memory_gb: float | None = None) -> str | None:
    """The canonical GPU name for a provider's name (and memory where it disambiguates), or None."""
    if name in GPU_NAMES:
        return name
    return canonical(name, memory_gb)


def gpu_memory(canonical: str, reported_gb: float | None = None) -> float:
    """Memory per GPU: the card's known figure (same as the planner's), else what the provider reported."""
    if canonical in GPU_MEMORY_GB:
        return GPU_MEMORY_GB[canonical]
    if reported_gb and reported_gb > 0:
        return float(reported_gb)
    return 1.0
