"""The planner chooses micro-batch, accumulation, checkpointing and loss per card
(bot/planner/batch_choice.py): the fastest configuration whose memory range's top fits the card, at the
effective batch asked for; what the person pinned stays; the card says what was chosen and why; the runner
gets exactly that (issue 37)."""

from __future__ import annotations

from fakes.snapshot_plan import snapshot_plan

from bot.chat.blockkit import to_blocks
from bot.chat.cards import estimate_reply
from bot.engine.launching.jobspec import spec_fields
from bot.planner.batch_choice import candidates, choose
from bot.planner.gpus import GPUS
from bot.planner.rank import SAFETY_MARGIN
from bot.planner.request import EstimateRequest
from runner.contract.spec import JobSpec


def _spec(est) -> JobSpec:
    fields = {k: v for k, v in spec_fields(est.training).items() if k != "dataset"}
    return JobSpec.model_validate(
        {
            **fields,
            "job_id": "b",
            "dataset": {"uri": "d.jsonl"},
            "checkpoint": {"uri": "c"},
            "output_uri": "o",
        }
    )


def _fits_its_card(est) -> bool:
    top = est.memory.per_gpu_gb_range[1]
    return top * (1 + SAFETY_MARGIN) <= GPUS[est.speed.gpu].memory_gb


def test_a_1b_lora_on_an_h100_fills_the_card_without_checkpointing() -> None:
    """8 rows per step (accum=8: the effective batch, split as fits): micro-batch > 1, no checkpointing, and
    the run is faster than 9a0c9c1's micro-batch 1 x accum 8 with checkpointing and the chunked loss."""
    req = EstimateRequest(model="llama-3.2-1b", tokens=4_000_000, gpu="h100-80gb", grad_accum=8)
    est = snapshot_plan(req)
    plan = est.training
    assert plan is not None and plan.micro_batch_size > 1 and not plan.gradient_checkpointing
    assert plan.micro_batch_size * plan.grad_accum == 8  # the effective batch asked for
    assert plan.batch_choice and "fastest that fits h100-80gb" in plan.batch_choice
    assert _fits_its_card(est)
    old = snapshot_plan(
        req.model_copy(update={"batch_size": 1, "gradient_checkpointing": True, "loss": "chunked"})
    )
    assert est.speed.tokens_per_second > 1.5 * old.speed.tokens_per_second
    assert est.time.hours < old.time.hours and est.time.steps == old.time.steps
    spec = _spec(est)  # the runner trains what the card shows
    assert (spec.micro_batch_size, spec.grad_accum, spec.gradient_checkpointing, spec.loss) == (
        plan.micro_batch_size,
        plan.grad_accum,
        plan.gradient_checkpointing,
        plan.loss,
    )
    card = str(to_blocks(estimate_reply(est, estimate_id=None)))
    assert f"micro-batch {plan.micro_batch_size} x accum {plan.grad_accum}" in card
    assert "no checkpointing" in card and "chosen: fastest that fits h100-80gb" in card


def test_an_8b_qlora_on_a_24_gb_card_keeps_checkpointing() -> None:
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="qlora", tokens=2_000_000, gpu="rtx-4090")
    for rows in (1, 8):
        est = snapshot_plan(req.model_copy(update={"grad_accum": rows}))
        plan = est.training
        assert plan is not None and plan.gradient_checkpointing, plan.batch_choice
        assert plan.micro_batch_size * plan.grad_accum == rows
        assert _fits_its_card(est)


def test_the_default_request_is_chosen_for_too() -> None:
    """Defaults are the path people take: one row per step, and on a big card no checkpointing (41% more ops
    per step on 9a0c9c1, where checkpointing was always on)."""
    est = snapshot_plan(EstimateRequest(model="llama-3.2-1b", tokens=2_000_000, gpu="a100-80gb"))
    plan = est.training
    assert plan is not None and (plan.micro_batch_size, plan.grad_accum) == (1, 1)
    assert not plan.gradient_checkpointing and plan.batch_choice


