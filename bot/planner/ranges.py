"""Ranges around the point estimates: how far off the planner was on published sources it was not fitted on,
per class of job where the classes differ, never the in-sample spread.

bench/planner_crossval.py holds each published source out in turn (the whole source: every row of a README
table, a paper, a benchmark), refits the few coefficients on the others and predicts the held-out rows. Per
class the held-out measured/predicted ratios give a 90% prediction interval
(bot/planner/crossval.prediction_range: the class's own mean shift, a spread never narrower than every row's,
and Student's t with the class's own degrees of freedom, so a class the published rows hold little of gets a
wide range). Memory classes, one per axis of a job (issue 29): GPUs and sharding (multi-gpu; cpu-offload),
method (full, lora, quantized), sequence length (short below 1,024 tokens, long from 4,096) and packing
(unpacked: batches of varying length). Speed: several GPUs, quantized, short sequences. A job in several
classes gets the widest of them and of "all". Whether an offer fits is judged on the top of its memory range
(the 95% one-sided bound), with the safety margin on top. The figures below are what that computation gives
(tests/planner/test_crossval.py recomputes them and fails when they drift); bench/planner_crossval.py also
checks how often the top holds when the ranges, too, are built without the row's source.
"""

from __future__ import annotations

from bot.planner.crossval import ratio_for
from bot.planner.request import EstimateRequest

Q = 0.95  # the top of a range is the one-sided 95% prediction bound; the bottom the 5% one
LONG_SEQUENCE = 4096  # memory class "long": tokens per sequence from here on (the loss path grows with them)
SHORT_SEQUENCE = 1024  # speed class "short": fixed per-step costs weigh most up to here
MEMORY_CLASSES = ("multi-gpu", "cpu-offload", "full", "lora", "quantized", "short", "long", "unpacked")
SPEED_CLASSES = ("multi-gpu", "quantized", "short")
SPEED_OWN_DOF = False  # speed classes keep issue 21's pooled degrees of freedom (crossval.prediction_range)

# measured / predicted, (5%, 95%) prediction bounds from held-out errors (bench/planner_crossval.py)
MEMORY_RANGES: dict[str, tuple[float, float]] = {
    "all": (0.902, 1.164),
    "multi-gpu": (0.794, 1.177),
    "cpu-offload": (0.545, 2.082),
    "full": (0.890, 1.170),
    "lora": (0.891, 1.186),
    "quantized": (0.866, 1.211),
    "short": (0.879, 1.187),
    "long": (0.900, 1.179),
    "unpacked": (0.875, 1.199),
}
SPEED_RANGES: dict[str, tuple[float, float]] = {
    "all": (0.656, 1.403),
    "multi-gpu": (0.664, 1.639),
    "quantized": (0.695, 1.629),
    "short": (0.481, 1.188),
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


def speed_range(
    tokens_per_second: float, ratio: tuple[float, float] = SPEED_RANGES["all"]
) -> tuple[float, float]:
    return tokens_per_second * ratio[0], tokens_per_second * ratio[1]


def hours_range(hours: float, ratio: tuple[float, float] = SPEED_RANGES["all"]) -> tuple[float, float]:
    """Compute time moves inversely with speed: the fast end of the speed range is the short end here."""
    return hours / ratio[1], hours / ratio[0]
