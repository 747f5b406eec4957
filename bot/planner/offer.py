"""The offer model shared by the planner (ranking) and the providers (search results).

An Offer is one way to rent GPUs: a provider, a GPU model and count, and a price. Offers come from
the dated offline catalog snapshot (source="snapshot") or from a provider's live API
(source="live"); the planner ranks both the same way.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

# Canonical GPU names used everywhere in tunebot (CLI, catalog, providers, planner).
GPU_NAMES: tuple[str, ...] = (
    "rtx-3090",
    "rtx-4090",
    "rtx-a6000",
    "rtx-6000-ada",
    "l40s",
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
    "h200",
)


class Offer(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str  # "vast" | "runpod" | "lambda" | "tensordock" | "local"
    offer_id: str  # provider's id: Vast ask id, RunPod gpuTypeId, Lambda type@region, ...
    gpu: str  # canonical name from GPU_NAMES (or "cpu" for the local provider)
    gpu_count: int = Field(ge=1)
    gpu_memory_gb: float = Field(gt=0)  # per GPU
    price_per_hour: float = Field(ge=0)  # whole offer (all GPUs), compute only, USD
    interruptible: bool = False
    reliability: float | None = None  # 0..1 where the provider reports it
    location: str | None = None
    storage_per_gb_month: float = 0.0
    egress_per_gb: float = 0.0
    inet_down_mbps: float | None = None
    # Expected preemptions per hour for this offer class (interruptible capacity); 0 for on-demand.
    preemptions_per_hour: float = 0.0
    # Minutes from "launch" to the runner starting (boot + image pull); None = the planner's default for a
    # cloud instance. The local provider starts a process in seconds.
    boot_minutes: float | None = Field(default=None, ge=0)
    # This machine's CPU (the local provider): the cores its runs share, how many of its runs already use
    # them, the threads a runner started now gets (fewer than the cores while other work keeps them busy),
    # and whether it starts as a fork of a process that has imported its libraries (bot/providers/prewarm.py).
    # A run is priced for the share of the cores it gets.
    cpu_cores: int | None = Field(default=None, ge=1)
    runs_here: float = Field(default=0.0, ge=0)
    cpu_busy: float = Field(default=0.0, ge=0)  # cores' worth busy lately, other programs' work included
    cpu_threads: int | None = Field(default=None, ge=1)
    warm_start: bool = False
    # The local provider: how many launches from now start before one also starts its prewarmed process, an
    # import of the runner's libraries beside theirs (bot/providers/prewarm.py; 0: the next; None: none will).
    prewarm_after: int | None = Field(default=None, ge=0)
    # Its Python speed against the development machine's (bot/providers/host_speed.py): start-up and a small
    # model's dispatch scale with it.
    cpu_speed: float | None = Field(default=None, gt=0)
    # How long a runner's start took on this machine at a whole core (the local provider's own finished
    # runners: bot/providers/start_readings.py), plain and forked from the prewarmed process; None: not yet.
    start_seconds: float | None = Field(default=None, gt=0)
    fork_seconds: float | None = Field(default=None, gt=0)
    # The most disk a launch on this offer can ask for (GB): Vast's disk_space, Lambda's fixed storage,
    # TensorDock's max_storage_gb; None where the provider states no limit (RunPod) or in the snapshot.
    max_disk_gb: float | None = Field(default=None, ge=0)
    source: str = "snapshot"  # "snapshot" | "live"
    as_of: datetime | None = None  # when the price was observed
    raw: dict | None = Field(default=None, repr=False, exclude=True)

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.offer_id}:{'spot' if self.interruptible else 'od'}"
