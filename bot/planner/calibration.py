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
MIN_HOSTS = 3  # a promising figure (less memory, more speed) needs votes from this many different hosts
MIN_OWNERS = 2  # ... run by this many different owners
LOCAL_HOST = "local"  # Measurement.host of a run on the bot's own machine (trusted like an import)
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
    # Who reported it: the rented host ("<provider>:<offer>"; LOCAL_HOST for the bot's own machine; None for
    # a measurement that came from no host, a bench or a test) and the job's owner.
    host: str | None = None
    owner: str | None = None

    @property
    def trusted(self) -> bool:
        """Not a rented host's claim: an import, the bot's own machine, or no host at all."""
        return self.source == "import" or self.host is None or self.host == LOCAL_HOST

    def voter(self, index: int) -> str:
        """Whose vote this is: its host's (one per host), or its own for a trusted row."""
        return f"row:{index}" if self.trusted else f"host:{self.host}"


Key = tuple[str, str, str, str]  # (gpu, stack, method, size class)


@dataclass(frozen=True)
class Correction:
    key: Key
    memory_factor: float = 1.0
    memory_runs: int = 0
    speed_factor: float = 1.0
    speed_runs: int = 0
    memory_waiting: int = 0  # runs whose promising memory figure waits for corroboration
    speed_waiting: int = 0

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
        """The correction of this class, None when no run counts for it (all of them wait, or none)."""
        found = self.corrections.get((gpu, stack, method, size_class(parameters)))
        return found if found is not None and found.runs else None

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
    clipped = [clip(r) for r in log_ratios]
    n = len(clipped)
    return math.exp(n / (n + prior_runs) * huber_location(clipped))


def clip(log_ratio: float) -> float:
    return max(-MAX_LOG_RATIO, min(MAX_LOG_RATIO, log_ratio))


Kind = str  # "memory" | "speed"


def promising(kind: Kind, log_ratio: float) -> bool:
    """Whether evidence says the physics is pessimistic: it would promise jobs less memory or more speed."""
    return log_ratio < 0 if kind == "memory" else log_ratio > 0


@dataclass(frozen=True)
class Evidence:
    """One measurement's log ratio (clipped) for one figure, and who reported it."""

    index: int  # the measurement's position in what build() was given
    log_ratio: float
    voter: str
    owner: str | None
    trusted: bool


@dataclass(frozen=True)
class Pooled:
    factor: float = 1.0
    runs: int = 0  # runs behind the votes that count
    waiting: frozenset[int] = frozenset()  # indexes of runs whose promising vote waits for corroboration


def pool(kind: Kind, evidence: Sequence[Evidence]) -> Pooled:
    """One figure from its evidence: one vote per host (their median), promising votes only when
    corroborated, robust and shrunk toward the physics; memory never below it (see the module docstring)."""
    if not evidence:
        return Pooled()
    votes: dict[str, list[Evidence]] = {}
    for e in evidence:
        votes.setdefault(e.voter, []).append(e)
    value = {v: _median([e.log_ratio for e in items]) for v, items in votes.items()}
    claims = [v for v in votes if promising(kind, value[v]) and not all(e.trusted for e in votes[v])]
    owners = {e.owner for v in claims for e in votes[v]}
    corroborated = len(claims) >= MIN_HOSTS and len(owners) >= MIN_OWNERS
    counted = [v for v in votes if corroborated or v not in claims]
    waiting = frozenset() if corroborated else frozenset(e.index for v in claims for e in votes[v])
    if not counted:
        return Pooled(1.0, 0, waiting)
    n = len(counted)
    factor = math.exp(n / (n + PRIOR_RUNS) * huber_location([value[v] for v in counted]))
    if kind == "memory":
        factor = max(factor, 1.0)  # the mechanism's own figure is the floor
    return Pooled(factor, sum(len(votes[v]) for v in counted), waiting)


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


Predictor = Callable[[Measurement], tuple[float | None, float | None, str, str, float] | None]


@dataclass(frozen=True)
class Explained:
    """What build() made of each measurement: its key, log ratios and whether they count (for `calibrate
    show`: which runs moved which figure)."""

    key: Key | None  # None: the planner cannot predict its configuration (skipped)
    memory_log_ratio: float | None = None  # log(measured / physics), as claimed (pooled clipped)
    speed_log_ratio: float | None = None
    memory_waiting: bool = False
    speed_waiting: bool = False


def evidence(
    measurements: Sequence[Measurement], predict: Predictor
) -> tuple[dict[Key, dict[Kind, list[Evidence]]], list[Explained]]:
    """Each measurement's clipped log ratios against the physics, grouped by key and figure."""
    grouped: dict[Key, dict[Kind, list[Evidence]]] = {}
    explained: list[Explained] = []
    for i, m in enumerate(measurements):
        predicted = predict(m)
        if predicted is None:
            explained.append(Explained(None))
            continue
        mem_gb, tps, stack, method, parameters = predicted
        key = (m.gpu, stack, method, size_class(parameters))
        ratios: dict[Kind, float] = {}  # as measured; the evidence is clipped
        if m.max_memory_reserved_gb and mem_gb:
            ratios["memory"] = math.log(m.max_memory_reserved_gb / mem_gb)
        if m.tokens_per_second and tps:
            ratios["speed"] = math.log(m.tokens_per_second / tps)
        for kind, r in ratios.items():
            item = Evidence(i, clip(r), m.voter(i), m.owner, m.trusted)
            grouped.setdefault(key, {}).setdefault(kind, []).append(item)
        explained.append(Explained(key, ratios.get("memory"), ratios.get("speed")))
    return grouped, explained


def build(measurements: Iterable[Measurement], predict: Predictor) -> Calibration:
    """Pool measurements into corrections. `predict(m)` returns (predicted torch-reserved GB, predicted
    tokens/s, stack, method, parameters) for the measurement's configuration on its GPU, or None when it
    cannot."""
    return explain(list(measurements), predict)[0]


def explain(measurements: Sequence[Measurement], predict: Predictor) -> tuple[Calibration, list[Explained]]:
    """build(), and what it made of each measurement (which runs count, which wait for corroboration)."""
    grouped, explained = evidence(measurements, predict)
    out: dict[Key, Correction] = {}
    waiting: dict[Kind, set[int]] = {"memory": set(), "speed": set()}
    for key, kinds in grouped.items():
        mem, spd = pool("memory", kinds.get("memory", [])), pool("speed", kinds.get("speed", []))
        waiting["memory"] |= mem.waiting
        waiting["speed"] |= spd.waiting
        out[key] = Correction(
            key, mem.factor, mem.runs, spd.factor, spd.runs, len(mem.waiting), len(spd.waiting)
        )
    explained = [
        Explained(
            e.key,
            e.memory_log_ratio,
            e.speed_log_ratio,
            i in waiting["memory"],
            i in waiting["speed"],
        )
        for i, e in enumerate(explained)
    ]
    skipped = sum(1 for e in explained if e.key is None)
    return Calibration(out, skipped), explained
