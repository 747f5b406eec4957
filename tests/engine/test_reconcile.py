"""The reconciler: adopt, terminate strays and duplicates, mark lost, against fakes and fake clouds."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from bot.engine.launching.launch import claim
from bot.providers.base import LaunchRequest, OfferQuery, job_label
from bot.providers.registry import CLOUDS
from bot.settings import Settings
from store.models import Instance, Job

from .conftest import estimate_for, request
from .fakes import make_estimate


def test_adopts_instance_created_before_a_crash(engine, fake):
    engine.auto_launch = False
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    assert claim(engine, job.job_id, actor="test")  # launching, then the bot died after the create call
    inst = fake.add_instance(job_label(job.job_id))
    report = engine.reconcile()
    assert report.adopted == [inst.instance_id]
    with engine.session() as s:
        row = s.execute(select(Instance)).scalars().one()
    assert row.adopted and row.provider_instance_id == inst.instance_id and row.ended_at is None
    assert fake.creates == 0
    engine.resume_all()  # the stale launch is taken over and runs the adopted instance
    view = engine.get_job(job.job_id)
    assert view.state == "running" and fake.creates == 0 and len(fake.live()) == 1


def test_terminates_strays_and_duplicates_and_leaves_unlabelled_alone(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    stray = fake.add_instance(job_label("no-such-job"))
    dup = fake.add_instance(job_label(job.job_id))
    mine = fake.add_instance("someone-elses-box")
    report = engine.reconcile()
    assert set(report.terminated) == {stray.instance_id, dup.instance_id}
    live = {i.instance_id for i in fake.live()}
    assert mine.instance_id in live and stray.instance_id not in live and dup.instance_id not in live
    assert len([i for i in fake.live() if i.label == job_label(job.job_id)]) == 1
    assert engine.get_job(job.job_id).state == "running"


def test_terminates_instance_of_finished_job(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    engine.stop(job.job_id, user="alice")
    leaked = fake.add_instance(job_label(job.job_id))  # e.g. a create that errored but happened
    engine.reconcile()
    assert leaked.instance_id not in {i.instance_id for i in fake.live()}


def test_marks_lost_instances_and_recovers_the_job(engine, fake, clock):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    clock.advance(300)
    fake.instances.clear()  # the provider lost it (host died, manual deletion)
    report = engine.reconcile()
    assert len(report.lost) == 1
    engine.tick()
    view = engine.get_job(job.job_id)
    assert view.state == "running" and view.preemptions == 1 and fake.creates == 2


def test_provider_listing_failure_decides_nothing(engine, fake):
    from bot.providers.base import ProviderDownError

    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))

    def down():  # type: ignore[no-untyped-def]
        raise ProviderDownError("503", provider="fake")

    fake.list_instances = down  # type: ignore[method-assign]
    report = engine.reconcile()
    assert report.skipped_providers == ["fake"] and report.lost == []
    assert engine.get_job(job.job_id).state == "running"


def test_one_jobs_failure_is_reported_and_the_others_go_on(engine, fake):
    """Issue 38: `tunebot reconcile` printed one job's traceback and stopped. A step that fails for one job
    (here: its finished job's leaked instance will not terminate, a bug rather than a cloud error) is named in
    the report; the pass does not raise, and the other jobs' strays are still terminated."""
    first = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    second = engine.create_job(request(), user="bob", estimate=estimate_for(fake))
    engine.stop(first.job_id, user="alice")
    engine.stop(second.job_id, user="bob")
    broken = fake.add_instance(job_label(first.job_id))
    stray = fake.add_instance(job_label(second.job_id))
    terminate = fake.terminate

    def terminate_or_fail(instance_id: str) -> None:
        if instance_id == broken.instance_id:
            raise RuntimeError("the provider client broke")
        terminate(instance_id)

    fake.terminate = terminate_or_fail  # type: ignore[method-assign]
    report = engine.reconcile()  # does not raise
    assert report.terminated == [stray.instance_id]
    assert len(report.errors) == 1 and first.job_id in report.errors[0], report.errors
    assert "RuntimeError: the provider client broke" in report.errors[0]
    assert stray.instance_id not in {i.instance_id for i in fake.live()}


@pytest.mark.parametrize("cloud", list(CLOUDS))
def test_reconcile_against_fake_cloud_servers(cloud, tmp_path, settings, clock, s3_bucket):
    from fakes.clouds import FAKES
    from fakes.clouds.fixtures import client_for

    from bot.engine.service import Engine

    # A cloud host reads its data and writes its checkpoints by URI: the job needs object storage.
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"), TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot"
    )
    fake_cloud = FAKES[cloud]().start()
    try:
        client = client_for(fake_cloud)
        offer = client.search_offers(OfferQuery(interruptible=False, min_reliability=0.0))[0]
        eng = Engine(
            settings, db_url=f"sqlite:///{tmp_path / 'r.db'}", providers={cloud: client}, clock=clock
        )
        eng.terminate_deadline_s = 5.0
        est = make_estimate([offer])
        # A running job launched through the engine.
        job = eng.create_job(request(), user="alice", estimate=est)
        assert job.state == "running", job.message
        # A job whose launch crashed after the create call (launching, no row).
        eng.auto_launch = False
        crashed = eng.create_job(request(), user="bob", estimate=est)
        assert claim(eng, crashed.job_id, actor="test")
        created = client.launch(LaunchRequest(job_id=crashed.job_id, offer=offer, image="img"))
        # A stray: labelled as ours, no job.
        stray = client.launch(LaunchRequest(job_id="ghost-job", offer=offer, image="img"))
        report = eng.reconcile()
        assert created.instance_id in report.adopted
        assert stray.instance_id in report.terminated
        assert fake_cloud.live_instances(job_label("ghost-job")) == []
        assert len(fake_cloud.live_instances(job_label(job.job_id))) == 1
        # Lost: the DB row of the running job disappears at the provider.
        with eng.session() as s:
            rows = s.execute(select(Instance).where(Instance.job_id == crashed.job_id)).scalars().all()
        assert len(rows) == 1
        eng.stop(job.job_id, user="alice")
        assert fake_cloud.live_instances(job_label(job.job_id)) == []
        eng.close()
    finally:
        fake_cloud.stop()


