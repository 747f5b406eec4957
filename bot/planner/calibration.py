"""Learning from finished runs: how far measurements sit from the physics, per (GPU, stack, method, size
class).

Every finished run (and every row a team imports from its past runs) is a Measurement: the configuration that
produced it and what the runner measured (peak torch.cuda.max_memory_reserved, total device memory used,
steady tokens/s). For each measurement the planner predicts the same configuration with its physics; the log
of measured/predicted is the run's evidence. Per key the evidence is pooled robustly (each run's log ratio
clipped to +-MAX_LOG_RATIO, then a Huber location, so one odd run among several barely moves it) and shrunk
toward the physics by n / (n + PRIOR_RUNS): one run moves an estimate a third of the way, twenty runs nearly
all the way.

Pure: measurements come in, corrections go out; the store, the engine and the CLI load and save them. The
planner takes a Calibration as an argument (estimate(..., calibration=...)) and never reads one itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PRIOR_RUNS = 2.0  # the physics weighs as much as this many runs (its held-out spread vs a run's noise)
MAX_LOG_RATIO = math.log(1.5)  # a run further than 1.5x from the physics counts as 1.5x (a config mix-up)
HUBER_DELTA = 0.1  # log-ratio scale beyond which a run's pull on the location is capped
SIZE_CLASSES = ((3e9, "<3B"), (10e9, "3-10B"), (40e9, "10-40B"), (math.inf, ">40B"))


def size_class(parameters: float) -> str:
    for bound, name in SIZE_CLASSES:
        if parameters < bound:
            return name
    return SIZE_CLASSES[-1][1]


class Measurement(BaseModel):
    """One finished run: the columns of `tunebot calibrate import` (CSV or JSON) and of the store's table."""

    model_config = ConfigDict(extra="ignore")

    gpu: str  # canonical GPU name ("cpu" for the local provider)
    gpus: int = Field(1, ge=1)
    request: dict[str, Any]  # the EstimateRequest fields that produced it (model, method, seq_len, ...)
    max_memory_reserved_gb: float | None = Field(None, gt=0)  # peak torch.cuda.max_memory_reserved per GPU
    device_memory_used_gb: float | None = Field(None, gt=0)  # peak total used on the device (NVML)
    tokens_per_second: float | None = Field(None, gt=0)  # steady, all GPUs together
    mfu: float | None = None
    job_id: str | None = None
    source: str = "run"  # "run" (recorded by the engine) | "import"
    recorded_at: float | None = None


Key = tuple[str, str, str, str]  # (gpu, stack, method, size class)


@dataclass(frozen=True)
class Correction:
    key: Key
    memory_factor: float = 1.0
    memory_runs: int = 0
    speed_factor: float = 1.0
    speed_runs: int = 0

    @property
    def runs(self) -> int:
        return max(self.memory_runs, self.speed_runs)

    def describe(self) -> str:
        gpu, stack, method, size = self.key
        parts = []
        if self.speed_runs:
            parts.append(f"speed x{self.speed_factor:.2f}")
        if self.memory_runs:
            parts.append(f"memory x{self.memory_factor:.2f}")
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        return (
            f"calibrated from {runs} on {gpu} ({stack} {method}, {size}: {', '.join(parts)} vs the physics)"
        )


@dataclass(frozen=True)
class Calibration:
    """Corrections by key; what estimate() takes. Empty = the physics alone."""

    corrections: dict[Key, Correction] = field(default_factory=dict)
    skipped: int = 0  # measurements whose configuration could not be predicted (unknown model or GPU)

    def lookup(self, gpu: str, stack: str, method: str, parameters: float) -> Correction | None:
        return self.corrections.get((gpu, stack, method, size_class(parameters)))

    def __len__(self) -> int:
        return len(self.corrections)


def huber_location(values: Sequence[float], delta: float = HUBER_DELTA, iters: int = 20) -> float:
    """Huber M-estimate of location (starts at the median; values beyond delta pull with a capped weight)."""
    s = sorted(values)
    mid = len(s) // 2
    loc = s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
    for _ in range(iters):
        weights = [1.0 if abs(v - loc) <= delta else delta / abs(v - loc) for v in values]
        new = sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
        if abs(new - loc) < 1e-9:
            break
        loc = new
    return loc


def shrunk_factor(log_ratios: Sequence[float], prior_runs: float = PRIOR_RUNS) -> float:
    """exp(n / (n + prior) * robust mean of the clipped log ratios): few runs stay near the physics."""
    if not log_ratios:
        return 1.0
    clipped = [max(-MAX_LOG_RATIO, min(MAX_LOG_RATIO, r)) for r in log_ratios]
    n = len(clipped)
    return math.exp(n / (n + prior_runs) * huber_location(clipped))


Predictor = Callable[[Measurement], tuple[float | None, float | None, str, str, float] | None]


def build(measurements: Iterable[Measurement], predict: Predictor) -> Calibration:
    """Pool measurements into corrections. `predict(m)` returns (predicted torch-reserved GB, predicted
    tokens/s, stack, method, parameters) for the measurement's configuration on its GPU, or None when it
    cannot."""
    memory: dict[Key, list[float]] = {}
    speed: dict[Key, list[float]] = {}
    skipped = 0
    for m in measurements:
        predicted = predict(m)
        if predicted is None:
            skipped += 1
            continue
        mem_gb, tps, stack, method, parameters = predicted
        key = (m.gpu, stack, method, size_class(parameters))
        if m.max_memory_reserved_gb and mem_gb:
            memory.setdefault(key, []).append(math.log(m.max_memory_reserved_gb / mem_gb))
        if m.tokens_per_second and tps:
            speed.setdefault(key, []).append(math.log(m.tokens_per_second / tps))
    out: dict[Key, Correction] = {}
    for key in memory.keys() | speed.keys():
        mem, spd = memory.get(key, []), speed.get(key, [])
        out[key] = Correction(key, shrunk_factor(mem), len(mem), shrunk_factor(spd), len(spd))
    return Calibration(out, skipped)
