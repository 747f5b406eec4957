"""The GPU table (docs/estimation.md): memory, bandwidth, dense bf16 tensor TFLOPS, measured matmul.

`memory_gb` is what the card really has (nvidia-smi total, MiB -> GB): a "24 GB" RTX 4090 has
24,564 MiB = 25.76 GB. `matmul_tflops` is the measured dense bf16 matmul rate, the realistic
ceiling that model FLOPs utilization is calibrated against (RTX 6000 Ada: no published figure;
it is the L40S's AD102 chip, so the L40S figure scaled by its higher clocks is used).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.planner.errors import BadRequestError

MIB = 1024**2


# PCIe x16, one direction, what a transfer really reaches (~80% of 16 / 32 / 64 GB/s for gen 3 / 4 / 5).
PCIE_GBS = {3: 12.5, 4: 25.0, 5: 50.0}
# GeForce cards have peer-to-peer over PCIe disabled by the driver: NCCL stages every transfer through host
# memory (SHM transport), which about halves what a GPU exchanges with its peers.
NO_P2P = 0.5


@dataclass(frozen=True)
class GPU:
    name: str
    label: str
    memory_gb: float  # decimal GB the card has
    bandwidth_gbs: float
    dense_tflops: float
    matmul_tflops: float
    kind: str  # "consumer" | "workstation" | "datacenter" | "cpu"
    interconnect_gbs: float  # per-GPU bandwidth to its peers for FSDP's collectives: NVLink, else PCIe
    host_link_gbs: float = PCIE_GBS[4]  # PCIe to the host (paged optimizer states, offload)
    link: str = ""  # what the peers talk over, for the estimate's assumptions
    # fp32 matmuls off the tensor cores (the CUDA cores' dense fp32 rate, datasheet): where a step computes in
    # fp32 without TF32 (QLoRA's upcast lm_head and attention without autocast); TF32 is half the bf16 rate.
    fp32_tflops: float = 0.0
    # The share of one core the runner's Python thread gets (the CPU shared by several runs): its dispatch
    # takes 1/host_share as long.
    host_share: float = 1.0
    cores: int = 0  # the CPU's cores this run computes on (a share of the machine's; 0 for a GPU)
    # This CPU's Python speed against the development machine's, where the host-side constants were measured
    # (bot/providers/host_speed.py; 1 for a GPU host, whose host costs come from the published rows).
    host_speed: float = 1.0
    # A runner's start measured on this machine at a whole core, plain and forked (the local provider's
    # finished runners: bot/providers/start_readings.py); None where nothing was measured (and on a GPU).
    start_seconds: float | None = None
    fork_seconds: float | None = None

    @property
    def host_factor(self) -> float:
        """How many times longer the host's own work (imports, dispatch, bookkeeping) takes than the
        constants say: a share of a core, on a slower or faster CPU."""
        return 1.0 / max(self.host_share * self.host_speed, 1e-3)


def _gpu(
    name: str,
    label: str,
    mib: int,
    bw: float,
    dense: float,
    matmul: float,
    kind: str,
    *,
    pcie: int,
    nvlink: float = 0.0,
    p2p: bool = True,
    fp32: float = 0.0,
) -> GPU:
    """A card from its spec sheet: ``nvlink`` GB/s per GPU (0: none, the peers talk over PCIe gen ``pcie``,
    directly or, without ``p2p``, through host memory)."""
    host = PCIE_GBS[pcie]
    if nvlink:
        peers, link = nvlink, f"NVLink ({nvlink:g} GB/s per GPU)"
    else:
        peers = host * (1.0 if p2p else NO_P2P)
        via = "" if p2p else ", no peer-to-peer: via host memory"
        link = f"PCIe {pcie}.0 x16 ({peers:g} GB/s per GPU{via})"
    return GPU(name, label, mib * MIB / 1e9, bw, dense, matmul, kind, peers, host, link, fp32_tflops=fp32)


# Consumer cards (RTX 3090/4090) in cloud boxes have no NVLink (the 3090's two-card bridge is rarely fitted)
# and no PCIe peer-to-peer; workstation cards (A6000, 6000 Ada, L40S) talk over PCIe directly; A100 / H100 /
# H200 here are the SXM boards on NVLink (300 and 450 GB/s per direction per GPU).
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        _gpu("rtx-3090", "RTX 3090", 24576, 936, 71, 71, "consumer", pcie=4, p2p=False, fp32=35.6),
        _gpu("rtx-4090", "RTX 4090", 24564, 1008, 165, 165, "consumer", pcie=4, p2p=False, fp32=82.6),
        _gpu("rtx-a6000", "RTX A6000", 49140, 768, 155, 123, "workstation", pcie=4, fp32=38.7),
        _gpu("rtx-6000-ada", "RTX 6000 Ada", 49140, 960, 364, 270, "workstation", pcie=4, fp32=91.1),
        _gpu("l40s", "L40S", 46068, 864, 362, 269, "workstation", pcie=4, fp32=91.6),
        _gpu("a100-40gb", "A100 40GB", 40960, 1555, 312, 246, "datacenter", pcie=4, nvlink=300, fp32=19.5),
        _gpu("a100-80gb", "A100 80GB", 81920, 2039, 312, 265, "datacenter", pcie=4, nvlink=300, fp32=19.5),
        _gpu("h100-80gb", "H100 80GB SXM", 81559, 3350, 989, 790, "datacenter", pcie=5, nvlink=450, fp32=67),
        _gpu("h200", "H200", 143771, 4800, 989, 790, "datacenter", pcie=5, nvlink=450, fp32=67),
    )
}

# The local provider runs the runner on this machine's CPU (demos, tests), in fp32: memory comes from the
# offer (host RAM), speed from its cores. What one core does for the runner's shapes, measured on the
# development machine (a cloud VM's cores, one thread, CPU time: bench/quote_vs_run.py): PyTorch's fp32 GEMMs
# at the widths of small models 60-97 GFLOPS (2048 x 64 x 64 .. 512), elementwise ops on activations that
# stay in cache ~20 GB/s (50 GB/s on 256 KB, 5 GB/s from DRAM); SDPA is speed.CPU_ATTN_EFF of the GEMM rate,
# the per-op dispatch speed.OP_SECONDS["cpu"]. A second thread adds CPU_PARALLEL_EFF of a core to the big
# ops (its spinning threads cost more than they give on a busy machine: the local provider then gives a run
# fewer threads). Not in GPUS, which lists the cards clouds sell.
CPU_CORE_GFLOPS = 90.0
CPU_CORE_GBS = 50.0
CPU_PARALLEL_EFF = 0.6
DEFAULT_CPU_CORES = 2  # a CPU offer that does not say how many cores it has


def cpu_device(
    cores: int = DEFAULT_CPU_CORES,
    runs: float = 1.0,
    threads: int | None = None,
    speed: float = 1.0,
    *,
    start_s: float | None = None,
    fork_s: float | None = None,
) -> GPU:
    """This machine's CPU as ``runs`` runs share its ``cores``: each run's threads get cores/runs of them (at
    most ``threads``: what the local provider gives a run while other work keeps cores busy), and its Python
    thread a whole core while runs <= cores, else cores/runs of one; its Python at ``speed`` times the
    development machine's; a runner's start measured here at a whole core (``start_s``, ``fork_s``)."""
    cores = max(1, int(cores))
    mine = cores / max(runs, 1.0)  # the cores this run's threads get
    if threads:
        mine = min(mine, float(threads))
    effective = mine if mine <= 1.0 else 1.0 + (mine - 1.0) * CPU_PARALLEL_EFF
    rate = effective * CPU_CORE_GFLOPS / 1000.0
    return GPU(
        "cpu",
        "CPU (this machine)",
        0.0,
        effective * CPU_CORE_GBS * speed,  # activations in cache: the core's clock, as its Python
        rate,
        rate,
        "cpu",
        10,
        10,
        "gloo over host memory",
        fp32_tflops=rate,
        host_share=min(1.0, mine),
        cores=cores,
        host_speed=speed,
        start_seconds=start_s,
        fork_seconds=fork_s,
    )


CPU = cpu_device()

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


_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|[^a-z0-9]")
_MEM = re.compile(r"(\d+)\s*gb", re.IGNORECASE)


def _compact(name: str) -> str:
    return _NOISE.sub("", name.lower())


def canonical(name: str | None, memory_gb: float | None = None) -> str | None:
    """The canonical name of a card however it is spelled (providers' names, what people type), or None.

    Vast "RTX 4090", RunPod "NVIDIA GeForce RTX 4090", Lambda "A100 (40 GB SXM4)", TensorDock
    "geforcertx4090-pcie-24gb", a person's "RTX4090" or "rtx_4090". The memory (given, or read from the
    name) tells A100 40GB from 80GB. Cards not planned for (T4, A10, L4, the Turing "RTX 6000", H100 NVL,
    Grace superchips) are None.
    """
    if not name:
        return None
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


def known(name: str) -> GPU | None:
    """The GPU (or the local CPU) for a canonical name, None when unknown."""
    return GPUS.get(name) or (CPU if name == "cpu" else None)


# What people type, compacted (lower case, no spaces, dashes, underscores, "nvidia"/"geforce"): the canonical
# names, the labels and the aliases above.
_TYPED = {
    **{_compact(g.label): g.name for g in GPUS.values()},
    **{_compact(alias): name for alias, name in ALIASES.items()},
    **{_compact(g.name): g.name for g in GPUS.values()},
    "cpu": "cpu",
}


def gpu(name: str) -> GPU:
    """The GPU for a name as people and providers write it (``rtx-4090``, ``RTX4090``, ``RTX 4090``,
    ``rtx_4090``, ``4090``, ``H100``, ``A100 80GB``, ``NVIDIA GeForce RTX 4090``); BadRequestError listing
    the names otherwise."""
    key = _TYPED.get(_compact(name)) or canonical(name)
    found = known(key) if key else None
    if found is None:
        raise BadRequestError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or cpu)")
    return found
