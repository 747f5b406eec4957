"""GPU name normalization across providers."""

from __future__ import annotations

import pytest

from bot.planner.offer import GPU_NAMES
from bot.providers.gpus import GPU_MEMORY_GB, normalize_gpu


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("RTX 4090", 24, "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", None, "rtx-4090"),
        ("geforcertx4090-pcie-24gb", None, "rtx-4090"),
        ("RTX 3090 Ti", None, "rtx-3090"),
        ("RTX A6000", None, "rtx-a6000"),
        ("A6000", 48, "rtx-a6000"),
        ("RTX 6000Ada", None, "rtx-6000-ada"),
        ("NVIDIA RTX 6000 Ada Generation", None, "rtx-6000-ada"),
        ("L40S", None, "l40s"),
        ("L40", None, None),
        ("A100 PCIE", 40, "a100-40gb"),
        ("A100 SXM4", 80, "a100-80gb"),
        ("NVIDIA A100-SXM4-80GB", None, "a100-80gb"),
        ("a100-sxm4-80gb", None, "a100-80gb"),
        ("H100 SXM", 80, "h100-80gb"),
        ("H100 NVL", 94, None),
        ("H200", 141, "h200"),
        ("GH200", 96, None),
        ("RTX 6000", 24, None),
        ("Tesla T4", 16, None),
        ("RTX 4090D", 24, None),
        ("", None, None),
        (None, None, None),
    ],
)
def test_normalize_gpu(name, memory, expected) -> None:
    assert normalize_gpu(name, memory) == expected


def test_every_canonical_name_has_a_memory() -> None:
    assert set(GPU_NAMES) <= set(GPU_MEMORY_GB)
    assert all(normalize_gpu(n) == n for n in GPU_NAMES)