def test_duplicate_rows_for_one_job_keep_the_newest(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    extra = fake.add_instance(job_label(job.job_id))
    with engine.session() as s:
        s.add(
            Instance(
                provider="fake",
                provider_instance_id=extra.instance_id,
                job_id=job.job_id,
                price_per_hour=1.0,
                launched_at=engine.now(),
                status="running",
            )
        )
        s.commit()
    engine.tick()
    assert [i.instance_id for i in fake.live()] == [extra.instance_id]
    assert engine.get_job(job.job_id).state == "running"


def test_a_claimed_launch_that_raises_goes_back_to_recovering_with_its_reason(engine, fake, monkeypatch):
    """launch_claimed: a launch that raises (here the cloud client's quote, with an error no provider error
    maps) never leaves its job launching: launching -> recovering, the claim released, the reason said."""
    from bot.engine.launching.launch import launch_claimed

    from .conftest import Recorder

    engine.auto_launch = False
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    claim_id = claim(engine, job.job_id, actor="test")
    assert claim_id and engine.get_job(job.job_id).state == "launching"

    def broken_quote(offer):  # type: ignore[no-untyped-def]
        raise RuntimeError("the client broke")

    monkeypatch.setattr(fake, "quote", broken_quote)
    events = Recorder(engine.bus)
    assert launch_claimed(engine.ctx, job.job_id, claim_id, actor="test") is False
    view = engine.get_job(job.job_id)
    assert (view.state, view.message) == ("recovering", "launch failed: RuntimeError: the client broke")
    with engine.session() as s:
        assert s.get(Job, job.job_id).claim_id is None
    said = [e for e in events.events if e.kind == "warning" and e.job_id == job.job_id]
    assert [e.data["launch_failed"] for e in said] == [view.message]
    assert fake.creates == 0
