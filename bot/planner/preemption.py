"""Checkpoint interval and expected time lost to preemptions (Young 1974, Daly 2006).

With preemptions arriving as a Poisson process of mean time between failures M, a checkpoint that
costs C and a restart that costs R, checkpointing every tau hours of work gives the expected wall
time for W hours of work (Daly's first-order-exact model):

    E[T] = M * exp(R/M) * (exp((tau + C)/M) - 1) * W / tau

and the tau minimizing it is close to Young/Daly's sqrt(2*C*M).
"""

from __future__ import annotations

import math

import numpy as np


def young_daly_interval_hours(checkpoint_hours: float, mtbf_hours: float) -> float:
    """The checkpoint interval that minimizes expected waste: sqrt(2 * C * MTBF)."""
    if checkpoint_hours <= 0 or mtbf_hours <= 0:
        raise ValueError("checkpoint cost and MTBF must be positive")
    return math.sqrt(2.0 * checkpoint_hours * mtbf_hours)


def expected_wall_hours(work_hours, interval_hours, checkpoint_hours, restart_hours, mtbf_hours):
    """Expected wall time to finish `work_hours` (scalars or numpy arrays; inf MTBF = never preempted)."""
    w = np.asarray(work_hours, dtype=float)
    tau = np.minimum(np.asarray(interval_hours, dtype=float), np.maximum(w, 1e-9))
    c = np.asarray(checkpoint_hours, dtype=float)
    r = np.asarray(restart_hours, dtype=float)
    m = np.asarray(mtbf_hours, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        finite = np.isfinite(m) & (m > 0)
        m_safe = np.where(finite, m, 1.0)
        preempted = m_safe * np.exp(r / m_safe) * np.expm1((tau + c) / m_safe) * w / tau
        plain = w * (1.0 + c / tau)
        out = np.where(finite, preempted, plain)
    return out
