"""Volumes are tracked, idle ones reminded about with their cost, deleted only on a person's word."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.engine.api import DailySummary, EngineError, PermissionDenied
from bot.providers.base import Volume

from .conftest import Recorder, estimate_for, request
from .fakes import FakeProvider

DAY = 86400.0


def test_idle_volume_reminder_with_costs_and_no_auto_delete(make_engine, clock, settings):
    p = FakeProvider("vol", volumes=True)
    eng = make_engine(providers={"vol": p})
    job = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    p.volumes["v1"] = Volume(
        provider="vol",
        volume_id="v1",
        name=f"tunebot-{job.job_id}",  # created for alice's job: hers
        size_gb=100,
        price_per_gb_month=0.1,
        idle_since=datetime.fromtimestamp(clock.t, UTC),
    )
    p.volumes["v2"] = Volume(
        provider="vol", volume_id="v2", name="busy", size_gb=50, price_per_gb_month=0.1, attached=True
    )
    rec = Recorder(eng.bus)
    views = {v.volume_id: v for v in eng.volumes()}
    assert views["v1"].cost_per_month == pytest.approx(10.0)
    assert eng.volume_reminders() == []  # not idle long enough yet
    clock.advance(settings.volume_idle_days * DAY + 1)
    (ev,) = eng.volume_reminders()
    assert ev.kind == "idle_volume" and ev.data["volume_id"] == "v1"
    assert ev.data["cost_per_month"] == pytest.approx(10.0)
    assert ev.data["cost_so_far"] == pytest.approx(
        10.0 * (settings.volume_idle_days * DAY + 1) / (30 * DAY), rel=1e-3
    )
    assert "$" in ev.message and "idle_volume" in rec.kinds()
    assert eng.volume_reminders() == []  # once a day, not on every pass
    clock.advance(DAY)
    assert len(eng.volume_reminders()) == 1
    assert p.deleted_volumes == []  # never deleted without a person
    eng.keep_volume("vol", "v1", user="alice")
    clock.advance(2 * DAY)
    assert eng.volume_reminders() == []  # kept: silenced
    eng.delete_volume("vol", "v1", user="alice")
    assert p.deleted_volumes == ["v1"]
    assert [v.volume_id for v in eng.volumes()] == ["v2"]
    # Storage is in the ledger.
    report = eng.spend("month")
    assert any(line.key == "vol" and line.amount > 0 for line in report.by_provider)


def test_delete_unknown_provider_is_refused(engine):
    with pytest.raises(EngineError):
        engine.delete_volume("nowhere", "v1", user="alice")


def _volume(provider: str, volume_id: str, name: str, *, idle_since: float | None = None) -> Volume:
    since = datetime.fromtimestamp(idle_since, UTC) if idle_since is not None else None
    return Volume(
        provider=provider,
        volume_id=volume_id,
        name=name,
        size_gb=100,
        price_per_gb_month=0.1,
        idle_since=since,
    )


def test_volumes_tunebot_never_created_are_nobodys_to_delete(make_engine, settings):
    """Attack (issue 19): any member deleted any cloud volume, tunebot's or not; the clicker counted as
    owner. A volume tunebot did not create or attach is listed as untracked and nobody deletes or keeps
    it through tunebot, admins included; nothing reaches the provider."""
    from bot.engine.permissions import Permissions

    p = FakeProvider("vast", volumes=True)
    p.volumes["prod-db"] = _volume("vast", "prod-db", "company-prod-database")
    eng = make_engine(providers={"vast": p}, permissions=Permissions(admins=frozenset({"root"})))
    (view,) = eng.volumes()
    assert view.tracked is False and view.owner is None
    for who in ("mallory", "alice", "root"):
        with pytest.raises(PermissionDenied, match="did not create or attach this volume"):
            eng.delete_volume("vast", "prod-db", user=who)
        with pytest.raises(PermissionDenied, match="did not create or attach"):
            eng.keep_volume("vast", "prod-db", user=who)
    assert p.deleted_volumes == [] and "prod-db" in p.volumes
    with pytest.raises(EngineError, match="no volume"):
        eng.delete_volume("vast", "never-listed", user="root")


def test_a_volume_created_for_a_job_belongs_to_the_jobs_owner(make_engine, clock):
    """The owner is recorded (the job's owner), not taken from whoever clicks: only the owner or an admin
    deletes or keeps it."""
    from bot.engine.permissions import Permissions

    p = FakeProvider("vast", volumes=True)
    eng = make_engine(providers={"vast": p}, permissions=Permissions(admins=frozenset({"root"})))
    job = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    p.volumes["v-label"] = _volume("vast", "v-label", f"tunebot-{job.job_id}")  # named with the job's label
    p.volumes["v-made"] = _volume("vast", "v-made", "ckpts")
    eng.track_volume("vast", "v-made", job_id=job.job_id)  # created or attached by tunebot for the job
    views = {v.volume_id: v for v in eng.volumes()}
    assert {(v.tracked, v.owner) for v in views.values()} == {(True, "alice")}
    with pytest.raises(PermissionDenied, match="only the volume's owner or an admin"):
        eng.delete_volume("vast", "v-label", user="mallory")
    with pytest.raises(PermissionDenied, match="only the volume's owner or an admin"):
        eng.keep_volume("vast", "v-made", user="mallory")
    assert p.deleted_volumes == []
    eng.delete_volume("vast", "v-label", user="alice")
    eng.delete_volume("vast", "v-made", user="root")
    assert p.deleted_volumes == ["v-label", "v-made"]


def test_untracked_idle_volumes_are_listed_but_not_reminded_about(make_engine, clock, settings):
    p = FakeProvider("vast", volumes=True)
    p.volumes["theirs"] = _volume("vast", "theirs", "someone-elses", idle_since=clock.t)
    eng = make_engine(providers={"vast": p})
    clock.advance(settings.volume_idle_days * DAY + 1)
    assert eng.volume_reminders() == []
    assert [v.volume_id for v in eng.volumes()] == ["theirs"]


def test_daily_summary_reports_yesterday(make_engine, clock):
    p = FakeProvider("p", price=2.0)
    eng = make_engine(providers={"p": p})

    job = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    clock.advance(3600)
    eng.stop(job.job_id, user="alice")
    eng.create_job(request(), user="bob", estimate=estimate_for(p, hours=100))  # awaiting approval
    clock.advance(DAY)
    rec = Recorder(eng.bus)
    summary = eng.daily_summary()
    assert [e.kind for e in rec.events] == ["daily_summary"]
    assert DailySummary.model_validate(rec.events[0].data["summary"]) == summary
    assert summary.spent == pytest.approx(2.0, abs=1e-4)
    assert [line.key for line in summary.by_user] == ["alice"]
    assert summary.finished == {"stopped": 1} and summary.pending_approval == 1
    assert "$" not in rec.events[0].message  # the engine writes no figures; the chat renders them


def test_daily_summary_of_today_so_far(make_engine, clock):
    p = FakeProvider("p", price=2.0)
    eng = make_engine(providers={"p": p})

    job = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    clock.advance(3600)
    eng.stop(job.job_id, user="alice")
    today = eng.daily_summary(day="today")
    assert today.day == "2025-12-02" and today.spent == pytest.approx(2.0, abs=1e-4)
    assert today.spent_today == pytest.approx(2.0, abs=1e-4)
    assert eng.daily_summary().spent == 0.0  # yesterday: nothing yet


def test_estimate_ranks_the_local_cpu_offer(tmp_path, settings):
    from bot.engine.service import Engine
    from bot.planner.request import EstimateRequest
    from bot.providers.local import LocalProvider

    local = LocalProvider(workdir=tmp_path / "local")
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e.db'}", providers={"local": local})
    est = eng.estimate(EstimateRequest(model="meta-llama/Llama-3.2-1B", seq_len=256, tokens=10_000))
    fitting = [o for o in est.offers if o.fits]
    # The launch buttons (labels) go to what this engine can launch: the local CPU.
    labelled = [o for o in fitting if o.labels]
    assert len(labelled) == 1 and labelled[0].provider == "local" and labelled[0].gpu == "cpu"
    assert set(labelled[0].labels) == {"cheapest", "fastest", "safest"}
    # Every cloud's snapshot prices are still shown, with what it takes to launch there.
    clouds = [o for o in fitting if o.provider != "local"]
    assert {o.provider for o in clouds} >= {"vast", "runpod", "lambda", "tensordock"}
    assert all("set " in o.reason and "_API_KEY" in o.reason for o in clouds)
    assert any("snapshot" in a for a in est.assumptions)
    eng.close()


def test_estimate_leaves_the_local_cpu_out_when_clouds_are_configured(tmp_path, settings):
    from bot.engine.service import Engine
    from bot.planner.request import EstimateRequest
    from bot.providers.local import LocalProvider

    local = LocalProvider(workdir=tmp_path / "local")
    cloud = FakeProvider("fake", price=0.5)
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e.db'}", providers={"local": local, "fake": cloud})
    est = eng.estimate(EstimateRequest(model="meta-llama/Llama-3.2-1B", seq_len=256, tokens=10_000))
    assert "local" not in {o.provider for o in est.offers}
    assert {o.provider for o in est.offers if o.labels} == {"fake"}
    eng.close()


def test_a_job_that_fits_only_on_unconfigured_clouds_says_which_key_to_set(tmp_path, settings):
    from bot.engine.api import EngineError
    from bot.engine.service import Engine
    from bot.planner.request import EstimateRequest
    from bot.providers.local import LocalProvider

    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello world"}\n' * 50)
    local = LocalProvider(workdir=tmp_path / "local")
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'e.db'}", providers={"local": local})
    # 8B LoRA: one cloud GPU holds it, this machine's RAM does not (fp32 on the CPU)
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", dataset=str(data))
    with pytest.raises(EngineError, match="no keys for"):
        eng.create_job(req, user="alice")
    assert eng.list_jobs() == [] and local.list_instances() == []
    eng.close()


def test_the_daily_summary_says_how_much_of_the_spend_is_volume_storage(make_engine, clock):
    from bot.chat.notifier import summary_text
    from store.models import VolumeRecord

    p = FakeProvider("p", price=2.0)
    eng = make_engine(providers={"p": p})
    now = eng.now()
    with eng.session() as s:  # 300 GB at $0.10/GB-month: $1.00 a day, seen since two days ago
        s.add(
            VolumeRecord(
                provider="p", volume_id="v1", size_gb=300, price_per_gb_month=0.1, first_seen_at=now - 2 * DAY
            )
        )
        s.commit()
    job = eng.create_job(request(), user="alice", estimate=estimate_for(p))
    clock.advance(3600)
    eng.stop(job.job_id, user="alice")
    summary = eng.daily_summary(day="today")
    assert summary.storage_today == pytest.approx(1.0 / 24, abs=1e-3)  # the hour since midnight
    assert summary.spent_today == pytest.approx(2.0 + 1.0 / 24, abs=1e-3)
    assert summary.storage_month == pytest.approx(summary.spent_month - 2.0, abs=1e-3)
    text = summary_text(summary)
    assert "today so far $2.04 (compute $2.00, volume storage $0.04)" in text, text
