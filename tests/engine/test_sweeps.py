"""The sweep's arithmetic, pure: stages of successive halving, the steps they end at, the worst case the
caps can add up to (never more than max_cost), the expected cost, and who goes on."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

from bot.engine.control.sweeps import (
    MARGIN,
    RunCost,
    boundary_seconds,
    configurations,
    expected_cost,
    ranked,
    stage_steps,
    survivors,
    worst_case,
)


def test_configurations_are_the_product_of_the_values() -> None:
    configs = configurations({"learning_rate": [1e-4, 2e-4, 4e-4], "lora_r": [8, 16]})
    assert len(configs) == 6 and configs[0] == {"learning_rate": 1e-4, "lora_r": 8}
    assert configs[-1] == {"learning_rate": 4e-4, "lora_r": 16}


@pytest.mark.parametrize(
    ("n", "alive"), [(1, [1]), (2, [2, 1]), (4, [4, 2, 1]), (6, [6, 3, 2, 1]), (8, [8, 4, 2, 1])]
)
def test_successive_halving_keeps_the_better_half_each_stage(n: int, alive: list[int]) -> None:
    assert survivors(n) == alive


def test_stages_end_at_every_x_2_to_the_k_then_the_full_run() -> None:
    assert stage_steps(32, 3) == [8, 16, 32]
    assert stage_steps(1000, 4) == [125, 250, 500, 1000]
    assert stage_steps(30, 3) == [7, 14, 30]  # every = 30 // 4: evaluations land on each stage's step
    assert stage_steps(8, 4) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="3 steps are too few for 4 stages: at least 8"):
        stage_steps(3, 4)


def test_ranked_puts_the_lowest_eval_loss_first_and_missing_ones_last() -> None:
    assert ranked({0: 2.5, 1: None, 2: 1.9, 3: 2.5}) == [2, 0, 3, 1]


def _costs(rng: random.Random, n: int, total_steps: int = 32) -> list[RunCost]:
    steps = stage_steps(total_steps, len(survivors(n)))
    return [RunCost.of(rng.uniform(0.2, 3.0), rng.uniform(0.5, 50.0), steps) for _ in range(n)]


def test_no_order_of_promotions_reserves_more_than_the_worst_case() -> None:
    """Whichever runs are promoted at each stage, first-stage caps of all plus the promoted runs' increments
    never exceed worst_case: scaled to max_cost less the margin, the caps can never add up past max_cost."""
    rng = random.Random(7)
    for n in (2, 3, 4, 5, 6):
        costs = _costs(rng, n)
        alive = survivors(n)
        worst = worst_case(costs, alive)
        max_cost = worst / (1 - MARGIN) * rng.uniform(1.0, 3.0)
        scale = max_cost * (1 - MARGIN) / worst
        for order in itertools.permutations(range(n)):
            reserved = sum(scale * c.need(0) for c in costs)
            promoted = list(order)
            for k in range(1, len(alive)):
                promoted = promoted[: alive[k]]
                reserved += sum(scale * (costs[i].need(k) - costs[i].need(k - 1)) for i in promoted)
                assert reserved <= max_cost * (1 - MARGIN) + 1e-9


def test_expected_cost_is_below_the_worst_case_and_above_one_run() -> None:
    costs = [RunCost(fixed=0.1, per_step=0.01, steps=[8, 16, 32]) for _ in range(4)]
    alive = survivors(4)
    one_run = costs[0].fixed + costs[0].per_step * 32
    expected = expected_cost(costs, alive)
    assert one_run < expected < worst_case(costs, alive)
    # 4 runs to step 8, 2 on to 16, 1 on to 32: 4 x 8 + 2 x 8 + 16 = 64 steps, 4 start-ups.
    assert expected == pytest.approx(4 * 0.1 + 64 * 0.01)


def test_a_run_cost_splits_start_up_from_steps() -> None:
    cost = RunCost.of(total_cost=2.0, price_per_hour=3.0, steps=[10, 20, 40])
    assert cost.fixed == pytest.approx(3.0 * 4 / 60)  # the planner's boot time at the offer's price
    assert cost.fixed + cost.per_step * 40 == pytest.approx(2.0)
    small = RunCost.of(total_cost=0.4, price_per_hour=50.0, steps=[8, 16, 32])
    assert small.fixed == pytest.approx(0.1)  # never more than a quarter of the run


def test_a_run_cost_takes_its_fixed_part_from_the_quotes_phases() -> None:
    """Four cold runs on a 2-core CPU spend most of a short run starting up: a run stopped at its first stage
    is quoted that start-up, not a quarter of the whole (on 9a0c9c1's split the sweep test's losers spent
    3-4x what they were quoted)."""
    phases = {"start": 14.0, "load": 0.4, "data": 0.2, "warmup": 0.6, "steps": 10.0, "evals": 0.5}
    phases["output"] = 0.3
    cost = RunCost.of(total_cost=0.26, price_per_hour=36.0, steps=[8, 16, 32], phases=phases)
    assert cost.fixed == pytest.approx(0.26 * 15.2 / 26.0) and cost.final == pytest.approx(0.26 * 0.3 / 26.0)
    assert cost.at_step(32) == pytest.approx(0.26)
    assert cost.at_step(8) == pytest.approx(0.26 * (15.2 + 10.5 / 4) / 26.0)


def test_a_results_event_with_eight_long_answers_passes_the_bots_event_cap() -> None:
    """The runner shortens the answers until the event fits (runner.contract.spec.fit_results): signed, it is
    accepted whole by the bot's checks (under integrity.MAX_EVENT_BYTES beside the usual fields)."""
    import json

    from bot.engine.launching.integrity import MAX_EVENT_BYTES, signed_events
    from runner.contract.integrity import EVENT, sign
    from runner.contract.spec import RunnerEvent, RunResults, Sample, fit_results

    text = "é<@U1> " * 600  # non-ASCII grows as \\u escapes in the signed JSON
    results = RunResults(
        eval_before=2.0,
        eval_after=1.5,
        samples=[Sample(prompt=text[:2000], base=text[:2000], tuned=text[:2000], expected=text[:2000])] * 8,
    )
    event = RunnerEvent(
        job_id="j1",
        seq=7,
        kind="results",
        step=24,
        max_steps=24,
        message="m" * 500,
        results=fit_results(results),
    )
    key = b"k" * 32
    payload = sign(key, EVENT, json.loads(event.model_dump_json()))
    assert len(json.dumps(payload, separators=(",", ":"))) < MAX_EVENT_BYTES
    accepted, refused = signed_events(key, "j1", [payload])
    assert not refused and accepted[0].results is not None and accepted[0].results.eval_after == 1.5
    assert len(accepted[0].results.samples) >= 1


