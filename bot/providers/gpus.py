"""One normalizer from every provider's GPU names to tunebot's canonical names (``GPU_NAMES``).

Providers spell the same card differently: Vast "RTX 4090", RunPod "NVIDIA GeForce RTX 4090",
Lambda "A100 (40 GB SXM4)", TensorDock "geforcertx4090-pcie-24gb". Cards we do not plan for
(T4, A10, L4, the Turing "RTX 6000", ...) map to None and their offers are dropped.
"""

from __future__ import annotations

import functools
import re

from bot.planner.gpus import GPUS
from bot.planner.offer import GPU_NAMES

# Memory per GPU in decimal GB, the planner's figures (nvidia-smi MiB -> GB: a "24 GB" 4090 is 25.76 GB),
# so live offers and the planner's snapshot agree on what fits.
GPU_MEMORY_GB: dict[str, float] = {name: gpu.memory_gb for name, gpu in GPUS.items()}

_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|[^a-z0-9]")
_MEM = re.compile(r"(\d+)\s*gb", re.IGNORECASE)


def _compact(name: str) -> str:
    return _NOISE.sub("", name.lower())


@functools.lru_cache(maxsize=4096)
def normalize_gpu(name: str | None, memory_gb: float | None = None) -> str | None:
    """The canonical GPU name for a provider's name (and memory where it disambiguates), or None."""
    if not name:
        return None
    if name in GPU_NAMES:
        return name
    c = _compact(name)
    if memory_gb is None:
        found = _MEM.search(name)
        memory_gb = float(found.group(1)) if found else None
    if "gh200" in c or "gb200" in c:
        return None  # Grace superchips: different machines
    if "h200" in c:
        return "h200"
    if "h100" in c:
        if "nvl" in c or (memory_gb is not None and memory_gb > 85):
            return None  # H100 NVL (94 GB): a different card
        return "h100-80gb"
    if "a100" in c:
        if memory_gb is not None:
            return "a100-80gb" if memory_gb >= 60 else "a100-40gb"
        return "a100-80gb" if "80" in c else "a100-40gb"
    if "l40s" in c:
        return "l40s"
    if "6000ada" in c:
        return "rtx-6000-ada"
    if "a6000" in c:
        return "rtx-a6000"
    if re.search(r"4090(?!d)", c):
        return "rtx-4090"
    if "3090" in c:
        return "rtx-3090"
    return None


def gpu_memory(canonical: str, reported_gb: float | None = None) -> float:
    """Memory per GPU: the card's known figure (same as the planner's), else what the provider reported."""
    if canonical in GPU_MEMORY_GB:
        return GPU_MEMORY_GB[canonical]
    if reported_gb and reported_gb > 0:
        return float(reported_gb)
    return 1.0
