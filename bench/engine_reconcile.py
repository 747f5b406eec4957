"""One reconcile pass over 1,000 active jobs against the four fake cloud servers: median vs the 2 s target.

Usage: .venv/bin/python bench/engine_reconcile.py [--db URL]
250 running jobs per cloud (Vast, RunPod, Lambda, TensorDock fakes on 127.0.0.1, real clients over
HTTP with paginated listings), each with its instance row in the database (SQLite file by default).
A pass lists every provider's labelled instances and compares them with the database. Baseline in
the same run: the listing alone (the HTTP floor any reconciler pays).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.clouds import FAKES  # noqa: E402
from fakes.clouds.fixtures import client_for  # noqa: E402

from bot.engine.service import Engine  # noqa: E402
from bot.providers.base import LaunchRequest, OfferQuery, job_label  # noqa: E402
from bot.settings import Settings  # noqa: E402
from store.models import Instance, Job  # noqa: E402

TARGET_S = 2.0
JOBS = 1_000
REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tunebot-bench-"))
    db_url = args.db or f"sqlite:///{tmp / 'bench.db'}"
    fakes = {name: cls(page_size=100).start() for name, cls in FAKES.items()}
    try:
        clients = {name: client_for(fake) for name, fake in fakes.items()}
        engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=db_url, providers=clients)
        now = time.time()
        jobs, rows = [], []
        per = JOBS // len(fakes)
        for name, fake in fakes.items():
            client = clients[name]
            offer = client.search_offers(OfferQuery(interruptible=False, min_reliability=0.0))[0]
            template = client.launch(LaunchRequest(job_id="template", offer=offer, image="img"))
            base = fake.instances[str(template.instance_id)]
            fake.instances.pop(str(template.instance_id))
            label_key = "label" if "label" in base else "name"
            for k in range(per):
                job_id = f"{name}-{k:05d}"
                iid = fake.new_id()
                inst = copy.deepcopy(base)
                inst["id"] = type(base["id"])(iid)
                inst[label_key] = job_label(job_id)
                fake.instances[iid] = inst
                jobs.append(
                    Job(
                        id=job_id,
                        owner=f"user{k % 20}",
                        state="running",
                        request={"model": "m"},
                        offer=offer.model_dump(mode="json"),
                        provider=name,
                        price_per_hour=1.0,
                        created_at=now,
                        updated_at=now,
                        started_at=now,
                    )
                )
                rows.append(
                    Instance(
                        provider=name,
                        provider_instance_id=iid,
                        job_id=job_id,
                        label=job_label(job_id),
                        price_per_hour=1.0,
                        launched_at=now,
                        status="running",
                    )
                )
        with engine.session() as s:
            s.add_all(jobs)
            s.commit()
            s.add_all(rows)
            s.commit()
        first = engine.reconcile()  # settles statuses (provisioning -> running) once
        assert not first.terminated and not first.lost, first

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
    verdict = "PASS" if pass_s < TARGET_S else "FAIL"
    print(
        f"reconcile pass over {per * len(fakes)} active jobs on {len(fakes)} fake clouds "
        f"({db_url.split(':')[0]}): "
        f"median {pass_s * 1000:.0f} ms (target < {TARGET_S * 1000:.0f} ms) {verdict}"
    )
    print(
        f"baseline, provider listings alone: median {base_s * 1000:.0f} ms; "
        f"reconcile / listing = {pass_s / base_s:.2f}x"
    )


if __name__ == "__main__":
    main()
