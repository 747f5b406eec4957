"""The GPU table (docs/estimation.md): memory, bandwidth, dense bf16 tensor TFLOPS, measured matmul.

`memory_gb` is what the card really has (nvidia-smi total, MiB -> GB): a "24 GB" RTX 4090 has
24,564 MiB = 25.76 GB. `matmul_tflops` is the measured dense bf16 matmul rate, the realistic
ceiling that model FLOPs utilization is calibrated against (RTX 6000 Ada: no published figure;
it is the L40S's AD102 chip, so the L40S figure scaled by its higher clocks is used).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.planner.errors import BadRequestError

MIB = 1024**2


@dataclass(frozen=True)
class GPU:
    name: str
    label: str
    memory_gb: float  # decimal GB the card has
    bandwidth_gbs: float
    dense_tflops: float
    matmul_tflops: float
    kind: str  # "consumer" | "workstation" | "datacenter" | "cpu"
    interconnect_gbs: float  # per-GPU bandwidth to its peers (NVLink or PCIe), for FSDP


def _gpu(
    name: str, label: str, mib: int, bw: float, dense: float, matmul: float, kind: str, link: float
) -> GPU:
    return GPU(name, label, mib * MIB / 1e9, bw, dense, matmul, kind, link)


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        _gpu("rtx-3090", "RTX 3090", 24576, 936, 71, 71, "consumer", 25),
        _gpu("rtx-4090", "RTX 4090", 24564, 1008, 165, 165, "consumer", 25),
        _gpu("rtx-a6000", "RTX A6000", 49140, 768, 155, 123, "workstation", 25),
        _gpu("rtx-6000-ada", "RTX 6000 Ada", 49140, 960, 364, 270, "workstation", 25),
        _gpu("l40s", "L40S", 46068, 864, 362, 269, "workstation", 25),
        _gpu("a100-40gb", "A100 40GB", 40960, 1555, 312, 246, "datacenter", 300),
        _gpu("a100-80gb", "A100 80GB", 81920, 2039, 312, 265, "datacenter", 300),
        _gpu("h100-80gb", "H100 80GB SXM", 81559, 3350, 989, 790, "datacenter", 450),
        _gpu("h200", "H200", 143771, 4800, 989, 790, "datacenter", 450),
    )
}

# The local provider runs the runner on this machine's CPU (demos, tests): memory comes from the offer
# (host RAM), speed from a modest bf16 rate. Not in GPUS, which lists the cards clouds sell.
CPU = GPU("cpu", "CPU (this machine)", 0.0, 20, 1.0, 0.5, "cpu", 10)

ALIASES = {
    "3090": "rtx-3090",
    "4090": "rtx-4090",
    "a6000": "rtx-a6000",
    "6000-ada": "rtx-6000-ada",
    "rtx6000ada": "rtx-6000-ada",
    "a100": "a100-80gb",
    "a100-80": "a100-80gb",
    "a100-40": "a100-40gb",
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "l40": "l40s",
    "h200-141gb": "h200",
}


def known(name: str) -> GPU | None:
    """The GPU (or the local CPU) for a canonical name, None when unknown."""
    return GPUS.get(name) or (CPU if name == "cpu" else None)


def gpu(name: str) -> GPU:
    """The GPU for a canonical name (or a common alias); BadRequestError listing the names otherwise."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, ALIASES.get(key.replace("rtx-", ""), key))
    if key in GPUS:
        return GPUS[key]
    if key == "cpu":
        return CPU
    raise BadRequestError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
