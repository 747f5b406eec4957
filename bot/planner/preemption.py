"""Checkpoint interval and expected time lost to preemptions (Young 1974, Daly 2006).

With preemptions arriving as a Poisson process of mean time between failures M, a checkpoint that
costs C and a restart that costs R, checkpointing every tau hours of work gives the expected wall
time for W hours of work (Daly's model, exact for exponential failures):

    E[T] = M * exp(R/M) * (exp((tau + C)/M) - 1) * W / tau

and the tau minimizing it is close to Young/Daly's sqrt(2*C*M). The functions take an array module
(`xp`: numpy for many offers, ScalarMath for one) so one formula serves both paths.
"""

from __future__ import annotations

import math
from typing import Any


class ScalarMath:
    """The few numpy functions the cost formulas use, for plain floats (no numpy import needed)."""

    sqrt = staticmethod(math.sqrt)
    floor = staticmethod(math.floor)
    exp = staticmethod(math.exp)
    expm1 = staticmethod(math.expm1)
    isfinite = staticmethod(math.isfinite)
    minimum = staticmethod(min)
    maximum = staticmethod(max)

    @staticmethod
    def where(cond: bool, a: float, b: float) -> float:
        return a if cond else b


def young_daly_interval_hours(checkpoint_hours: float, mtbf_hours: float) -> float:
    """The checkpoint interval that minimizes expected waste: sqrt(2 * C * MTBF)."""
    if not (checkpoint_hours > 0 and mtbf_hours > 0):
        raise ValueError("checkpoint cost and MTBF must be positive")
    return math.sqrt(2.0 * checkpoint_hours * mtbf_hours)


def expected_wall_hours(
    work: Any, interval: Any, checkpoint: Any, restart: Any, mtbf: Any, xp: Any = ScalarMath
):
    """Expected wall hours to finish `work` hours of computation (mtbf = inf: never preempted)."""
    tau = xp.maximum(xp.minimum(interval, work), 1e-9)
    finite = xp.isfinite(mtbf)
    m = xp.where(finite, mtbf, 1.0)
    exponent = xp.minimum((tau + checkpoint) / m, 700.0)
    preempted = m * xp.exp(xp.minimum(restart / m, 700.0)) * xp.expm1(exponent) * work / tau
    plain = work * (1.0 + checkpoint / tau)
    return xp.where(finite, preempted, plain)
