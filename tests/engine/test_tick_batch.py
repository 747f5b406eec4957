"""A tick over many running jobs: one listing per provider, per-instance status only where needed."""

from __future__ import annotations

from bot.providers.base import InstanceStatus, ProviderDownError

from .conftest import estimate_for, request


class Counting:
    """Wraps a FakeProvider and counts listing and status calls."""

    def __init__(self, fake) -> None:  # type: ignore[no-untyped-def]
        self.fake = fake
        self.lists = 0
        self.statuses: list[str] = []
        self.listing_down = False
        self.no_listing = False  # like a client whose cloud has no listing endpoint

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.fake, name)

    def list_instances(self):  # type: ignore[no-untyped-def]
        if self.no_listing:
            raise NotImplementedError
        self.lists += 1
        if self.listing_down:
            raise ProviderDownError("502", provider=self.fake.name)
        return self.fake.list_instances()

    def status(self, iid: str):  # type: ignore[no-untyped-def]
        self.statuses.append(iid)
        return self.fake.status(iid)


def five_jobs(make_engine, fake):  # type: ignore[no-untyped-def]
    counting = Counting(fake)
    eng = make_engine(providers={fake.name: counting})
    # five people: one person may run only TUNEBOT_MAX_RUNNING_PER_USER (4) jobs at once
    jobs = [eng.create_job(request(), user=f"user{k}", estimate=estimate_for(fake)) for k in range(5)]
    counting.lists, counting.statuses = 0, []
    return eng, counting, jobs


def test_one_listing_call_per_provider_and_no_status_calls(make_engine, fake, clock):
    eng, counting, jobs = five_jobs(make_engine, fake)
    clock.advance(30)
    assert eng.tick() == 5
    assert counting.lists == 1 and counting.statuses == []
    assert {eng.get_job(j.job_id).state for j in jobs} == {"running"}


def test_a_preempted_instance_in_the_listing_is_recovered(make_engine, fake, clock):
    eng, counting, jobs = five_jobs(make_engine, fake)
    victim = next(iter(fake.instances))
    fake.set_status(victim, InstanceStatus.preempted)
    clock.advance(30)
    eng.tick()
    views = [eng.get_job(j.job_id) for j in jobs]
    assert sorted(v.preemptions for v in views) == [0, 0, 0, 0, 1]
    assert {v.state for v in views} == {"running"} and fake.creates == 6
    assert victim not in fake.instances


def test_an_instance_missing_from_the_listing_is_asked_for_and_found_gone(make_engine, fake, clock):
    eng, counting, jobs = five_jobs(make_engine, fake)
    gone = next(iter(fake.instances))
    del fake.instances[gone]  # the host died: not listed, and status says not found
    clock.advance(30)
    eng.tick()
    assert counting.statuses == [gone]  # only the one the listing did not show
    assert sorted(eng.get_job(j.job_id).preemptions for j in jobs) == [0, 0, 0, 0, 1]


def test_a_failed_listing_decides_nothing_for_any_job(make_engine, fake, clock):
    eng, counting, jobs = five_jobs(make_engine, fake)
    counting.listing_down = True
    fake.instances.clear()  # whatever really happened, nothing is decided on a failed call
    clock.advance(30)
    eng.tick()
    assert counting.statuses == [] and fake.creates == 5
    assert {eng.get_job(j.job_id).state for j in jobs} == {"running"}
    assert {eng.get_job(j.job_id).preemptions for j in jobs} == {0}


def test_a_provider_without_a_listing_is_asked_instance_by_instance(make_engine, fake, clock):
    eng, counting, jobs = five_jobs(make_engine, fake)
    counting.no_listing = True
    clock.advance(30)
    eng.tick()
    assert counting.lists == 0 and len(counting.statuses) == 5
