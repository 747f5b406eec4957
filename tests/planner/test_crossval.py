"""Leave-one-source-out cross-validation: the planner on published sources it was not fitted on.

The same machinery as bench/planner_crossval.py (which prints every row). Also: the coefficients and the range
ratios written in the code are the ones this fit produces (nobody tunes them by hand), and the fitting
machinery itself recovers a known world.
"""

from __future__ import annotations

import math

import pytest

from bot.planner import ranges
from bot.planner.crossval import (
    Case,
    class_ranges,
    fit,
    held_ratio,
    leave_one_source_out,
    nested_coverage,
    prediction_range,
    quantile,
    ratio_for,
    summarize,
    t_quantile,
)
from bot.planner.gpus import gpu
from bot.planner.models import resolve
from bot.planner.request import EstimateRequest
from bot.planner.speed import estimate_speed

from .crossval_cases import (
    MEMORY_BOUNDS,
    SPEED_BOUNDS,
    memory_cases,
    memory_x0,
    speed_cases,
    speed_x0,
)


@pytest.fixture(scope="module")
def speed_cv():
    return leave_one_source_out(speed_cases(), speed_x0(), SPEED_BOUNDS)


@pytest.fixture(scope="module")
def memory_cv():
    return leave_one_source_out(memory_cases(), memory_x0(), MEMORY_BOUNDS)


def test_held_out_memory_median_within_8_percent_and_max_within_25(memory_cv) -> None:
    held, _ = memory_cv
    s = summarize([h.held_out_error for h in held])
    assert s.n >= 30
    assert s.median_abs <= 0.08, s
    assert s.max_abs <= 0.25, s


def test_held_out_tokens_per_second_median_within_20_percent(speed_cv) -> None:
    held, _ = speed_cv
    s = summarize([h.held_out_error for h in held])
    assert s.n >= 15 and len({h.case.source for h in held}) >= 3
    assert s.median_abs <= 0.20, s


def test_the_code_uses_the_coefficients_fitted_on_every_source(speed_cv, memory_cv) -> None:
    _, speed = speed_cv
    _, memory = memory_cv
    assert speed == pytest.approx(speed_x0(), rel=0.02)
    assert memory == pytest.approx(memory_x0(), rel=0.02)


def test_the_ranges_are_the_held_out_error_spread_per_class(speed_cv, memory_cv) -> None:
    for (held, _), classes, written, own_dof, q_top in (
        (memory_cv, ranges.MEMORY_CLASSES, ranges.MEMORY_RANGES, True, ranges.MEMORY_TOP_Q),
        (speed_cv, ranges.SPEED_CLASSES, ranges.SPEED_RANGES, ranges.SPEED_OWN_DOF, None),
    ):
        fresh = class_ranges(held, classes, ranges.Q, own_dof, q_top)
        assert fresh.keys() == written.keys()
        for name, bounds in fresh.items():
            assert bounds == pytest.approx(written[name], abs=0.01), name
            assert written[name][0] < 1.0 < written[name][1]


def test_the_top_of_the_memory_range_holds_on_sources_it_was_not_built_on(memory_cv) -> None:
    """Issue 21's target on the published rows: with the coefficients and the ranges both built without a
    source, that source's measured peak is under the top of its range for at least 95% of the rows."""
    held, _ = memory_cv
    cover = nested_coverage(held, ranges.MEMORY_CLASSES, ranges.Q, q_top=ranges.MEMORY_TOP_Q)
    assert cover.n == len(held) and cover.share >= 0.95, cover
    assert summarize([h.held_out_error for h in held]).median_abs <= 0.10


