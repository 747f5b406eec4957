"""Search and normalize 5,000 Vast offers: median wall time vs the 200 ms target.

Usage: .venv/bin/python bench/providers_search.py
Two measurements: the real VastProvider.search_offers against the fake Vast server on 127.0.0.1
(HTTP, JSON decode, normalization, filtering, sorting), and the pure normalization of the same
5,000 raw offers. Baseline in the same run: json.loads of the same response body alone, the floor
any client pays before looking at a single offer.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.clouds import FakeVast  # noqa: E402

from bot.providers.base import OfferQuery  # noqa: E402
from bot.providers.http import RetryPolicy  # noqa: E402
from bot.providers.vast import VastProvider, offers_from_vast  # noqa: E402

TARGET_MS = 200.0
N_OFFERS = 5_000
REPEATS = 15


def median_ms(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    fake = FakeVast(n_offers=N_OFFERS, seed=11)
    for item in fake.offers:  # every offer matches the query, so all 5,000 travel and get normalized
        item.update(
            num_gpus=1, verified=True, rentable=True, rented=False, disk_space=max(item["disk_space"], 100)
        )
    fake.cache_search = True  # measure our client, not the fake's JSON encoder
    fake.start()
    try:
        provider = VastProvider(
            api_key=fake.api_key, base_url=fake.url, timeout_s=30, retry=RetryPolicy(attempts=1)
        )
        query = OfferQuery(interruptible=False, min_reliability=0.0, limit=N_OFFERS)
        kept = len(provider.search_offers(query))
        sent = len(fake.offers)
        search = median_ms(lambda: provider.search_offers(query))
        body = json.dumps({"offers": fake.offers})
        items = json.loads(body)["offers"]
        normalize = median_ms(lambda: offers_from_vast(items, interruptible=False, query=query))
        decode = median_ms(lambda: json.loads(body))
    finally:
        fake.stop()
    print(f"offers in the fake response: {sent}; kept after normalization (known GPUs): {kept}")
    print(f"baseline stdlib json.loads of the response ({len(body) / 1e6:.1f} MB): {decode:7.1f} ms")
    print(f"normalize + filter + sort {N_OFFERS} raw offers:        {normalize:7.1f} ms")
    print(
        f"search_offers via HTTP (fake Vast, 127.0.0.1):         {search:7.1f} ms  "
        f"(target {TARGET_MS:.0f} ms: {'PASS' if search <= TARGET_MS else 'FAIL'}, "
        f"{search / TARGET_MS:.2f}x of target; {search / decode:.1f}x the decode floor)"
    )


if __name__ == "__main__":
    main()
