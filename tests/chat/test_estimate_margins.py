"""The estimate card shows each offer's memory range against its GPU ("needs 18-22 GB of 24") and warns when a
recommended offer's top of the range is within 10% of the card (issue 21)."""

from __future__ import annotations

from bot.chat.cards import estimate_reply, memory_margin, tight_warning
from bot.chat.replies import Context, Table
from bot.planner import EstimateRequest, Offer, plan_request
from bot.planner.ranges import memory_ratio


def _offer(provider: str, gpu: str, memory: float, price: float) -> Offer:
    return Offer(
        provider=provider,
        offer_id=f"{provider}-{gpu}",
        gpu=gpu,
        gpu_count=1,
        gpu_memory_gb=memory,
        price_per_hour=price,
        interruptible=False,
        reliability=0.99,
        inet_down_mbps=1000,
    )


def test_every_offer_row_says_what_the_job_needs_of_its_card() -> None:
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="qlora", seq_len=2048, tokens=10_000_000)
    est = plan_request(
        req, offers=[_offer("vast", "rtx-4090", 24, 0.35), _offer("runpod", "a100-80gb", 80, 1.6)]
    )
    low, high = memory_ratio(req)
    point = est.memory.per_gpu_gb
    table = next(p for p in estimate_reply(est, estimate_id=None).parts if isinstance(p, Table))
    column = table.columns.index("memory")
    cells = {row[2]: row[column] for row in table.rows}
    need = next(o.memory_need_gb for o in est.offers if o.gpu == "rtx-4090")
    assert cells["rtx-4090 x1"] == f"needs {need[0]:.1f}-{need[1]:.1f} GB of 25.8"
    assert cells["a100-80gb x1"].endswith("GB of 85.9") and "tight" not in cells["a100-80gb x1"]
    for o in est.offers:  # each card is priced with its own micro-batch and checkpointing (batch_choice.py)
        if o.gpu == est.speed.gpu:
            assert o.memory_need_gb == [round(point * low, 2), round(point * high, 2)]


def test_a_recommended_offer_near_its_memory_is_flagged_and_warned_about() -> None:
    # Llama-3.1-8B LoRA at 2,048 tokens: the top of its range is ~24.1 GB, over 90% of an RTX 4090's 25.8
    # (issue 36's 99% memory top puts 3,072 tokens past the card with its margin; issue 29's ranges, 4,096).
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", seq_len=2048, tokens=10_000_000)
    est = plan_request(
        req, offers=[_offer("vast", "rtx-4090", 24, 0.35), _offer("runpod", "a100-80gb", 80, 1.6)]
    )
    cheap = next(o for o in est.offers if o.gpu == "rtx-4090")
    assert cheap.fits and "cheapest" in cheap.labels
    assert cheap.memory_tight and memory_margin(cheap).endswith(":warning: tight")
    assert cheap.memory_need_gb[1] > 0.9 * cheap.memory_capacity_gb
    warning = tight_warning(est)
    assert warning and "rtx-4090" in warning and "needs up to" in warning
    contexts = [p for p in estimate_reply(est, estimate_id=None).parts if isinstance(p, Context)]
    assert any(warning in " ".join(c.items) for c in contexts)
