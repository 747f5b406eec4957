"""Finishing one job with 10,000 recent instances in the ledger: each finish vs the 20 ms target.

Usage: .venv/bin/python bench/engine_finish.py [--db URL] [--instances 10000]
10,000 running jobs, each with its open instance launched over the last day and its ledger lines
rolled up (a fresh SQLite file by default). 21 of them are finished one after another with
``bot.engine.outcome.finish.finish`` on an in-process provider (tests/engine/fakes.py: terminate and the
confirming status are dictionary operations, so the figure is the engine's and the database's).
Printed: the first (cold) finish, the median of the others, and as the same-run baseline the
whole-recent-ledger roll-up that finish() used to run for every job (what made N finishes O(N^2)).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.engine_seed import backend, bench_database, bulk_insert, instance_row, job_row, timed  # noqa: E402
from bot.engine.outcome import finish as finish_mod  # noqa: E402
from bot.engine.record.spend import roll_up  # noqa: E402
from bot.engine.service import Engine  # noqa: E402
from bot.providers.base import Instance as ProviderInstance  # noqa: E402
from bot.providers.base import InstanceStatus  # noqa: E402
from bot.settings import Settings  # noqa: E402
from store.models import Instance, Job  # noqa: E402
from tests.engine.fakes import FakeProvider  # noqa: E402

TARGET_S = 0.020
FINISHES = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--instances", type=int, default=10_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tunebot-bench-"))
    db_url = bench_database(args.db, tmp, "finish")
    n = args.instances
    now = time.time()
    fake = FakeProvider("fake")
    engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=db_url, providers={"fake": fake})
    print(f"building {n} running jobs with their instances and ledger lines ...", flush=True)
    jobs, insts = [], []
    for k in range(n):
        job_id = f"job{k:06d}"
        launched = now - 86400 * (k % 97) / 97
        jobs.append(job_row(job_id, owner=f"user{k % 50}", provider="fake", now=launched))
        iid = f"fake-b{k}"
        fake.instances[iid] = ProviderInstance(
            "fake", iid, f"tunebot-{job_id}", InstanceStatus.running, "running"
        )
        insts.append(instance_row(job_id, "fake", iid, launched_at=launched))
    bulk_insert(engine, Job, jobs)
    bulk_insert(engine, Instance, insts)
    with engine.session() as s:
        roll_up(s, now, since=0.0)
        s.commit()
    ids = iter(f"job{k:06d}" for k in range(1, n))
    done: list[str] = []

    def finish_one() -> None:
        job_id = next(ids)
        assert finish_mod.finish(engine, job_id, "succeeded", reason="finished"), job_id
        done.append(job_id)

    cold_s, warm = timed(finish_one, FINISHES)

    def whole_ledger() -> None:  # what every finish() did before issue 12
        with engine.session() as s:
            roll_up(s, time.time(), since=time.time() - 3 * 86400)
            s.rollback()

    base_cold, base_warm = timed(whole_ledger, 2)
    with engine.session() as s:
        finished = s.get(Job, done[-1])
        assert finished is not None and finished.state == "succeeded" and finished.spend > 0
    assert len(fake.terminates) == len(done) and len(fake.instances) == n - len(done)
    engine.close()
    med = statistics.median(warm)
    verdict = "PASS" if med < TARGET_S and cold_s < 10 * TARGET_S else "FAIL"
    print(
        f"finish one job with {n} recent instances ({backend(db_url)}): first {cold_s * 1000:.1f} ms, "
        f"median of {len(warm)} {med * 1000:.1f} ms, max {max(warm) * 1000:.1f} ms "
        f"(target < {TARGET_S * 1000:.0f} ms) {verdict}"
    )
    base = statistics.median(base_warm)
    print(
        f"baseline, the whole-recent-ledger roll-up finish() used to run: first {base_cold * 1000:.0f} ms, "
        f"median {base * 1000:.0f} ms; finish / old roll-up = {med / base:.3f}"
    )


if __name__ == "__main__":
    main()
