"""The daily summary over 100,000 jobs: the cold first call and the median vs the 1 s target.

Usage: .venv/bin/python bench/engine_summary.py [--db URL] [--jobs 100000]
100,000 jobs of 50 users (98% finished over the last 20 days, 2% running), each with its instance
and ledger lines, in a fresh SQLite file by default. The summary is a handful of aggregate queries
over indexes (migration 0004_i12) plus a roll-up of the running instances. "Cold" is the first
summary of a freshly started engine (its first roll-up rewrites whole lines, nothing cached in the
process). Baseline in the same run: one COUNT(*) over the jobs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine_seed import bench_database, bulk_insert, instance_row, job_row  # noqa: E402
from bot.engine.record.spend import DAY, day_start, roll_up  # noqa: E402
from bot.engine.service import Engine  # noqa: E402
from bot.settings import Settings  # noqa: E402
from store.models import Instance, Job  # noqa: E402

TARGET_S = 1.0
JOBS = 100_000
REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    n = args.jobs
    n_active = n // 50
    tmp = Path(tempfile.mkdtemp(prefix="tunebot-bench-"))
    db_url = bench_database(args.db, tmp, "summary")
    now = time.time()
    engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=db_url, providers={}, clock=lambda: now)
    today = day_start(now)
    jobs, rows = [], []
    print(f"building {n} jobs with their instances and ledger lines ...", flush=True)
    for k in range(n):
        active = k < n_active
        start = now - 1800 if active else today - DAY * (1 + k % 20) + (k % 70) * 600
        end = None if active else start + 600 + (k % 13) * 300
        jobs.append(
            job_row(
                f"job{k:06d}",
                owner=f"user{k % 50}",
                team=f"team{k % 5}",
                state="running" if active else ("succeeded", "failed", "stopped")[k % 3],
                provider=("vast", "runpod", "lambda")[k % 3],
                price_per_hour=0.5 + (k % 7) / 10,
                now=start,
                updated_at=end or now,
                finished_at=end,
            )
        )
        rows.append(
            instance_row(
                f"job{k:06d}",
                ("vast", "runpod", "lambda")[k % 3],
                f"i{k}",
                price_per_hour=0.5 + (k % 7) / 10,
                launched_at=start,
                ended_at=end,
                status="running" if active else "terminated",
            )
        )
    bulk_insert(engine, Job, jobs)
    bulk_insert(engine, Instance, rows)
    with engine.session() as s:
        roll_up(s, now, since=0.0)  # the ledger as the scheduler's roll-ups would have left it
        s.commit()
    engine.close()
    engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=db_url, providers={}, clock=lambda: now)

    def median_s(fn) -> float:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def count() -> None:
        with engine.session() as s:
            s.execute(select(func.count()).select_from(Job)).scalar_one()

    t0 = time.perf_counter()
    engine.daily_summary()  # cold: a fresh engine's first summary (and first roll-up)
    cold_s = time.perf_counter() - t0
    base_s = median_s(count)
    summary_s = median_s(engine.daily_summary)
    summary = engine.daily_summary()
    engine.close()
    verdict = "PASS" if summary_s < TARGET_S and cold_s < TARGET_S else "FAIL"
    print(
        f"daily summary over {n} jobs ({db_url.split(':')[0]}): cold {cold_s * 1000:.0f} ms, "
        f"median {summary_s * 1000:.0f} ms (target < {TARGET_S * 1000:.0f} ms each) {verdict}"
    )
    print(
        f"baseline, COUNT(*) of the jobs: median {base_s * 1000:.1f} ms; "
        f"summary / count = {summary_s / base_s:.0f}x"
    )
    print(f"summary: {summary.model_dump_json()}")


if __name__ == "__main__":
    main()
