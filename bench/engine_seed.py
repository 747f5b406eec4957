"""Seeding for the engine benches: many jobs, instances and ledger lines in one executemany each.

Rows are built as the models (so every default is the model's) and inserted through Core, which is
what lets a bench build 100,000 jobs in seconds instead of minutes of ORM flushes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import insert

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store.models import Instance, Job  # noqa: E402


def job_row(job_id: str, **fields: Any) -> dict[str, Any]:
    now = fields.pop("now", time.time())
    base: dict[str, Any] = {
        "id": job_id,
        "owner": "user0",
        "state": "running",
        "request": {"model": "m"},
        "offer": {"provider": "p"},
        "created_at": now,
        "updated_at": now,
        "started_at": now,
    }
    base.update(fields)
    return Job(**base).model_dump()


def instance_row(job_id: str, provider: str, instance_id: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "provider": provider,
        "provider_instance_id": instance_id,
        "job_id": job_id,
        "label": f"tunebot-{job_id}",
        "price_per_hour": 1.0,
        "launched_at": time.time(),
        "status": "running",
    }
    base.update(fields)
    row = Instance(**base).model_dump()
    row.pop("id", None)
    return row


def clone_instances(
    fakes: dict[str, Any], clients: dict[str, Any], per: int
) -> list[tuple[str, str, str, Any]]:
    """``per`` labelled instances on each fake cloud server, copies of one really launched through the
    client (so every listing and status answer is the server's own shape). Returns (cloud, job id,
    instance id, offer) for each."""
    import copy

    from bot.providers.base import LaunchRequest, OfferQuery, job_label

    out = []
    for name, fake in fakes.items():
        client = clients[name]
        offer = client.search_offers(OfferQuery(interruptible=False, min_reliability=0.0))[0]
        template = client.launch(LaunchRequest(job_id="template", offer=offer, image="img"))
        base = fake.instances.pop(str(template.instance_id))
        label_key = "label" if "label" in base else "name"
        for k in range(per):
            job_id = f"{name}-{k:05d}"
            iid = fake.new_id()
            inst = copy.deepcopy(base)
            inst["id"] = type(base["id"])(iid)
            inst[label_key] = job_label(job_id)
            fake.instances[iid] = inst
            out.append((name, job_id, iid, offer))
    return out


def cloud_fleet(
    fakes: dict[str, Any],
    clients: dict[str, Any],
    per: int,
    *,
    now: float,
    status: str = "running",
    extra: Callable[[str], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Job rows and their instance rows for ``per`` instances on each fake cloud (clone_instances),
    launched at ``now`` by 20 users at $1/h; ``extra(job_id)``: more fields of that job's row."""
    jobs, rows = [], []
    for k, (name, job_id, iid, offer) in enumerate(clone_instances(fakes, clients, per)):
        fields = extra(job_id) if extra is not None else {}
        jobs.append(
            job_row(
                job_id,
                owner=f"user{k % 20}",
                offer=offer.model_dump(mode="json"),
                provider=name,
                price_per_hour=1.0,
                now=now,
                **fields,
            )
        )
        rows.append(instance_row(job_id, name, iid, launched_at=now, status=status))
    return jobs, rows


def bulk_insert(engine: Any, model: type, rows: Iterable[dict[str, Any]], chunk: int = 5000) -> int:
    rows = list(rows)
    with engine.session() as s:
        for k in range(0, len(rows), chunk):
            s.execute(insert(model.__table__), rows[k : k + chunk])  # type: ignore[attr-defined]
        s.commit()
    return len(rows)


def analyze(engine: Any) -> None:
    """Refresh the planner's statistics after a bulk load, as autovacuum would have long before on a
    database that grew to this size (PostgreSQL otherwise plans every query for empty tables)."""
    from sqlalchemy import text

    with engine.session() as s:
        s.execute(text("ANALYZE"))
        s.commit()


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """(first call's seconds, the following calls' seconds)."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times[0], times[1:]


def backend(db_url: str) -> str:
    return "postgresql" if db_url.startswith("postgres") else "sqlite"


def bench_database(db_url: str | None, tmp: Path, name: str) -> str:
    """The database a bench seeds: a fresh SQLite file by default; for a PostgreSQL URL, a throwaway
    database created on that server and dropped at exit, so runs (and benches run side by side) never
    meet each other's rows."""
    if not db_url:
        return f"sqlite:///{tmp / name}.db"
    if not db_url.startswith("postgres"):
        return db_url
    import atexit
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(db_url).set(drivername="postgresql")
    admin = server.render_as_string(hide_password=False)
    fresh = f"tunebot_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{fresh}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')

    atexit.register(drop)
    return server.set(drivername="postgresql+psycopg", database=fresh).render_as_string(hide_password=False)