def test_what_the_person_pinned_wins() -> None:
    req = EstimateRequest(
        model="llama-3.2-1b",
        tokens=2_000_000,
        gpu="h100-80gb",
        batch_size=1,
        grad_accum=8,
        gradient_checkpointing=True,
    )
    plan = snapshot_plan(req).training
    assert plan is not None and (plan.micro_batch_size, plan.grad_accum, plan.gradient_checkpointing) == (
        1,
        8,
        True,
    )
    assert plan.batch_choice is not None and "as given: batch, checkpointing" in plan.batch_choice
    everything = snapshot_plan(req.model_copy(update={"loss": "chunked"})).training
    assert everything is not None and everything.batch_choice is None and everything.loss == "chunked"


def test_the_choice_is_the_fastest_that_fits() -> None:
    """choose() on made-up figures: the fastest candidate within the capacity; none fitting: as asked."""
    req = EstimateRequest(model="llama-3.2-1b", grad_accum=4)
    options = candidates(req)
    assert {(r.batch_size, r.grad_accum) for r in options} == {(4, 1), (2, 2), (1, 4)}
    assert {r.gradient_checkpointing for r in options} == {True, False}

    def need(r: EstimateRequest) -> float:
        return r.batch_size * (2.0 if r.gradient_checkpointing else 5.0) + (3.0 if r.loss == "plain" else 0.0)

    def seconds(r: EstimateRequest) -> float:
        return (
            (1.0 / r.batch_size)
            * (1.4 if r.gradient_checkpointing else 1.0)
            * (1.1 if r.loss == "chunked" else 1.0)
        )

    got = choose(req, card="x", need_gb=need, capacity_gb=12.0, step_seconds=seconds)
    assert (got.micro_batch_size, got.grad_accum, got.gradient_checkpointing, got.loss) == (
        4,
        1,
        True,
        "plain",  # 11 GB of 12, and faster than the chunked loss
    )
    assert all(need(r) > 12.0 or seconds(r) >= seconds(got.apply(req)) for r in options)
    none = choose(req, card="x", need_gb=need, capacity_gb=1.0, step_seconds=seconds)
    assert (
        not none.chosen and (none.micro_batch_size, none.grad_accum) == (1, 4) and "nothing fits" in none.why
    )


def test_the_local_cpu_trains_what_was_asked() -> None:
    est = snapshot_plan(EstimateRequest(model="llama-3.2-1b", tokens=200_000, gpu="cpu"))
    plan = est.training
    assert plan is not None and plan.batch_choice is None and plan.gradient_checkpointing


def test_each_offer_trains_what_it_was_priced_with() -> None:
    """A job created for another offer than the card's (a person picks the fastest one) gets the choice made
    for that offer's card: its spec fields are what its hours were priced with."""
    est = snapshot_plan(EstimateRequest(model="meta-llama/Llama-3.1-8B", tokens=2_000_000, grad_accum=8))
    plan = est.training
    assert plan is not None and plan.batch_by_gpu, plan
    fitting = {(o.gpu, o.gpu_count) for o in est.offers if o.fits}
    for key, (micro, accum, ckpt, loss) in plan.batch_by_gpu.items():
        gpu, count = key.rsplit("x", 1)
        assert (gpu, int(count)) in fitting and micro * accum == 8
        fields = spec_fields(plan, gpu=gpu, gpu_count=int(count))
        assert (fields["micro_batch_size"], fields["grad_accum"]) == (micro, accum)
        assert (fields["gradient_checkpointing"], fields["loss"]) == (ckpt, loss)
    headline = spec_fields(plan, gpu=est.speed.gpu, gpu_count=1)
    assert headline["micro_batch_size"] == plan.micro_batch_size
    assert headline["gradient_checkpointing"] == plan.gradient_checkpointing
