"""Ranges around the point estimates: how far off the planner was on published sources it was not fitted on,
per class of job where the classes differ, never the in-sample spread.

bench/planner_crossval.py holds each published source out in turn (the whole source: every row of a README
table, a paper, a benchmark), refits the few coefficients on the others and predicts the held-out rows. Per
class the held-out measured/predicted ratios give a prediction interval (crossval.prediction_range: the
class's own mean shift, a spread never narrower than every row's, and Student's t with the class's own
degrees of freedom, so a class the published rows hold little of gets a wide range). Memory classes, one per
axis of a job (issue 29): GPUs and sharding (multi-gpu; cpu-offload), method (full, lora, quantized),
sequence length (short below 1,024 tokens, long from 4,096) and packing (unpacked: batches of varying
length). Speed: several GPUs, quantized, short sequences. A job in several classes gets the widest of them
and of "all".

The top of a memory range is a promise (issue 36): whether an offer fits is judged on it, with the safety
margin on top, and the card says how often it holds. It is built for MEMORY_TOP_Q (the one-sided 99% bound, a
class of fewer than three rows keeps its wide 95% one) and held with each source left out whole: with the
ranges themselves built without a source, that source's measured peaks are at or under their top for
MEMORY_TOP_HELD of the published rows, at least TOP_COVERAGE (the share the card states). The bottom stays the
5% bound. The figures below are what that computation gives (tests/planner/test_crossval.py recomputes them
and fails when they drift).
"""

from __future__ import annotations

from bot.planner.crossval import ratio_for
from bot.planner.request import EstimateRequest

Q = 0.95  # the bottom of a range is the one-sided 5% prediction bound; a speed range's top the 95% one
MEMORY_TOP_Q = 0.99  # the top of a memory range: the one-sided 99% bound (classes of 3 rows and more)
TOP_COVERAGE = 0.97  # the share of runs the memory top holds, each source left out whole (the card says it)
# Published rows at or under their memory top with the coefficients and the ranges built without their source
# (crossval.nested_coverage; bench/planner_crossval.py prints them by class): (under the top, rows).
MEMORY_TOP_HELD = (46, 47)
LONG_SEQUENCE = 4096  # memory class "long": tokens per sequence from here on (the loss path grows with them)
SHORT_SEQUENCE = 1024  # speed class "short": fixed per-step costs weigh most up to here
MEMORY_CLASSES = ("multi-gpu", "cpu-offload", "full", "lora", "quantized", "short", "long", "unpacked")
SPEED_CLASSES = ("multi-gpu", "quantized", "short")
SPEED_OWN_DOF = False  # speed classes keep issue 21's pooled degrees of freedom (crossval.prediction_range)

# measured / predicted, (5%, MEMORY_TOP_Q) prediction bounds from held-out errors (bench/planner_crossval.py)
MEMORY_RANGES: dict[str, tuple[float, float]] = {
    "all": (0.902, 1.230),
    "multi-gpu": (0.794, 1.405),
    "cpu-offload": (0.545, 2.082),
    "full": (0.890, 1.251),
    "lora": (0.891, 1.270),
    "quantized": (0.866, 1.315),
    "short": (0.879, 1.278),
    "long": (0.900, 1.257),
    "unpacked": (0.875, 1.309),
}
# measured / predicted, (5%, 95%) prediction bounds
SPEED_RANGES: dict[str, tuple[float, float]] = {
    "all": (0.663, 1.389),
    "multi-gpu": (0.665, 1.602),
    "quantized": (0.698, 1.598),
    "short": (0.493, 1.188),
}


def memory_classes(req: EstimateRequest, gpus: int | None = None) -> tuple[str, ...]:
    """The memory classes of a job: one per axis (GPUs and sharding, method, sequence length, packing)."""
    n = gpus or req.gpus
    out = ["multi-gpu"] if n > 1 else []
    if n > 1 and req.fsdp_cpu_offload:
        out.append("cpu-offload")
    out.append({"full": "full", "lora": "lora", "qlora": "quantized"}[req.method])
    if req.seq_len < SHORT_SEQUENCE:
        out.append("short")
    elif req.seq_len >= LONG_SEQUENCE:
        out.append("long")
    if not req.packing:
        out.append("unpacked")
    return tuple(out)


def speed_classes(req: EstimateRequest, gpus: int | None = None) -> tuple[str, ...]:
    n = gpus or req.gpus
    out = ["multi-gpu"] if n > 1 else []
    if req.method == "qlora":
        out.append("quantized")
    if req.seq_len <= SHORT_SEQUENCE:
        out.append("short")
    return tuple(out)


def memory_ratio(req: EstimateRequest, gpus: int | None = None) -> tuple[float, float]:
    """(low, high) multipliers of the memory estimate for this request; offers must fit the high one."""
    return ratio_for(MEMORY_RANGES, memory_classes(req, gpus))


def speed_ratio(req: EstimateRequest, gpus: int | None = None) -> tuple[float, float]:
    return ratio_for(SPEED_RANGES, speed_classes(req, gpus))


def memory_range(gb: float, ratio: tuple[float, float] = MEMORY_RANGES["all"]) -> tuple[float, float]:
    return gb * ratio[0], gb * ratio[1]


def top_coverage() -> str:
    """What the card says of the memory top: the share of published runs held under it, each source left out
    whole, rounded down ("covers 97% of measured runs")."""
    held, rows = MEMORY_TOP_HELD
    return f"covers {100 * held // rows}% of measured runs"


def speed_range(
    tokens_per_second: float, ratio: tuple[float, float] = SPEED_RANGES["all"]
) -> tuple[float, float]:
    return tokens_per_second * ratio[0], tokens_per_second * ratio[1]


def hours_range(hours: float, ratio: tuple[float, float] = SPEED_RANGES["all"]) -> tuple[float, float]:
    """Compute time moves inversely with speed: the fast end of the speed range is the short end here."""
    return hours / ratio[1], hours / ratio[0]
