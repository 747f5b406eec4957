"""The weekly report: who launched, approved and stopped what, estimates against actual cost and time,
spend per day by person, idle volumes and budgets, published as a typed report for the chat to render."""

from __future__ import annotations

import pytest
from fakes.runner_events import signed

from bot.engine.api import WeeklyReport
from bot.engine.money.weekly import describe
from bot.engine.permissions import Permissions
from bot.engine.record.spend import DAY
from runner.contract.spec import JobSpec
from store.models import VolumeRecord

from .conftest import Recorder, estimate_for, request


@pytest.mark.parametrize(
    "action,details,expected",
    [
        (
            "create",
            {"offer": {"provider": "vast", "gpu": "rtx-4090", "total_cost": 3.2}},
            ("launched", "vast rtx-4090", {"estimated": 3.2}, None),
        ),
        ("transition:pending_approval->approved", {}, ("approved", None, {}, None)),
        ("transition:pending_approval->cancelled", {"reason": "rejected"}, ("rejected", None, {}, None)),
        ("transition:pending_approval->cancelled", {"reason": "user"}, ("cancelled", "user", {}, None)),
        ("stop-requested", {"reason": "user"}, ("stopped", None, {}, None)),
        ("stop-requested", {"reason": "budget"}, ("stopped", "budget", {}, None)),
        ("volume-delete", {"provider": "runpod", "volume_id": "v1"}, ("deleted volume", None, {}, None)),
        ("volume-keep", {"days": 7.0}, ("kept volume", None, {}, 7.0)),
        ("set-budget", {"daily": None, "monthly": 400.0}, ("set budget", None, {"monthly": 400.0}, None)),
        ("transition:approved->launching", {}, None),
        ("adopt", {}, None),
    ],
)
def test_audit_rows_as_people_say_them(action: str, details: dict, expected: tuple | None) -> None:
    assert describe(action, "alice", details) == expected


def test_a_week_of_work_in_one_report(make_engine, fake, clock) -> None:  # noqa: ANN001
    engine = make_engine(permissions=Permissions(admins=frozenset({"boss"})))
    rec = Recorder(engine.bus)
    cheap = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=1.0))
    token = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token
    big = engine.create_job(request(), user="bob", estimate=estimate_for(fake, hours=100.0))
    assert big.state == "pending_approval"
    engine.approve(big.job_id, approver="boss")
    engine.set_budget("user", "alice", daily=None, monthly=100.0, user="boss")
    clock.advance(1800)
    finished = {"job_id": cheap.job_id, "seq": 1, "kind": "finished", "step": 10, "output_uri": "/out/a"}
    assert engine.record_runner_event(cheap.job_id, token, signed(engine, finished))
    engine.tick()
    engine.stop(big.job_id, user="bob")
    engine.tick()
    now = engine.now()
    with engine.session() as s:
        s.add(
            VolumeRecord(
                provider="fake",
                volume_id="v1",
                name="old-ckpts",
                size_gb=100,
                price_per_gb_month=0.1,
                tracked=True,
                owner="bob",
                first_seen_at=now - 20 * DAY,
                idle_since=now - 10 * DAY,
            )
        )
        s.commit()
    clock.advance(6 * DAY + 9 * 3600)  # Monday 09:00: the report covers Monday to Sunday before it

    report = engine.weekly_report()
    assert report.days[0] == "2025-12-01" and report.days[-1] == "2025-12-07"
    said = [(a.actor, a.action, a.job_id) for a in report.actions]
    assert ("alice", "launched", cheap.job_id) in said and ("bob", "launched", big.job_id) in said
    assert ("boss", "approved", big.job_id) in said and ("bob", "stopped", big.job_id) in said
    assert ("boss", "set budget", None) in said
    launched = next(a for a in report.actions if a.job_id == cheap.job_id and a.action == "launched")
    assert launched.detail == "fake rtx-4090" and launched.amounts == {"estimated": pytest.approx(1.0)}
    assert launched.target == "tiny lora"
    done = {j.job_id: j for j in report.finished}
    assert done[cheap.job_id].state == "succeeded"
    assert done[cheap.job_id].estimated_cost == pytest.approx(1.0)
    assert done[cheap.job_id].actual_cost == pytest.approx(0.5, abs=1e-3)  # half the estimated hour
    assert done[cheap.job_id].actual_hours == pytest.approx(0.5, abs=1e-3)
    assert done[big.job_id].state == "stopped" and done[big.job_id].estimated_cost == pytest.approx(100.0)
    assert report.daily_by_person["alice"][1] == pytest.approx(0.5, abs=1e-3)  # Tuesday
    assert report.total == pytest.approx(sum(sum(v) for v in report.daily_by_person.values()))
    assert [v.name for v in report.idle_volumes] == ["old-ckpts"]
    assert [(b.name, b.monthly) for b in report.budgets] == [("alice", 100.0)]
    event = next(e for e in rec.events if str(e.kind) == "weekly_report")
    assert WeeklyReport.model_validate(event.data["report"]) == report
