"""Rank 10,000 offers for one request: median wall time vs the 50 ms target.

Usage: .venv/bin/python bench/planner_rank.py
Baseline in the same run: a naive ranking of the same offers - the same formulas evaluated offer by
offer on floats, and one RankedOffer built for every offer.
"""

from __future__ import annotations

import random
import statistics
import time

from bot.planner import EstimateRequest, plan, plan_request, rank
from bot.providers.snapshot import snapshot_offers

TARGET_MS = 50.0
N_OFFERS = 10_000
REPEATS = 21


def offers_10k() -> list:
    rng = random.Random(7)
    base = snapshot_offers()
    out = []
    for i in range(N_OFFERS):
        o = rng.choice(base)
        out.append(
            o.model_copy(
                update={
                    "offer_id": f"bench-{i}",
                    "price_per_hour": round(o.price_per_hour * rng.uniform(0.7, 1.4), 4),
                    "reliability": round(rng.uniform(0.9, 0.999), 3),
                    "preemptions_per_hour": o.preemptions_per_hour * rng.uniform(0.5, 3.0)
                    if o.interruptible
                    else 0.0,
                }
            )
        )
    return out


def median_ms(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    offers = offers_10k()
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", tokens=50_000_000)
    plan_request(req, offers=offers)  # warm caches (model table, imports)
    ms = median_ms(lambda: plan_request(req, offers=offers))
    est = plan_request(req, offers=offers)
    fits = sum(o.fits for o in est.offers)

    real_rank = plan.rank_offers

    def naive_rank(offers, job, **kw):
        kw.update(keep_fits=len(offers), keep_rejected=len(offers))
        saved, rank.VECTOR_MIN = rank.VECTOR_MIN, 10**9  # float path, every offer materialized
        try:
            return real_rank(offers, job, **kw)
        finally:
            rank.VECTOR_MIN = saved

    plan.rank_offers = naive_rank
    try:
        base_ms = median_ms(lambda: plan_request(req, offers=offers), repeats=5)
    finally:
        plan.rank_offers = real_rank
    print(
        f"offers ranked: {N_OFFERS:,} (returned {len(est.offers)}: {fits} fitting, "
        "rest rejected with reasons)"
    )
    print(
        f"estimate() incl. ranking, median of {REPEATS}: {ms:.1f} ms  (target < {TARGET_MS:.0f} ms: "
        f"{'OK' if ms < TARGET_MS else 'MISSED'})"
    )
    print(
        f"baseline, naive per-offer ranking with a RankedOffer per offer: {base_ms:.1f} ms "
        f"(the planner is {base_ms / ms:.1f}x faster)"
    )


if __name__ == "__main__":
    main()