def test_on_a_shared_cpu_later_stages_cost_less_a_step() -> None:
    """Four runs share 2 cores in the first stage, two in the second, one in the last: the quote prices each
    stage's steps at its own share (bench/quote_vs_run.py's sweep spent 0.56 of a quote that priced every
    stage at four runs sharing)."""
    cost = RunCost(fixed=1.0, per_step=0.1, steps=[8, 16, 32], scale=[1.0, 0.5, 0.3])
    assert cost.steps_cost(0) == pytest.approx(0.8)
    assert cost.steps_cost(1) == pytest.approx(0.8 + 0.4)
    assert cost.steps_cost(2) == pytest.approx(0.8 + 0.4 + 16 * 0.03)
    assert cost.at_step(8) == pytest.approx(1.8) and cost.at_step(12) == pytest.approx(1.0 + 0.8 + 0.2)
    assert cost.need(2) == pytest.approx(1.0 + cost.steps_cost(2) * 1.5)
    assert expected_cost([cost] * 4, [4, 2, 1]) == pytest.approx(4 * 1.8 + 2 * 0.4 + 1 * 0.48)
    flat = RunCost(fixed=1.0, per_step=0.1, steps=[8, 16, 32])
    assert flat.at_step(32) == pytest.approx(1.0 + 3.2) and flat.need(1) == pytest.approx(1.0 + 1.6 * 1.5)


def test_each_stage_boundary_a_run_pauses_at_is_quoted() -> None:
    """A run saves a checkpoint at each boundary before the last stage and waits there for the decision: on
    0368a4c four tiny runs spent 1.4 s at each, a quarter of a stage's steps, and the quote priced none."""
    cost = RunCost(fixed=1.0, per_step=0.1, steps=[8, 16, 32], boundary=0.05)
    assert [cost.boundaries(s) for s in (7, 8, 15, 16, 32)] == [0, 1, 1, 2, 2]
    assert cost.at_step(8) == pytest.approx(1.0 + 0.8 + 0.05)  # stopped at the first boundary: one pause
    assert cost.at_step(32) == pytest.approx(1.0 + 3.2 + 0.1)  # the winner: two pauses, none at its end
    assert cost.need(0) == pytest.approx(1.0 + (0.8 + 0.05) * 1.5)
    assert cost.need(2) == pytest.approx(1.0 + (3.2 + 0.1) * 1.5)
    assert expected_cost([cost] * 4, [4, 2, 1]) == pytest.approx(4 * 1.85 + 2 * 0.85 + 1 * 1.6)
    run = RunCost.of(1.0, 36.0, [8, 16, 32], {"start": 1.0, "steps": 1.0}, boundary_s=2.0)
    assert run.boundary == pytest.approx(0.02) and run.fixed == pytest.approx(0.5)
    offer = SimpleNamespace(checkpoint_save_seconds=0.6)
    assert boundary_seconds(offer, poll_seconds=2.0) == pytest.approx(0.6 + 1.0)


def test_a_run_stopped_at_a_stage_is_not_quoted_the_samples_and_output_it_never_writes() -> None:
    """On 38da01b each stopped run of a four-run sweep was quoted its samples and output (1.6 s of the 5 s it
    billed): only the run that reaches its last step writes them."""
    run = RunCost.of(1.0, 3600.0, [8, 16, 32], {"start": 1.0, "samples": 0.5, "output": 0.5, "steps": 2.0})
    assert (run.fixed, run.final) == (pytest.approx(0.25), pytest.approx(0.25))
    assert run.per_step == pytest.approx(0.5 / 32)
    assert run.at_step(8) == pytest.approx(0.25 + 8 * 0.5 / 32)  # stopped at the first stage: no samples
    assert run.at_step(32) == pytest.approx(1.0)  # the winner: the whole quote
    assert run.need(0) == pytest.approx(0.25 + 8 * 0.5 / 32 * 1.5)
    assert run.need(2) == pytest.approx(0.25 + (0.5 + 0.25) * 1.5)
