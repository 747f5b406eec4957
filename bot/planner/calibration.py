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
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

PRIOR_RUNS = 2.0  # the physics weighs as much as this many runs (its held-out spread vs a run's noise)
SAFE_PRIOR_RUNS = 0.25  # ... against a slower or larger figure: one run moves the quote 80% of the way
ONE_HOST_SAFE = 2.0  # one rented host moves a figure at most 2x in the safe direction ...
SAFE_HOSTS = 2  # ... until this many hosts (of MIN_OWNERS owners) agree it is further off
SLOWEST = 50.0  # a run counts as at most 50x slower than the physics: past it, the host does something else
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
    # The CPU a run on this machine had: gpus.cpu_device's arguments (cores, runs, threads, speed) as its
    # quote priced them (plan.cpu_conditions). Predicted on the nominal CPU instead, a run that went as quoted
    # read as half the physics' speed (one thread of two, a machine slower than the development one), and
    # every later local quote was doubled. None: a GPU, an import.
    device: dict[str, float] | None = None

    @property
    def trusted(self) -> bool:
        """Not a rented host's claim: an import, the bot's own machine, or no host at all."""
        return self.source == "import" or self.host is None or self.host == LOCAL_HOST

    def voter(self, index: int) -> str:
        """Whose vote this is: its host's (one per host), or its own for a trusted row."""
        return f"row:{index}" if self.trusted else f"host:{self.host}"


Key = tuple[str, str, str, str]  # (gpu, stack, method, size class)


class Predicted(NamedTuple):
    """The physics' figures for a measurement's configuration on its GPU (plan.predicted): what its claims are
    compared with, and the physical bounds they are held to."""

    memory_gb: float | None  # torch-reserved peak per GPU
    tokens_per_second: float | None
    stack: str
    method: str
    parameters: float
    mfu: float | None = None  # the prediction's share of the GPU's matmul rate: the roofline is 1 / mfu away
    device_gb: float | None = None  # what the GPU holds: no run reserves more


def within_roofline(factor: float, mfu: float | None) -> float:
    """A speed factor that never takes an estimate past the roofline (utilization 1 of the matmul rate)."""
    return min(factor, 1.0 / mfu) if mfu and mfu > 0 else factor


@dataclass(frozen=True)
class Correction:
    key: Key
    memory_factor: float = 1.0
    memory_runs: int = 0
    speed_factor: float = 1.0
    speed_runs: int = 0
    memory_waiting: int = 0  # runs whose promising memory figure waits for corroboration
    speed_waiting: int = 0
    memory_held: int = 0  # runs whose slower or larger claim waits at ONE_HOST_SAFE for a second host
    speed_held: int = 0

    @property
    def runs(self) -> int:
        return max(self.memory_runs, self.speed_runs)

    def describe(self) -> str:
        """'calibrated from 1 run on h200 (hf qlora, <3B: speed x0.21 from 1 run vs the physics)'."""
        gpu, stack, method, size = self.key
        parts = []
        if self.speed_runs:
            parts.append(f"speed x{self.speed_factor:.2f} from {plural(self.speed_runs, 'run')}")
        if self.memory_runs:
            parts.append(f"memory x{self.memory_factor:.2f} from {plural(self.memory_runs, 'run')}")
        held = max(self.speed_held, self.memory_held)
        bound = f"; one host moves it at most {ONE_HOST_SAFE:g}x until a second agrees" if held else ""
        return (
            f"calibrated from {plural(self.runs, 'run')} on {gpu} ({stack} {method}, {size}: "
            f"{', '.join(parts)} vs the physics{bound})"
        )


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


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


def bounded(kind: Kind, log_ratio: float, predicted: Predicted | None = None) -> float:
    """A run's log ratio within what physics allows: a promising claim within MAX_LOG_RATIO and, for speed,
    the roofline; a slower one within SLOWEST; a larger one within what its GPU holds (else SLOWEST too)."""
    if promising(kind, log_ratio):
        limit = MAX_LOG_RATIO
        if kind == "speed" and predicted is not None and predicted.mfu and predicted.mfu > 0:
            limit = min(limit, max(0.0, -math.log(predicted.mfu)))
        return max(-limit, min(limit, log_ratio))
    limit = math.log(SLOWEST)
    if kind == "memory" and predicted is not None and predicted.device_gb and predicted.memory_gb:
        limit = min(limit, max(0.0, math.log(predicted.device_gb / predicted.memory_gb)))
    return max(-limit, min(limit, log_ratio))


@dataclass(frozen=True)
class Evidence:
    """One measurement's log ratio (bounded) for one figure, and who reported it."""

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
    held: frozenset[int] = frozenset()  # indexes of runs whose safe vote is held at ONE_HOST_SAFE


