"""Engine test fixtures: the same tests run on SQLite and on PostgreSQL (a throwaway database)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)

from bot.engine.events import EngineEvent, EventBus
from bot.planner.request import EstimateRequest
from bot.settings import Settings

from .fakes import FakeProvider, make_estimate

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", "postgres"]


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL on 127.0.0.1:5432 is unreachable ({type(exc).__name__}: {exc})"


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A throwaway PostgreSQL database for this test session, dropped at the end."""
    problem = _pg_available()
    if problem:
        if os.environ.get("TUNEBOT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem}; TUNEBOT_REQUIRE_POSTGRES=1 makes this a failure")
        pytest.skip(f"{problem}; set TUNEBOT_REQUIRE_POSTGRES=1 to fail instead of skipping")
    import psycopg

    name = f"tunebot_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    from store.db import migrate

    migrate(url)
    yield url
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _truncate(url: str) -> None:
    from sqlalchemy import text

    from store.db import make_engine

    eng = make_engine(url)
    with eng.begin() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename <> 'alembic_version'"
                )
            )
        ]
        if tables:
            conn.execute(text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY"))
    eng.dispose()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'engine.db'}"
    url = request.getfixturevalue("pg_database")
    _truncate(url)
    return url


@pytest.fixture
def pg_url(pg_database: str) -> str:
    _truncate(pg_database)
    return pg_database


class Clock:
    def __init__(self, start: float = 1_764_633_600.0) -> None:  # 2025-12-02 00:00 UTC
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        TUNEBOT_APPROVAL_ABOVE=50.0,
        TUNEBOT_RECONCILE_EVERY=60.0,
        TUNEBOT_HEARTBEAT_TIMEOUT=600.0,
        TUNEBOT_IDLE_STOP_MINUTES=30.0,
        TUNEBOT_RETRY_BUDGET=3,
    )


class Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.events: list[EngineEvent] = []
        bus.subscribe(self.events.append)

    def kinds(self) -> list[str]:
        return [str(e.kind) for e in self.events]


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def make_engine(db_url: str, settings: Settings, clock: Clock, fake: FakeProvider):  # type: ignore[no-untyped-def]
    from bot.engine.service import Engine

    made = []

    def make(**kw):  # type: ignore[no-untyped-def]
        args = {"settings": settings, "db_url": db_url, "providers": {fake.name: fake}, "clock": clock}
        args.update(kw)
        eng = Engine(**args)
        eng.terminate_deadline_s = 2.0
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


@pytest.fixture
def engine(make_engine):  # type: ignore[no-untyped-def]
    return make_engine()


def _train_jsonl() -> str:
    """A small alpaca dataset on disk: job creation reads and checks the data before anything is rented."""
    import json
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="tunebot-engine-data-")) / "train.jsonl"
    rows = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


TRAIN_JSONL = _train_jsonl()


def request(**kw) -> EstimateRequest:  # type: ignore[no-untyped-def]
    base = {"model": "tiny", "dataset": TRAIN_JSONL, "method": "lora"}
    base.update(kw)
    return EstimateRequest(**base)


def estimate_for(*providers: FakeProvider, hours: float = 1.0):  # type: ignore[no-untyped-def]
    return make_estimate([p.offer() for p in providers], hours=hours)
