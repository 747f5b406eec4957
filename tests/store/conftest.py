"""Store fixtures: each test gets a fresh SQLite file and a fresh throwaway PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def _pg_problem() -> str | None:
    try:
        import psycopg

        with psycopg.connect(ADMIN, connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL on 127.0.0.1:5432 is unreachable ({type(exc).__name__}: {exc})"


@pytest.fixture
def pg_empty_url() -> Iterator[str]:
    problem = _pg_problem()
    if problem:
        if os.environ.get("TUNEBOT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem}; TUNEBOT_REQUIRE_POSTGRES=1 makes this a failure")
        pytest.skip(f"{problem}; set TUNEBOT_REQUIRE_POSTGRES=1 to fail instead of skipping")
    import psycopg

    name = f"tunebot_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'store.db'}"
    return request.getfixturevalue("pg_empty_url")
