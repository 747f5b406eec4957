"""Database engine and sessions from DATABASE_URL, with Alembic migrations applied on start.

SQLite (the embedded default, a file in the data folder) runs in WAL mode with a busy timeout so
that the bot, the scheduler thread and a CLI command can share it. PostgreSQL is used through
psycopg 3. Migrations run under a lock - a PostgreSQL advisory lock, or a file lock beside the SQLite
file - so several processes starting at once on a new database upgrade the schema exactly once.

The store imports nothing of bot: every caller hands it the URL (the engine and the scheduler take
Settings.resolved_database_url()).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, bindparam, create_engine, event, text, update
from sqlalchemy.engine import make_url
from sqlmodel import Session

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_MIGRATION_LOCK_KEY = 0x7475_6E65  # "tune": advisory lock id for schema upgrades
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def normalize_url(url: str) -> str:
    """Accept postgres:// and postgresql:// and route both to psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_sqlite(url_or_engine: str | Engine) -> bool:
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else make_url(normalize_url(url_or_engine))
    return url.get_backend_name() == "sqlite"


def make_engine(url: str) -> Engine:
    """A new engine; SQLite files get WAL, a busy timeout and foreign-thread access."""
    url = normalize_url(url)
    if is_sqlite(url):
        db_path = make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=40)


def get_engine(url: str) -> Engine:
    """A shared engine per URL for this process (migrated on first use)."""
    url = normalize_url(url)
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            migrate(url)
            engine = _engines[url] = make_engine(url)
        return engine


def insert_for(session: Session, model: Any) -> Any:
    """An INSERT with this database's ``on_conflict_do_nothing/update`` (an idempotent write: two processes
    writing the same unique row converge instead of one failing)."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(model)


def update_each(session: Session, model: Any, rows: Sequence[dict[str, Any]]) -> None:
    """UPDATE each row's other columns WHERE id = row["id"], in one executemany (every row has the same
    keys). At 10,000 jobs this is what keeps a tick's writes to one round of statements."""
    if not rows:
        return
    t = model.__table__
    cols = [c for c in rows[0] if c != "id"]
    stmt = update(t).where(t.c.id == bindparam("b_id")).values({c: bindparam(c) for c in cols})
    session.execute(stmt, [{"b_id": r["id"], **{c: r[c] for c in cols}} for r in rows])


def update_in(session: Session, model: Any, ids: Sequence[Any], **values: Any) -> None:
    """UPDATE the same values WHERE id IN ids, a thousand ids a statement (bound-parameter limits)."""
    for k in range(0, len(ids), 1000):
        session.execute(update(model).where(model.id.in_(ids[k : k + 1000])).values(**values))


def _migration_lock(url: str) -> AbstractContextManager[Any]:
    """SQLite has no advisory lock: a file lock beside the database serializes processes' migrations."""
    if not is_sqlite(url):
        return nullcontext()
    db_path = make_url(url).database
    if not db_path or db_path == ":memory:" or db_path.startswith("file:"):
        return nullcontext()
    from filelock import FileLock

    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    return FileLock(f"{db_path}.migrate.lock", timeout=600)


def alembic_config(url: str):
    """A programmatic Alembic config: no alembic.ini needed in the working directory."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str) -> None:
    """Bring the schema to the newest revision (idempotent, safe to call from several processes)."""
    url = normalize_url(url)
    with _migration_lock(url):
        _upgrade(url)


def _upgrade(url: str) -> None:
    from alembic import command

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if not is_sqlite(url):
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                conn.commit()
            try:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                if not is_sqlite(url):
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                    conn.commit()
    finally:
        engine.dispose()


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: commit on success, roll back on error."""
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
