"""PlateauDetector: stops on a flat loss, never on a steadily falling one, and survives a resume exactly."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.contract.spec import PlateauSpec
from runner.plateau import PlateauDetector

specs = st.builds(
    PlateauSpec,
    patience=st.integers(1, 6),
    min_delta=st.floats(0.0, 0.5),
    ema=st.floats(0.0, 0.95),
    every_steps=st.integers(1, 8),
    warmup_steps=st.integers(0, 20),
)


def first_stop(detector: PlateauDetector, losses: list[float], first_step: int = 1) -> int | None:
    for step, loss in enumerate(losses, start=first_step):
        if detector.update(step, loss):
            return step
    return None


@settings(max_examples=150, deadline=None)
@given(
    spec=specs, start=st.floats(-5.0, 50.0), extra=st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=300)
)
def test_a_loss_falling_by_more_than_min_delta_each_step_never_stops(spec, start, extra):
    losses, loss = [], start
    for step_extra in extra:
        losses.append(loss)
        loss -= spec.min_delta * 1.001 + step_extra
    assert first_stop(PlateauDetector(spec), losses) is None


@settings(max_examples=150, deadline=None)
@given(spec=specs, value=st.floats(-5.0, 50.0))
def test_a_constant_loss_stops_after_warmup_plus_patience_evaluations(spec, value):
    detector = PlateauDetector(spec)
    baseline = max(spec.warmup_steps, 1)  # steps start at 1
    expected = baseline + detector.effective_patience * spec.every_steps
    assert first_stop(detector, [value] * (expected + 50)) == expected
    assert detector.update(expected + 51, value - 100.0)  # a stopped detector stays stopped


def test_default_spec_uses_the_configured_patience():
    detector = PlateauDetector(PlateauSpec(patience=3, every_steps=10, warmup_steps=5))
    assert detector.effective_patience == 3
    assert first_stop(detector, [2.0] * 100) == 5 + 3 * 10


def test_patience_covers_the_smoothing_lag():
    # ema 0.99 needs ~100 steps to move; 2 evaluations of 5 steps would stop a run that is still learning
    spec = PlateauSpec(patience=2, every_steps=5, ema=0.99, min_delta=0.01)
    detector = PlateauDetector(spec)
    assert detector.effective_patience == 20
    assert first_stop(detector, [10.0 - 0.011 * i for i in range(500)]) is None


def test_improvement_then_plateau_stops_and_a_noisy_fall_does_not():
    spec = PlateauSpec(patience=3, every_steps=10, ema=0.9, min_delta=0.01, warmup_steps=10)
    falling = [3.0 * math.exp(-i / 100) + 0.05 * (-1) ** i for i in range(300)]
    assert first_stop(PlateauDetector(spec), falling) is None
    then_flat = falling + [falling[-1]] * 200
    stop = first_stop(PlateauDetector(spec), then_flat)
    assert stop is not None and 300 < stop < 400


def test_nan_losses_do_not_poison_the_average_and_never_count_as_improvement():
    spec = PlateauSpec(patience=2, every_steps=1, ema=0.0, min_delta=0.0, warmup_steps=1)
    detector = PlateauDetector(spec)
    assert not detector.update(1, 5.0)
    assert not detector.update(2, float("nan"))  # no improvement: 1 of 2
    assert detector.smoothed == 5.0
    assert not detector.update(3, 4.0)  # a real improvement resets the count
    assert not detector.update(4, float("inf"))
    assert detector.update(5, float("nan"))  # two evaluations in a row without a finite improvement
    assert detector.nonfinite == 3 and detector.smoothed == 4.0


def test_a_run_that_diverges_from_the_start_still_stops():
    detector = PlateauDetector(PlateauSpec(patience=2, every_steps=5, ema=0.5))
    assert first_stop(detector, [float("nan")] * 50) == 1 + 2 * 5


def test_disabled_never_stops():
    assert (
        first_stop(PlateauDetector(PlateauSpec(enabled=False, patience=1, every_steps=1)), [1.0] * 50) is None
    )


@settings(max_examples=100, deadline=None)
@given(
    spec=specs,
    losses=st.lists(
        st.one_of(st.floats(-10, 10), st.sampled_from([float("nan"), float("inf")])), min_size=2, max_size=150
    ),
    data=st.data(),
)
def test_a_resume_through_json_makes_the_same_decisions(spec, losses, data):
    cut = data.draw(st.integers(1, len(losses) - 1))
    whole = PlateauDetector(spec)
    expected = [whole.update(step, loss) for step, loss in enumerate(losses, start=1)]
    before = PlateauDetector(spec)
    got = [before.update(step, loss) for step, loss in enumerate(losses[:cut], start=1)]
    after = PlateauDetector(spec)
    after.load_state_dict(json.loads(json.dumps(before.state_dict(), allow_nan=False)))
    got += [after.update(step, loss) for step, loss in enumerate(losses[cut:], start=cut + 1)]
    assert got == expected
    assert after.state_dict() == whole.state_dict()


def test_eval_loss_fed_every_few_steps_is_evaluated_each_time():
    spec = PlateauSpec(patience=2, every_steps=10, ema=0.0, min_delta=0.01)
    detector = PlateauDetector(spec)
    decisions = [detector.update(step, 1.0) for step in (10, 20, 30, 40)]
    assert decisions == [False, False, True, True]


def issue_curve(seed: int = 1, steps: int = 1000, flat_after: int | None = None) -> list[float]:
    """The curve from issue 10: a fast drop, then a slow decline, with noise of 0.08 on every step.

    With seed 1 the detector's old defaults (patience 5, ema 0.9, every 10 steps, no warmup) stopped it
    at step 161 of 1000 while it was still learning.
    """
    import random

    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        t = step if flat_after is None else min(step, flat_after)
        out.append(1.2 + 2.0 * math.exp(-t / 20) + 0.4 * (1 - t / steps) + rng.gauss(0.0, 0.08))
    return out


def test_the_old_defaults_stopped_the_issue_curve_at_step_161():
    old = PlateauSpec(patience=5, min_delta=0.01, ema=0.9, every_steps=10, warmup_steps=0)
    assert first_stop(PlateauDetector(old), issue_curve()) == 161


def test_the_default_never_stops_a_normal_noisy_curve():
    for seed in range(40):
        detector = PlateauDetector(PlateauSpec().resolved(1000))
        assert first_stop(detector, issue_curve(seed)) is None, seed


def test_the_default_still_stops_a_curve_that_went_flat():
    # Learning ends at step 300 of 1000: the default stops within the following 60% of the run.
    stops = [
        first_stop(PlateauDetector(PlateauSpec().resolved(1000)), issue_curve(s, flat_after=300))
        for s in range(10)
    ]
    assert all(s is not None and 400 < s < 900 for s in stops), stops


def test_automatic_schedule_scales_with_the_run():
    spec = PlateauSpec().resolved(1000)
    assert (spec.every_steps, spec.warmup_steps, spec.patience) == (20, 100, 10)
    assert PlateauSpec().resolved(60).every_steps == 10
    assert PlateauSpec(every_steps=3, warmup_steps=0).resolved(1000).every_steps == 3
