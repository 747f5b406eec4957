"""Fitting the planner's few coefficients and checking them on sources they were not fitted on.

Pure and generic: a Case is one published figure (memory or tokens/s) with the source (paper, README table)
it came from and a function that predicts it for a given coefficient vector. `fit` minimizes a robust loss of
the log errors (soft-L1: one contradictory row cannot drag every coefficient) with a small Nelder-Mead;
`leave_one_source_out` refits without each source in turn and predicts that source with what the others
taught. The held-out errors are the figure that says how the planner does on tables it never saw; per class
of job, their prediction intervals are the estimate's ranges (bot/planner/ranges.py), and `nested_coverage`
checks how often a range's top holds when the ranges, too, were built without the row's source.

The published rows themselves live with the tests (tests/planner/published.py); the bench script and the
test build Cases from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    kind: str  # "memory" | "speed"
    measured: float
    predict: Callable[[Sequence[float]], float]  # coefficient vector -> predicted figure
    classes: tuple[str, ...] = ()  # the range classes the row belongs to (bot/planner/ranges.py)


@dataclass(frozen=True)
class Held:
    case: Case
    in_sample: float  # predicted with the coefficients fitted on every source
    held_out: float  # predicted with the coefficients fitted without the case's source

    @property
    def in_sample_error(self) -> float:
        return self.in_sample / self.case.measured - 1.0

    @property
    def held_out_error(self) -> float:
        return self.held_out / self.case.measured - 1.0


def nelder_mead(
    f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.3, iters: int = 300
) -> list[float]:
    """Minimize f from x0 (few dimensions, no derivatives); deterministic."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-10:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(t: float, worst: list[float] = worst, centroid: list[float] = centroid) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centroid, worst, strict=True)]

        reflected = toward(-1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = toward(-2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = toward(0.5)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]
                ]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def robust_loss(cases: Sequence[Case], x: Sequence[float], scale: float = 0.15) -> float:
    """Soft-L1 of the log errors: quadratic below `scale` (15%), linear beyond (outliers pull less)."""
    total = 0.0
    for case in cases:
        predicted = case.predict(x)
        if not predicted > 0:
            return math.inf
        r = math.log(predicted / case.measured) / scale
        total += 2.0 * (math.sqrt(1.0 + r * r) - 1.0)
    return total


def fit(
    cases: Sequence[Case],
    x0: Sequence[float],
    bounds: Sequence[tuple[float, float]],
    iters: int = 300,
) -> list[float]:
    """Coefficients (within bounds) minimizing the robust loss over `cases`; x0 with nothing to fit."""
    if not cases or not x0:
        return list(x0)

    def clamp(z: Sequence[float]) -> list[float]:
        return [min(hi, max(lo, math.exp(v))) for v, (lo, hi) in zip(z, bounds, strict=True)]

    best = nelder_mead(lambda z: robust_loss(cases, clamp(z)), [math.log(v) for v in x0], iters=iters)
    return clamp(best)


