"""Ranges around the point estimates: the spread of the planner's errors on sources it was not fitted on.

bench/planner_crossval.py holds each published source out in turn, refits the few coefficients on the others
and predicts the held-out rows; the 10th and 90th percentiles of measured/predicted over all held-out rows are
these ratios (tests/planner/test_crossval.py recomputes them and fails when they drift from what is written
here). A range is the point estimate times them: on a table the planner never saw, about four rows in five
fall inside. Whether an offer fits is judged on the upper end of the memory range, with the safety margin on
top.
"""

from __future__ import annotations

MEMORY_RATIO = (0.900, 1.112)  # p10, p90 of measured / predicted peak memory, held-out sources
SPEED_RATIO = (0.851, 1.180)  # p10, p90 of measured / predicted tokens per second, held-out sources


def memory_range(gb: float) -> tuple[float, float]:
    return gb * MEMORY_RATIO[0], gb * MEMORY_RATIO[1]


def speed_range(tokens_per_second: float) -> tuple[float, float]:
    return tokens_per_second * SPEED_RATIO[0], tokens_per_second * SPEED_RATIO[1]


def hours_range(hours: float) -> tuple[float, float]:
    """Compute time moves inversely with speed: the fast end of the speed range is the short end here."""
    return hours / SPEED_RATIO[1], hours / SPEED_RATIO[0]
