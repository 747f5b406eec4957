"""The published rows as cross-validation cases: memory with the one fitted memory coefficient, tokens/s with
the speed coefficients. Shared by bench/planner_crossval.py and tests/planner/test_crossval.py."""

from __future__ import annotations

from collections.abc import Sequence

from bot.planner.crossval import Case
from bot.planner.gpus import gpu
from bot.planner.memory import FITTED_MEMORY, MemoryCoefficients, estimate_memory
from bot.planner.models import resolve
from bot.planner.ranges import memory_classes, speed_classes
from bot.planner.request import EstimateRequest
from bot.planner.speed import FITTED, SpeedCoefficients, estimate_speed

try:  # imported as tests.planner.crossval_cases (pytest) or as a top-level module (bench)
    from .published import ROWS, Row, memory_rows, source_of
except ImportError:  # pragma: no cover - the bench puts tests/planner on sys.path
    from published import ROWS, Row, memory_rows, source_of  # type: ignore[no-redef]

SPEED_FIELDS = ("matmul_eff", "attn_eff", "ew_scale", "compiled_ew", "torchao_dequant_bytes")
SPEED_BOUNDS = ((0.3, 1.0), (0.15, 1.0), (0.5, 4.0), (0.05, 1.0), (2.5, 40.0))
# No memory coefficient is fitted since issue 29: FSDP's units in flight come from its code (memory.py).
MEMORY_FIELDS: tuple[str, ...] = ()
MEMORY_BOUNDS: tuple[tuple[float, float], ...] = ()


def speed_coef(x: Sequence[float]) -> SpeedCoefficients:
    return SpeedCoefficients(**dict(zip(SPEED_FIELDS, x, strict=True)))


def memory_coef(x: Sequence[float]) -> MemoryCoefficients:
    return MemoryCoefficients(**dict(zip(MEMORY_FIELDS, x, strict=True)))


def speed_x0() -> list[float]:
    return [getattr(FITTED, f) for f in SPEED_FIELDS]


def memory_x0() -> list[float]:
    return [getattr(FITTED_MEMORY, f) for f in MEMORY_FIELDS]


_RESOLVED: dict[str, tuple] = {}


def _resolved(row: Row):
    if row.id not in _RESOLVED:
        req = EstimateRequest(**row.request)
        _RESOLVED[row.id] = resolve(req.model)[0], req
    return _RESOLVED[row.id]


def memory_value(row: Row, coef: MemoryCoefficients = FITTED_MEMORY) -> float:
    """The planner's figure in the row's own convention (GB)."""
    arch, req = _resolved(row)
    m = estimate_memory(arch, req, coef=coef)
    if row.convention == "footprint":
        return (m.breakdown["weights"] + m.breakdown["cuda_context"]) / 1e9
    if row.convention == "torch":
        return m.torch_reserved_gb
    if row.convention == "allocated":
        return m.torch_reserved_gb - m.breakdown["allocator"] / 1e9
    return m.per_gpu_gb


def speed_value(row: Row, coef: SpeedCoefficients = FITTED) -> float:
    arch, req = _resolved(row)
    return estimate_speed(arch, req, gpu(row.gpu), coef=coef).tokens_per_second


def memory_cases(guidance: bool = False) -> list[Case]:
    out = []
    for row in memory_rows(guidance):
        out.append(
            Case(
                row.id,
                source_of(row.id),
                "memory",
                row.memory_gb,
                lambda x, row=row: memory_value(row, memory_coef(x)),
                memory_classes(_resolved(row)[1]),
            )
        )
    return out


def speed_cases() -> list[Case]:
    out = []
    for row in ROWS:
        if row.tokens_per_second is None:
            continue
        out.append(
            Case(
                row.id,
                source_of(row.id),
                "speed",
                row.tokens_per_second,
                lambda x, row=row: speed_value(row, speed_coef(x)),
                speed_classes(_resolved(row)[1]),
            )
        )
    return out
