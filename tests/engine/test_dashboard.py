"""App Home's figures: running jobs, spend per hour now, the month by person and team against budgets with
a projection, idle volumes; an admin sees the team, a member their own (the engine's policy)."""

from __future__ import annotations

import pytest

from bot.engine.money.dashboard import project_month
from bot.engine.permissions import Permissions
from bot.engine.record.spend import DAY
from store.models import VolumeRecord

from .conftest import estimate_for, request


def test_projection_is_month_to_date_plus_the_recent_daily_pace() -> None:
    month = 1_764_547_200.0  # 2025-12-01 00:00 UTC
    # day 10 of 31: $70 in the last 7 days -> $10 a day for the 21 days left
    assert project_month(100.0, 70.0, now=month + 10 * DAY, month_start=month, days=31) == pytest.approx(
        310.0
    )
    # a month two days old takes the pace of those two days
    assert project_month(20.0, 20.0, now=month + 2 * DAY, month_start=month, days=31) == pytest.approx(310.0)
    assert project_month(0.0, 0.0, now=month + 5, month_start=month, days=30) == 0.0


def test_admin_sees_the_team_and_a_member_their_own(make_engine, fake, clock) -> None:  # noqa: ANN001
    engine = make_engine(permissions=Permissions(admins=frozenset({"boss"})))
    alice = engine.create_job(request(), user="alice", team="ml", estimate=estimate_for(fake))
    bob = engine.create_job(request(), user="bob", estimate=estimate_for(fake))
    engine.set_budget("user", "alice", daily=None, monthly=100.0, user="boss")
    engine.set_budget("team", "ml", daily=None, monthly=500.0, user="boss")
    now = engine.now()
    with engine.session() as s:
        s.add(
            VolumeRecord(
                provider="fake",
                volume_id="vol-9",
                name="alice-ckpts",
                size_gb=300.0,
                price_per_gb_month=0.1,
                tracked=True,
                owner="alice",
                first_seen_at=now - 20 * DAY,
                idle_since=now - 10 * DAY,
            )
        )
        s.commit()
    clock.advance(3 * 3600)

    boss = engine.dashboard("boss")
    assert boss.is_admin
    assert {j.job_id for j in boss.running} == {alice.job_id, bob.job_id}
    running = {j.owner: j for j in boss.running}
    assert running["alice"].gpu == "rtx-4090" and running["alice"].price_per_hour == pytest.approx(1.0)
    assert running["alice"].spend == pytest.approx(3.0, rel=0.01)  # spend so far: 3 h at $1/h
    volume_per_hour = 300 * 0.1 / (30 * 24)
    assert boss.per_hour_now == pytest.approx(2.0 + volume_per_hour)  # two GPUs and the volume, now
    people = {p.name: p for p in boss.people}
    assert set(people) == {"alice", "bob"}
    assert people["alice"].budget == 100.0 and people["alice"].month_to_date >= 3.0
    assert people["alice"].projected_month > people["alice"].month_to_date  # more days to come at this pace
    assert people["alice"].per_hour_now == pytest.approx(1.0 + volume_per_hour)
    teams = {t.name: t for t in boss.teams}
    assert teams["ml"].budget == 500.0 and teams["ml"].per_hour_now == pytest.approx(1.0)
    assert boss.month_to_date == pytest.approx(sum(p.month_to_date for p in boss.people))
    assert [v.volume_id for v in boss.idle_volumes] == ["vol-9"] and boss.manageable == ["fake:vol-9"]

    mine = engine.dashboard("alice")
    assert not mine.is_admin and [j.owner for j in mine.running] == ["alice"]
    assert [p.name for p in mine.people] == ["alice"] and mine.teams == []
    assert mine.per_hour_now == pytest.approx(1.0 + volume_per_hour)
    assert mine.idle_volumes and mine.manageable == ["fake:vol-9"]  # her own volume
    other = engine.dashboard("bob")
    assert [j.owner for j in other.running] == ["bob"] and other.idle_volumes == []
    assert [j.job_id for j in other.mine] == [bob.job_id]
