"""Suite-wide guards: nothing leaves 127.0.0.1, nothing is downloaded, nothing touches the user's data."""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import socket
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# One OpenMP thread per process: on 2 cores this process and the runners it starts train at once, and two
# spinning OpenMP threads each slow the tiny models' steps several-fold (a dropout 17x, a whole tiny job 5x,
# measured). Local runners inherit it (bot/providers/local.py INHERITED_ENV).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# A CLI launch with no live supervisor starts one in the background (bot/commands/supervisor.py): no test
# leaves such a process behind unless it asks for one (TUNEBOT_START_SUPERVISOR=1) and stops it.
os.environ.setdefault("TUNEBOT_START_SUPERVISOR", "0")
from bot.providers.registry import CLOUDS  # noqa: E402 - after the offline switches above

# No cloud key of the person running the tests reaches them (every cloud module's key variable).
for _key in (
    *(spec.key_env for spec in CLOUDS.values()),
    "HF_TOKEN",
    "TUNEBOT_HF_READ_TOKEN",
    "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN",
    "SLACK_SIGNING_SECRET",
    "DATABASE_URL",
):
    os.environ.pop(_key, None)

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_address(address: object) -> None:
    if isinstance(address, tuple) and address:
        host = str(address[0])
        try:
            ip = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            if host != "localhost":
                raise OSError(f"tests may only connect to loopback, not {host!r}") from None
            return
        if not ip.is_loopback:
            raise OSError(f"tests may only connect to loopback, not {host}")


def _guarded_connect(self: socket.socket, address: object) -> None:
    _check_address(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    _check_address(address)
    return _real_connect_ex(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own tunebot data folder (SQLite file, caches), never the user's."""
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path_factory.mktemp("tunebot-data")))
    from bot.settings import get_settings

    get_settings.cache_clear()


# --- a migrated SQLite schema made once per test process, copied where a test opens a new database -------

_TEMPLATE: dict[str, Path] = {}


def _sqlite_template(real_upgrade: Callable[[str], None]) -> Path:
    """The newest schema, migrated once by the real Alembic upgrade (checkpointed: one file holds it all)."""
    if "path" not in _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="tunebot-schema-"))
        atexit.register(shutil.rmtree, folder, True)
        real_upgrade(f"sqlite:///{folder / 'template.db'}")
        with sqlite3.connect(folder / "template.db") as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _TEMPLATE["path"] = folder / "template.db"
    return _TEMPLATE["path"]


@pytest.fixture(autouse=True)
def _new_sqlite_databases_from_a_template(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new SQLite database starts as a copy of the migrated template, then goes through the real
    ``migrate`` (which finds it at head): the same schema as migrating it, without ~1 s of Alembic per
    database. tests/store, which tests the migrations themselves, migrates every database for real."""
    if "store" in request.node.path.relative_to(Path(__file__).parent).parts[:1]:
        return
    import store.db as db

    real_upgrade = db._upgrade

    def upgrade(url: str) -> None:
        path = make_url(url).database if db.is_sqlite(url) else None
        if path and path != ":memory:" and not path.startswith("file:") and not Path(path).exists():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_sqlite_template(real_upgrade), path)
        real_upgrade(url)

    monkeypatch.setattr(db, "_upgrade", upgrade)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow end-to-end tests run first. The workers (scripts/test.sh: pytest-xdist, a file per
    worker at a time) take files in this order; a file of two 70 s tests taken last runs alone at the end
    while the other worker idles. Stable: each file's own order stays."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
