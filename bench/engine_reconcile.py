"""Reconcile passes over 10,000 active jobs against the four fake cloud servers: first and steady vs 2 s.

Usage: .venv/bin/python bench/engine_reconcile.py [--db URL] [--jobs 10000]
2,500 running jobs per cloud (Vast, RunPod, Lambda, TensorDock fakes on 127.0.0.1, real clients over
HTTP with paginated listings), each with its instance row in the database (SQLite file by default),
recorded as "provisioning" while the clouds say running: the first pass refreshes every status (the
expensive pass after a start), the following ones find nothing to change. Baseline in the same run:
the listings alone (the HTTP floor any reconciler pays).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakes.clouds import FAKES  # noqa: E402
from fakes.clouds.fixtures import client_for  # noqa: E402

from bench.engine_seed import bench_database, bulk_insert, cloud_fleet  # noqa: E402
from bot.engine.service import Engine  # noqa: E402
from bot.settings import Settings  # noqa: E402
from store.models import Instance, Job  # noqa: E402

TARGET_S = 2.0
JOBS = 10_000
REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tunebot-bench-"))
    db_url = bench_database(args.db, tmp, "bench")
    fakes = {name: cls(page_size=100).start() for name, cls in FAKES.items()}
    try:
        clients = {name: client_for(fake) for name, fake in fakes.items()}
        engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=db_url, providers=clients)
        now = time.time()
        per = args.jobs // len(fakes)
        jobs, rows = cloud_fleet(fakes, clients, per, now=now, status="provisioning")
        bulk_insert(engine, Job, jobs)
        bulk_insert(engine, Instance, rows)
        t0 = time.perf_counter()
        first = engine.reconcile()  # refreshes every status (provisioning -> running): the cold pass
        first_s = time.perf_counter() - t0
        assert not first.terminated and not first.lost and first.seen == per * len(fakes), first

        def listing() -> None:
            for client in clients.values():
                client.list_instances()

        def one_pass() -> None:
            report = engine.reconcile()
            assert report.seen == per * len(fakes) and not report.adopted and not report.lost

        def median_s(fn) -> float:  # type: ignore[no-untyped-def]
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        base_s = median_s(listing)
        pass_s = median_s(one_pass)
        engine.close()
    finally:
        for fake in fakes.values():
            fake.stop()
    verdict = "PASS" if pass_s < TARGET_S and first_s < TARGET_S else "FAIL"
    print(
        f"reconcile over {per * len(fakes)} active jobs on {len(fakes)} fake clouds "
        f"({db_url.split(':')[0]}): first pass {first_s * 1000:.0f} ms, steady median "
        f"{pass_s * 1000:.0f} ms (target < {TARGET_S * 1000:.0f} ms each) {verdict}"
    )
    print(
        f"baseline, provider listings alone: median {base_s * 1000:.0f} ms; "
        f"reconcile / listing = {pass_s / base_s:.2f}x"
    )


if __name__ == "__main__":
    main()