def leave_one_source_out(
    cases: Sequence[Case],
    x0: Sequence[float],
    bounds: Sequence[tuple[float, float]],
    iters: int = 300,
) -> tuple[list[Held], list[float]]:
    """(every case with its in-sample and held-out prediction, the coefficients fitted on all sources)."""
    everything = fit(cases, x0, bounds, iters)
    out: list[Held] = []
    for source in dict.fromkeys(c.source for c in cases):
        rest = [c for c in cases if c.source != source]
        coef = fit(rest, x0, bounds, iters)
        for case in cases:
            if case.source == source:
                out.append(Held(case, case.predict(everything), case.predict(coef)))
    return out, everything


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) without numpy."""
    s = sorted(values)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    median_abs: float
    max_abs: float
    p10_ratio: float  # measured / predicted
    p90_ratio: float


def summarize(errors: Sequence[float]) -> Summary:
    """errors are predicted/measured - 1; ratios reported as measured/predicted (what to multiply by)."""
    ratios = [1.0 / (1.0 + e) for e in errors]
    return Summary(
        n=len(errors),
        median_abs=median([abs(e) for e in errors]),
        max_abs=max((abs(e) for e in errors), default=math.nan),
        p10_ratio=quantile(ratios, 0.10),
        p90_ratio=quantile(ratios, 0.90),
    )


# ---- ranges from held-out errors, per class
# ------------------------------------------------------------------


MIN_TOP_ROWS = 3  # a class needs this many rows before its top may reach past the range's own q


def t_quantile(p: float, dof: float) -> float:
    """Student's t quantile (exact for 1 and 2 degrees of freedom, Cornish-Fisher beyond: within 0.3% of the
    tables from 3 on)."""
    if dof <= 1:
        return math.tan(math.pi * (p - 0.5))
    if dof <= 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
    )


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def prediction_range(
    ratios: Sequence[float],
    pooled: Sequence[float],
    q: float = 0.95,
    own_dof: bool = True,
    q_top: float | None = None,
) -> tuple[float, float]:
    """The (1-q, q) prediction interval of the next measured/predicted ratio of a class, from the held-out
    ratios of its rows: the class's own mean shift, a spread never narrower than every row's together, and
    Student's t with the class's own degrees of freedom (issue 29): how far the class's spread and shift can
    be trusted is set by the rows the class has, not by the rows of every class together, so a class of two
    rows gets a wide range (t = 6.3), one of four a moderately wide one (2.35), "all" the pooled one.
    own_dof=False keeps issue 21's rule (the pooled degrees of freedom unless the class's own spread is
    wider), which the speed ranges still use.

    ``q_top`` (issue 36): the top is the one-sided ``q_top`` bound instead, for a class of at least
    MIN_TOP_ROWS rows; a class of fewer keeps the ``q`` top (already wide: with one row, t(0.99, 1) = 31.8
    would promise nothing).

    On log ratios: mean_c +- t(q, n_c - 1) * s * sqrt(1 + 1/n_c), s = max(sd_c, sd_all)."""
    logs = [math.log(r) for r in ratios]
    every = [math.log(r) for r in pooled]
    _, sd_all = _mean_sd(every)
    mean_c, sd_c = _mean_sd(logs)
    n = len(logs)
    s = max(sd_c, sd_all) if n >= 3 else sd_all
    dof = max(1, n - 1)
    if not own_dof and not (n >= 3 and sd_c > sd_all):
        dof = len(every) - 1
    scale = s * math.sqrt(1 + 1 / n)
    top_q = q_top if q_top is not None and n >= MIN_TOP_ROWS else q
    return (
        math.exp(mean_c - t_quantile(q, dof) * scale),
        math.exp(mean_c + t_quantile(top_q, dof) * scale),
    )


def held_ratio(h: Held) -> float:
    """measured / held-out predicted: what to multiply the estimate by."""
    return h.case.measured / h.held_out


def class_ranges(
    held: Sequence[Held],
    classes: Iterable[str],
    q: float = 0.95,
    own_dof: bool = True,
    q_top: float | None = None,
) -> dict[str, tuple[float, float]]:
    """Per class ("all" = every row), the prediction range of measured/predicted from the held-out errors."""
    pooled = [held_ratio(h) for h in held]
    out = {"all": prediction_range(pooled, pooled, q, own_dof, q_top)}
    for name in classes:
        mine = [held_ratio(h) for h in held if name in h.case.classes]
        if mine:
            out[name] = prediction_range(mine, pooled, q, own_dof, q_top)
    return out


def ratio_for(ranges: dict[str, tuple[float, float]], classes: Iterable[str]) -> tuple[float, float]:
    """The range of a request in several classes: the widest of its classes' (and of "all")."""
    chosen = [ranges["all"]] + [ranges[c] for c in classes if c in ranges]
    return min(r[0] for r in chosen), max(r[1] for r in chosen)


@dataclass(frozen=True)
class Coverage:
    n: int
    under_top: int  # measured at or under the predicted top
    by_class: dict[str, tuple[int, int]]  # class -> (under top, rows)

    @property
    def share(self) -> float:
        return self.under_top / self.n if self.n else math.nan


def nested_coverage(
    held: Sequence[Held],
    classes: Sequence[str],
    q: float = 0.95,
    own_dof: bool = True,
    q_top: float | None = None,
) -> Coverage:
    """How often the measured figure is under the top of its range when the ranges, too, were built without
    the row's source: for each source, class ranges from the other sources' held-out errors, checked on it."""
    under, by_class = 0, {c: [0, 0] for c in ("all", *classes)}
    for source in dict.fromkeys(h.case.source for h in held):
        rest = [h for h in held if h.case.source != source]
        if not rest:
            continue
        ranges = class_ranges(rest, classes, q, own_dof, q_top)
        for h in held:
            if h.case.source != source:
                continue
            top = ratio_for(ranges, h.case.classes)[1]
            ok = held_ratio(h) <= top
            under += ok
            for c in ("all", *h.case.classes):
                if c in by_class:
                    by_class[c][0] += ok
                    by_class[c][1] += 1
    n = sum(1 for h in held if any(x.case.source != h.case.source for x in held))
    return Coverage(n, under, {c: (v[0], v[1]) for c, v in by_class.items() if v[1]})