def test_the_memory_top_holds_the_coverage_the_card_states_with_each_source_left_out(memory_cv) -> None:
    """Issue 36, item 8: the top is built for a stated coverage and holds it with each source left out whole
    (the coefficients and the ranges both built without it); the card's figure is this count, recomputed."""
    held, _ = memory_cv
    cover = nested_coverage(held, ranges.MEMORY_CLASSES, ranges.Q, q_top=ranges.MEMORY_TOP_Q)
    assert (cover.under_top, cover.n) == ranges.MEMORY_TOP_HELD
    assert cover.share >= ranges.TOP_COVERAGE >= 0.97, cover
    assert ranges.top_coverage() == f"covers {int(100 * cover.share)}% of measured runs"
    for name, (under, rows) in cover.by_class.items():  # no class falls far behind: one miss at most
        assert under >= rows - 1, (name, under, rows)


def test_the_memory_top_holds_on_published_figures_the_ranges_were_never_built_on(memory_cv) -> None:
    """Issue 36, item 8: on published figures the project had not seen, one row in four measured above the top
    of 9a0c9c1 (the one-sided 95% bound). Unsloth's minimum-VRAM table is such a source here: the ranges are
    built without it (bench/planner_crossval.py reports it apart); the code's tops hold for 11 of its 12 rows
    (9 on 9a0c9c1)."""
    guide, _ = leave_one_source_out(memory_cases(guidance=True), memory_x0(), MEMORY_BOUNDS)
    seen = {h.case.id for h in memory_cv[0]}
    unseen = [h for h in guide if h.case.id not in seen]
    assert len(unseen) == 12
    under = [held_ratio(h) <= ratio_for(ranges.MEMORY_RANGES, h.case.classes)[1] for h in unseen]
    assert sum(under) / len(under) >= 0.9, [h.case.id for h, ok in zip(unseen, under, strict=True) if not ok]


def test_a_class_of_few_rows_keeps_its_wide_top_when_the_top_reaches_further() -> None:
    """The 99% top asks more of a class's rows than one or two can say (t(0.99, 1) = 31.8): such a class keeps
    its 95% top, itself wide; from three rows on the top is the 99% bound."""
    pooled = [0.9, 0.95, 1.0, 1.02, 1.05, 1.1, 0.97, 1.01, 0.99, 1.03, 0.96, 1.04]
    assert prediction_range([1.05], pooled, q_top=0.99) == prediction_range([1.05], pooled)
    lo, hi = prediction_range(pooled, pooled)
    lo99, hi99 = prediction_range(pooled, pooled, q_top=0.99)
    assert lo99 == lo and hi99 > hi


def test_a_class_with_few_rows_gets_a_wider_range_than_the_pooled_spread() -> None:
    pooled = [0.9, 0.95, 1.0, 1.02, 1.05, 1.1, 0.97, 1.01]
    lo, hi = prediction_range(pooled, pooled)
    few_lo, few_hi = prediction_range([1.0, 1.05], pooled)  # two rows: the mean itself is uncertain
    assert few_hi - few_lo > hi - lo
    biased_lo, biased_hi = prediction_range([1.2, 1.25, 1.3], pooled)  # a class the planner under-predicts
    assert biased_lo > lo and biased_hi > hi > 1.1
    assert t_quantile(0.95, 1) == pytest.approx(6.314, abs=1e-3)
    assert t_quantile(0.95, 3) == pytest.approx(2.353, abs=0.01)
    assert t_quantile(0.95, 30) == pytest.approx(1.697, abs=0.002)


def test_fit_recovers_a_known_world_and_loso_exposes_a_source_it_cannot_explain() -> None:
    """y = a * x^b on three sources; the third is 30% off in a way no coefficient explains."""
    truth = (2.0, 0.5)
    cases = []
    for source, bias in (("s1", 1.0), ("s2", 1.0), ("s3", 1.3)):
        for x in (1.0, 4.0, 9.0, 16.0):
            cases.append(
                Case(
                    f"{source}-{x}",
                    source,
                    "speed",
                    bias * truth[0] * x ** truth[1],
                    lambda c, x=x: c[0] * x ** c[1],
                )
            )
    coef = fit([c for c in cases if c.source != "s3"], [1.0, 1.0], [(0.1, 10.0), (0.1, 3.0)])
    assert coef == pytest.approx(truth, rel=1e-3)
    held, _ = leave_one_source_out(cases, [1.0, 1.0], [(0.1, 10.0), (0.1, 3.0)])
    s3 = [h for h in held if h.case.source == "s3"]
    assert all(h.held_out_error == pytest.approx(1 / 1.3 - 1, abs=0.01) for h in s3)
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and math.isnan(quantile([], 0.5))


