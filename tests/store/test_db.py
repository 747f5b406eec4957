"""The store: migrations applied on start (no alembic.ini needed), both backends, constraints hold."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from store.db import make_engine, migrate, normalize_url, session_scope
from store.models import BudgetAlert, Job, RunnerEventRecord

TABLES = {
    "jobs",
    "instances",
    "volumes",
    "spend_ledger",
    "runner_events",
    "budgets",
    "budget_alerts",
    "audit_log",
    "scheduler_lease",
    "task_runs",
    "calibration_runs",
    "alembic_version",
}


def _job(job_id: str, key: str | None = None) -> Job:
    return Job(
        id=job_id,
        owner="alice",
        state="approved",
        request={"model": "m"},
        offer={"provider": "p"},
        idempotency_key=key,
        created_at=0.0,
        updated_at=0.0,
    )


def test_migrate_creates_every_table_from_any_directory(empty_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no alembic.ini here
    migrate(empty_url)
    migrate(empty_url)  # idempotent
    eng = make_engine(empty_url)
    assert TABLES <= set(inspect(eng).get_table_names())
    with eng.connect() as conn:
        from alembic.script import ScriptDirectory

        from store.db import alembic_config

        head = ScriptDirectory.from_config(alembic_config(empty_url)).get_current_head()
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
    eng.dispose()


def test_idempotency_key_and_event_seq_are_unique(empty_url):
    migrate(empty_url)
    eng = make_engine(empty_url)
    with session_scope(eng) as s:
        s.add(_job("a", "k1"))
        s.add(_job("b", None))
        s.add(_job("c", None))  # NULL keys do not collide
    with pytest.raises(IntegrityError), session_scope(eng) as s:
        s.add(_job("d", "k1"))
    with session_scope(eng) as s:
        s.add(RunnerEventRecord(job_id="a", seq=1, kind="progress", at=0.0))
        s.add(RunnerEventRecord(job_id="b", seq=1, kind="progress", at=0.0))
    with pytest.raises(IntegrityError), session_scope(eng) as s:
        s.add(RunnerEventRecord(job_id="a", seq=1, kind="progress", at=0.0))
    with pytest.raises(IntegrityError), session_scope(eng) as s:
        for _ in range(2):
            s.add(BudgetAlert(scope="user", name="a", period="day:x", level=80, spent=1, limit=1, at=0))
    with Session(eng) as s:
        job = s.get(Job, "a")
        assert job.request == {"model": "m"} and job.state == "approved"
    eng.dispose()


def test_sqlite_uses_wal_and_a_busy_timeout(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    migrate(url)
    eng = make_engine(url)
    with eng.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    eng.dispose()


def test_default_url_is_sqlite_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    from bot.settings import Settings

    assert Settings().resolved_database_url() == f"sqlite:///{tmp_path / 'd' / 'tunebot.db'}"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"


def test_concurrent_migrations_on_postgres_upgrade_once(pg_empty_url):
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(pg_empty_url)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    eng = make_engine(pg_empty_url)
    assert TABLES <= set(inspect(eng).get_table_names())
    eng.dispose()


def test_the_migrations_build_every_column_the_models_declare(empty_url):
    """A column added to a model without a migration breaks every existing database at its first query."""
    from sqlmodel import SQLModel

    import store.models  # noqa: F401 - the tables' metadata

    migrate(empty_url)
    eng = make_engine(empty_url)
    inspector = inspect(eng)
    missing = [
        f"{table.name}.{column.name}"
        for table in SQLModel.metadata.sorted_tables
        for column in table.columns
        if column.name not in {c["name"] for c in inspector.get_columns(table.name)}
    ]
    eng.dispose()
    assert missing == []


def test_the_plan_migration_stores_each_jobs_training_plan_once(empty_url):
    """0012: a job whose spec_overrides held the plan keeps it as ``plan``; an older job (no plan stored)
    gets the fields its next launch used to derive from the request, its overrides merged over them."""
    from alembic import command

    from bot.engine.launching.jobspec import plan_of, spec_fields
    from bot.planner.request import EstimateRequest
    from store.db import alembic_config

    if empty_url.startswith("sqlite:///"):
        Path(empty_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(empty_url), "0011_i19")  # the schema before the plan was stored once
    eng = make_engine(empty_url)
    request = {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "dataset": "s3://d/t.jsonl", "max_steps": 40}
    stored = {"base_model": "s3://bucket/staged/model", "max_steps": 40, "seq_len": 1024}
    row = (
        "INSERT INTO jobs (id, owner, state, request, choice, offer, offers, spec_overrides, interruptible, "
        "retry_count, preemptions, last_event_seq, last_step, spend, created_at, updated_at) VALUES "
        "(:id, 'al', 'succeeded', :request, 'cheapest', '{}', '[]', :overrides, false, 0, 0, 0, 0, 0, 1, 1)"
    )
    with eng.begin() as conn:
        for job_id, overrides in (("new", stored), ("old", {"seed": 7})):
            values = {"id": job_id, "request": json.dumps(request), "overrides": json.dumps(overrides)}
            conn.execute(text(row), values)
    eng.dispose()
    migrate(empty_url)
    eng = make_engine(empty_url)
    with eng.connect() as conn:
        plans = {r[0]: r[1] for r in conn.execute(text("SELECT id, plan FROM jobs"))}
        columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
    eng.dispose()
    plans = {k: json.loads(v) if isinstance(v, str) else v for k, v in plans.items()}
    assert plans["new"] == stored
    derived = spec_fields(plan_of(EstimateRequest.model_validate(request), None))
    assert plans["old"] == {**derived, "seed": 7}
    assert plans["old"]["base_model"] == "Qwen/Qwen2.5-0.5B" and plans["old"]["max_steps"] == 40
    assert "spec_overrides" not in columns


def _frozen_plan_migration():
    """The 0012 migration module, loaded from its file (alembic's versions folder is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "store/migrations/versions/0012_i22_job_plan.py"
    spec = importlib.util.spec_from_file_location("migration_0012_i22", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FROZEN_PLAN_ROWS = [
    ({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "dataset": "s3://d/t.jsonl", "max_steps": 40}, {}),
    ({"model": "meta-llama/Llama-3.1-8B", "method": "full", "gpus": 4, "epochs": 2.5}, {"seed": 7}),
    (
        {
            "model": "/models/llama",
            "method": "qlora",
            "lora_r": 2048,
            "lora_targets": ["q", "v"],
            "dataset": "./data/chat.jsonl",
            "dataset_format": "messages",
            "optimizer_impl": "foreach",
            "push_to_hub": "acme/tuned",
            "hub_public": True,
            "precision": "mixed",
            "eval_split": 0.1,
            "keep": "last",
            "samples": 0,
            "plateau": False,
        },
        {"lora": {"alpha": 3}},
    ),
    ({"model": "m", "method": "lora", "learning_rate": 1e-3, "lora_alpha": 64, "merge": True}, None),
    ({"model": "m", "no_such_option": 1}, {"seed": 3}),  # unreadable: keeps only its overrides
    ({"model": "m", "lora_r": 0}, {}),  # out of bounds: unreadable too
    (None, {"seed": 1}),
    ({"model": "m"}, {"base_model": "s3://b/staged", "seed": 9}),  # the plan is stored already
]


@pytest.mark.parametrize(("request_row", "overrides"), FROZEN_PLAN_ROWS)
def test_the_plan_migrations_frozen_copy_derives_what_the_live_code_derives(request_row, overrides):
    """0012 carries its own copy of the request and of what a launch derived from it; today it gives what
    the live code (bot/planner/request.py, bot/engine/launching/jobspec.py) gives, row for row."""
    from bot.engine.launching.jobspec import deep_merge, plan_of, spec_fields
    from bot.planner.request import EstimateRequest

    frozen = _frozen_plan_migration().plan_of_row(request_row, overrides)
    kept = dict(overrides or {})
    if "base_model" in kept:
        live = kept
    else:
        try:
            req = EstimateRequest.model_validate(request_row or {})
        except ValueError:
            live = kept
        else:
            live = deep_merge(spec_fields(plan_of(req, None)), kept)
    assert frozen == live
    assert json.dumps(frozen, sort_keys=True) == json.dumps(live, sort_keys=True)  # same types, same JSON


# Defaults the live request changed after the copy was frozen, on purpose: the rows the migration reads were
# priced with the frozen default, so the copy keeps it. Each with why.
DEFAULTS_CHANGED_SINCE_FROZEN = {
    # issue 37: the runner's QLoRA no longer upcasts embeddings, norms and lm_head to fp32 (bf16 compute)
    "qlora_upcast": (True, False),
}


def test_the_frozen_request_has_every_field_and_default_of_the_live_one():
    """Every field of the migration's copy is the live request's, with the same default, type and bounds, in
    the same order. Fields the live request gained after the copy was frozen (a sweep's eval_every, say) are
    not the migration's business: rows it migrates were written before them."""
    from bot.planner.request import EstimateRequest

    frozen = _frozen_plan_migration()._Request
    live = EstimateRequest.model_fields
    assert [n for n in live if n in frozen.model_fields] == list(frozen.model_fields)
    for name, copy in frozen.model_fields.items():
        if name in DEFAULTS_CHANGED_SINCE_FROZEN:
            continue
        field = live[name]
        assert (copy.default, copy.annotation, repr(copy.metadata)) == (
            field.default,
            field.annotation,
            repr(field.metadata),
        ), name
    for name, (then, now) in DEFAULTS_CHANGED_SINCE_FROZEN.items():
        assert frozen.model_fields[name].default == then, name
        assert getattr(EstimateRequest(model="m", method="qlora"), name) == now, name