def pool(kind: Kind, evidence: Sequence[Evidence]) -> Pooled:
    """One figure from its evidence: one vote per host (their median); promising votes only when
    corroborated, robust and shrunk toward the physics; slower or larger votes most of the way at once, one
    host's within ONE_HOST_SAFE; memory never below the physics (see the module docstring)."""
    if not evidence:
        return Pooled()
    votes: dict[str, list[Evidence]] = {}
    for e in evidence:
        votes.setdefault(e.voter, []).append(e)
    value = {v: _median([e.log_ratio for e in items]) for v, items in votes.items()}
    hosted = {v for v in votes if not all(e.trusted for e in votes[v])}  # a rented host's claims
    claims = [v for v in hosted if promising(kind, value[v])]
    owners = {e.owner for v in claims for e in votes[v]}
    corroborated = len(claims) >= MIN_HOSTS and len(owners) >= MIN_OWNERS
    counted = [v for v in votes if corroborated or v not in claims]
    waiting = frozenset() if corroborated else frozenset(e.index for v in claims for e in votes[v])
    value, held = _held_at_one_host(kind, votes, value, [v for v in counted if v in hosted])
    if not counted:
        return Pooled(1.0, 0, waiting)
    n = len(counted)
    location = huber_location([value[v] for v in counted])
    if promising(kind, location) or location == 0:
        factor = math.exp(n / (n + PRIOR_RUNS) * location)
    else:  # slower or larger: most of the way at once, in what it costs (time, memory)
        excess = math.exp(abs(location)) - 1.0
        moved = 1.0 + n / (n + SAFE_PRIOR_RUNS) * excess
        factor = moved if kind == "memory" else 1.0 / moved
    if kind == "memory":
        factor = max(factor, 1.0)  # the mechanism's own figure is the floor
    return Pooled(factor, sum(len(votes[v]) for v in counted), waiting, held)


def _held_at_one_host(
    kind: Kind, votes: dict[str, list[Evidence]], value: dict[str, float], hosted: list[str]
) -> tuple[dict[str, float], frozenset[int]]:
    """Rented hosts' safe votes beyond ONE_HOST_SAFE, held there unless SAFE_HOSTS hosts of MIN_OWNERS owners
    say so: one host raises its class's quotes by at most that much. The values, and the runs held."""
    limit = math.log(ONE_HOST_SAFE)
    far = [v for v in hosted if not promising(kind, value[v]) and abs(value[v]) > limit]
    owners = {e.owner for v in far for e in votes[v]}
    if not far or (len(far) >= SAFE_HOSTS and len(owners) >= MIN_OWNERS):
        return value, frozenset()
    out = dict(value)
    for v in far:
        out[v] = math.copysign(limit, value[v])
    return out, frozenset(e.index for v in far for e in votes[v])


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


Predictor = Callable[[Measurement], Predicted | tuple[Any, ...] | None]


@dataclass(frozen=True)
class Explained:
    """What build() made of each measurement: its key, log ratios and whether they count (for `calibrate
    show`: which runs moved which figure)."""

    key: Key | None  # None: the planner cannot predict its configuration (skipped)
    memory_log_ratio: float | None = None  # log(measured / physics), as claimed (pooled within bounds)
    speed_log_ratio: float | None = None
    memory_waiting: bool = False
    speed_waiting: bool = False
    memory_held: bool = False  # a slower or larger claim held at ONE_HOST_SAFE until a second host agrees
    speed_held: bool = False


def evidence(
    measurements: Sequence[Measurement], predict: Predictor
) -> tuple[dict[Key, dict[Kind, list[Evidence]]], list[Explained]]:
    """Each measurement's log ratios against the physics (within its bounds), grouped by key and figure."""
    grouped: dict[Key, dict[Kind, list[Evidence]]] = {}
    explained: list[Explained] = []
    for i, m in enumerate(measurements):
        found = predict(m)
        if found is None:
            explained.append(Explained(None))
            continue
        p = found if isinstance(found, Predicted) else Predicted(*found)
        key = (m.gpu, p.stack, p.method, size_class(p.parameters))
        ratios: dict[Kind, float] = {}  # as measured; the evidence is bounded
        if m.max_memory_reserved_gb and p.memory_gb:
            ratios["memory"] = math.log(m.max_memory_reserved_gb / p.memory_gb)
        if m.tokens_per_second and p.tokens_per_second:
            ratios["speed"] = math.log(m.tokens_per_second / p.tokens_per_second)
        for kind, r in ratios.items():
            item = Evidence(i, bounded(kind, r, p), m.voter(i), m.owner, m.trusted)
            grouped.setdefault(key, {}).setdefault(kind, []).append(item)
        explained.append(Explained(key, ratios.get("memory"), ratios.get("speed")))
    return grouped, explained


def build(measurements: Iterable[Measurement], predict: Predictor) -> Calibration:
    """Pool measurements into corrections. `predict(m)` returns the physics' figures for the measurement's
    configuration on its GPU (a Predicted, or its first five fields as a tuple), or None when it cannot."""
    return explain(list(measurements), predict)[0]


def explain(measurements: Sequence[Measurement], predict: Predictor) -> tuple[Calibration, list[Explained]]:
    """build(), and what it made of each measurement (which runs count, which wait for corroboration)."""
    grouped, explained = evidence(measurements, predict)
    out: dict[Key, Correction] = {}
    waiting: dict[Kind, set[int]] = {"memory": set(), "speed": set()}
    held: dict[Kind, set[int]] = {"memory": set(), "speed": set()}
    for key, kinds in grouped.items():
        mem, spd = pool("memory", kinds.get("memory", [])), pool("speed", kinds.get("speed", []))
        for kind, pooled in (("memory", mem), ("speed", spd)):
            waiting[kind] |= pooled.waiting
            held[kind] |= pooled.held
        out[key] = Correction(
            key,
            mem.factor,
            mem.runs,
            spd.factor,
            spd.runs,
            len(mem.waiting),
            len(spd.waiting),
            len(mem.held),
            len(spd.held),
        )
    explained = [
        Explained(
            e.key,
            e.memory_log_ratio,
            e.speed_log_ratio,
            i in waiting["memory"],
            i in waiting["speed"],
            i in held["memory"],
            i in held["speed"],
        )
        for i, e in enumerate(explained)
    ]
    skipped = sum(1 for e in explained if e.key is None)
    return Calibration(out, skipped), explained