def _mfu(model: str, method: str, seq: int, gpus: int = 1) -> float:
    arch, _ = resolve(model)
    req = EstimateRequest(model=model, method=method, seq_len=seq, attn="flash", gpus=gpus)
    return estimate_speed(arch, req, gpu("a100-80gb")).mfu


def test_utilization_rises_with_tokens_per_micro_step_and_model_size() -> None:
    """A few percent at 256 tokens on a ~2B model at micro-batch 1 (the host's dispatch rules it: the runner's
    1B LoRA step on an H200 measured MFU 0.04 at 1,024 tokens, bench/gpu_check/README.md), 0.6-0.8 at 8-32k
    tokens on 7-70B (flash)."""
    small_short = _mfu("Qwen/Qwen2.5-1.5B", "lora", 256)
    assert 0.02 <= small_short <= 0.2
    for method in ("lora", "qlora", "full"):
        curve = [_mfu("meta-llama/Llama-3.1-8B", method, s) for s in (256, 1024, 4096, 32768)]
        assert curve == sorted(curve), (method, curve)
    assert _mfu("Qwen/Qwen2.5-1.5B", "lora", 4096) < _mfu("meta-llama/Llama-3.1-8B", "lora", 4096)
    assert _mfu("meta-llama/Llama-3.1-8B", "lora", 4096) < _mfu("Qwen/Qwen2.5-72B", "lora", 4096, gpus=4)
    for model, gpus in (("meta-llama/Llama-3.1-8B", 1), ("Qwen/Qwen2.5-72B", 4)):
        assert 0.5 <= _mfu(model, "full", 32768, gpus) <= 0.85
        assert 0.5 <= _mfu(model, "lora", 32768, gpus) <= 0.85


def test_memory_classes_follow_every_axis_of_a_job() -> None:
    """Issue 29: GPUs and sharding, method, sequence length and packing each name a class, so a job is judged
    by the held-out errors of every kind of row it resembles (the widest range wins)."""
    req = EstimateRequest(
        model="meta-llama/Llama-3.1-8B", method="qlora", seq_len=8192, packing=False, gpus=2
    )
    assert ranges.memory_classes(req) == ("multi-gpu", "quantized", "long", "unpacked")
    full = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="full", seq_len=512)
    assert ranges.memory_classes(full) == ("full", "short")
    offload = EstimateRequest(
        model="meta-llama/Llama-2-70b-hf", method="qlora", gpus=2, fsdp_cpu_offload=True
    )
    assert "cpu-offload" in ranges.memory_classes(offload)
    assert set(ranges.MEMORY_RANGES) == {"all", *ranges.MEMORY_CLASSES}
    lo, hi = ranges.memory_ratio(req)
    assert hi == max(ranges.MEMORY_RANGES[c][1] for c in ("all", *ranges.memory_classes(req)))


def test_a_class_of_few_rows_is_judged_by_its_own_degrees_of_freedom() -> None:
    """Two rows that agree with the pooled spread still leave the class's shift uncertain: Student's t with
    one degree of freedom (6.3), not the pooled rows' (issue 21's rule gave such a class nearly the pooled
    range)."""
    pooled = [0.9, 0.95, 1.0, 1.02, 1.05, 1.1, 0.97, 1.01, 0.99, 1.03, 0.96, 1.04]
    own_lo, own_hi = prediction_range([1.0, 1.02], pooled)
    old_lo, old_hi = prediction_range([1.0, 1.02], pooled, own_dof=False)
    assert own_hi / own_lo > (old_hi / old_lo) ** 2  # far wider
    many = pooled * 3
    assert prediction_range(many, many) == pytest.approx(
        prediction_range(many, many, own_dof=False), rel=0.01
    )
