"""A sweep driven through the real engine and store with the fake cloud, the runner's evals fed as events:
each stage keeps the better half and stops the rest, the caps reserved never pass max_cost, the winner is the
best run; approval is a launch's; compare shows only what the caller may read. (SQLite and PostgreSQL.)"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from bot.engine.api import EngineError, PermissionDenied
from bot.engine.permissions import Permissions
from runner.contract.spec import EventKind, RunnerEvent, RunResults

from .conftest import estimate_for, request

GRID = {"learning_rate": [1e-4, 2e-4], "lora_r": [8, 16]}
_seq = itertools.count(1)


def _priced(engine: Any, fake: Any, *others: Any, **kw: Any) -> Any:
    """The sweep estimate, each run priced by the fake cloud's offer (10 steps, 1 h at $1/h; ``others``:
    dearer clouds' offers too)."""
    from bot.engine.control import sweeps

    engine.estimate = lambda req: estimate_for(fake, *others, hours=1.0)
    return sweeps.estimate_sweep(engine.ctx, engine.estimate, request(**kw), GRID)


def _eval(
    engine: Any,
    job_id: str,
    step: int,
    loss: float,
    kind: EventKind = EventKind.progress,
    fake: Any = None,
    before: float = 3.0,
) -> None:
    """What the job's runner reports: its eval at ``step``; finished, its results and its signed output's
    manifest digest too (``fake``: the cloud whose launch gave it its output folder)."""
    from bot.engine.watching.runner_events import ingest

    events = [
        RunnerEvent(job_id=job_id, seq=next(_seq), kind=EventKind.progress, step=step, evals=[(step, loss)])
    ]
    if kind is EventKind.finished:  # the runner's results event comes right before its last one
        results = RunResults(eval_before=before, eval_after=loss, result_step=step, last_step=step)
        events.append(
            RunnerEvent(job_id=job_id, seq=next(_seq), kind=EventKind.results, step=step, results=results)
        )
        output = _launched(fake, job_id).output_uri if fake is not None else None
        done = {"output_uri": output, "manifest_sha256": "ab" * 32} if output else {}
        events.append(RunnerEvent(job_id=job_id, seq=next(_seq), kind=kind, step=step, max_steps=10, **done))
    ingest(engine.ctx, job_id, events)


def _launched(fake: Any, job_id: str) -> Any:
    """The spec of the job's newest launch on ``fake``."""
    from runner.contract.spec import JobSpec

    specs = [JobSpec.model_validate_json(r.env["TUNEBOT_JOB_SPEC"]) for r in fake.launch_requests]
    return [s for s in specs if s.job_id == job_id][-1]


def _verification(engine: Any, sweep_id: str) -> str:
    """The job that measures the sweep's winner again (bot/engine/control/verify.py)."""
    view = engine.get_sweep(sweep_id)
    runs = {r.job.job_id for r in view.runs if r.job}
    (job,) = [j for j in engine.list_jobs() if j.sweep_id == sweep_id and j.job_id not in runs]
    return job.job_id


def _reserved(view: Any) -> float:
    return sum(r.cap if r.status == "running" else (r.job.spend if r.job else 0.0) for r in view.runs)


def test_each_stage_keeps_the_better_half_within_max_cost(make_engine: Any, fake: Any, clock: Any) -> None:
    from .fakes import FakeProvider

    other = FakeProvider("other", price=1.5)  # another cloud: where the winner is measured again
    engine = make_engine(providers={fake.name: fake, other.name: other})
    est = _priced(engine, fake, other, max_cost=20.0)
    assert est.feasible and est.survivors == [4, 2, 1] and est.steps[0] == [2, 4, 10]
    assert est.estimated_cost < est.needed_cost <= 20.0 and est.request.eval_split == 0.1
    view = engine.create_sweep(est, user="alice")
    assert view.state == "running" and [r.status for r in view.runs] == ["running"] * 4
    assert _reserved(view) <= 20.0 * 0.9 + 1e-9
    jobs = {r.index: r.job.job_id for r in view.runs}
    assert all(engine.get_job(j).state == "running" for j in jobs.values())
    # Stage 1 at step 2: losses 3.0, 1.0, 4.0, 2.0 -> runs 1 and 3 go on, 0 and 2 are stopped.
    for index, loss in {0: 3.0, 1: 1.0, 2: 4.0, 3: 2.0}.items():
        clock.advance(60)
        _eval(engine, jobs[index], 2, loss)
    engine.tick()
    view = engine.get_sweep(view.sweep_id)
    assert view.stage == 1 and [r.status for r in view.runs] == ["lost", "running", "lost", "running"]
    for index in (0, 2):
        job = engine.get_job(jobs[index])
        assert job.state == "stopped" and job.stop_reason == "sweep" and not fake.instances.get(job.job_id)
    assert _reserved(view) <= 20.0 * 0.9 + 1e-9
    assert engine.get_job(jobs[1]).max_cost == pytest.approx(view.runs[1].cap)  # raised within the reserve
    # Stage 2 at step 4: run 3 beats run 1 now; run 1 is stopped, run 3 trains to the end and wins.
    clock.advance(60)
    _eval(engine, jobs[1], 4, 0.9)
    _eval(engine, jobs[3], 4, 0.7)
    engine.tick()
    view = engine.get_sweep(view.sweep_id)
    assert view.stage == 2 and [r.status for r in view.runs] == ["lost", "lost", "lost", "running"]
    clock.advance(60)
    _eval(engine, jobs[3], 10, 0.5, EventKind.finished, fake=fake)
    engine.tick()
    engine.tick()
    # Its host's figure alone does not name it: its output is measured again by a verification job, which
    # trains nothing and measures the winner's signed output (bot/engine/control/verify.py).
    view = engine.get_sweep(view.sweep_id)
    assert view.state == "running" and view.winner is None, view.message
    checker = _verification(engine, view.sweep_id)
    verify = _launched(other, checker).verify  # on the other cloud: not a host any run of the winner had
    assert verify and verify.job_id == jobs[3] and verify.uri == _launched(fake, jobs[3]).output_uri
    assert verify.manifest_sha256 == "ab" * 32 and _launched(other, checker).stages is None
    _eval(engine, checker, 0, 0.51, EventKind.finished, before=3.0)
    engine.tick()
    engine.tick()
    view = engine.get_sweep(view.sweep_id)
    assert view.state == "done" and view.winner == jobs[3], view.message
    assert [r.status for r in view.runs] == ["lost", "lost", "lost", "won"]
    assert view.spend <= 20.0 and f"Winner: job {jobs[3]}" in (view.message or "")
    assert f"eval loss 3.0000 -> 0.5100 (-83%), measured again on another host (job {checker})" in (
        view.message or ""
    )
    assert view.spend == pytest.approx(sum(r.job.spend for r in view.runs) + engine.get_job(checker).spend)


def test_a_sweep_that_max_cost_cannot_cover_is_refused_before_anything_runs(
    make_engine: Any, fake: Any
) -> None:
    engine = make_engine()
    est = _priced(engine, fake, max_cost=2.0)
    assert not est.feasible and "is not enough: the worst case needs" in est.notes[-1]
    with pytest.raises(EngineError, match="is not enough"):
        engine.create_sweep(est, user="alice")
    assert engine.list_jobs() == []


def test_above_the_approval_amount_someone_else_approves_the_sweep(make_engine: Any, fake: Any) -> None:
    engine = make_engine(permissions=Permissions(admins=frozenset({"bob"}), approval_above=50.0))
    est = _priced(engine, fake, max_cost=80.0)
    view = engine.create_sweep(est, user="bob")
    assert view.state == "pending_approval" and engine.list_jobs() == []  # nothing rented yet
    with pytest.raises(PermissionDenied):
        engine.approve_sweep(view.sweep_id, approver="bob")  # not one's own
    other = _priced(engine, fake, max_cost=80.0)
    mine = engine.create_sweep(other, user="carol")
    approved = engine.approve_sweep(mine.sweep_id, approver="bob")
    assert approved.state == "running" and all(r.job and r.job.state == "running" for r in approved.runs)
    stopped = engine.stop_sweep(view.sweep_id, user="bob")
    assert stopped.state == "cancelled"


def test_a_sweep_larger_than_the_running_limit_is_refused(make_engine: Any, fake: Any) -> None:
    engine = make_engine(permissions=Permissions(max_running_per_user=3))
    est = _priced(engine, fake, max_cost=20.0)
    with pytest.raises(EngineError, match="runs its 4 configurations at once"):
        engine.create_sweep(est, user="alice")


def test_compare_shows_only_jobs_the_caller_may_read(make_engine: Any, fake: Any) -> None:
    engine = make_engine(permissions=Permissions(admins=frozenset({"admin"})))
    a = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    b = engine.create_job(request(learning_rate=1e-3), user="alice", estimate=estimate_for(fake))
    c = engine.create_job(request(), user="mallory", estimate=estimate_for(fake))
    view = engine.compare([a.job_id, b.job_id], user="alice")
    assert view.differing == ["learning_rate"] and [r.settings for r in view.runs][1] == {
        "learning_rate": "0.001"
    }
    with pytest.raises(EngineError, match=f"^no job {c.job_id}$"):  # as a job that does not exist
        engine.compare([a.job_id, c.job_id], user="alice")
    assert len(engine.compare([a.job_id, c.job_id], user="admin").runs) == 2


def test_a_sweep_is_read_by_its_owner_and_admins_only(make_engine: Any, fake: Any) -> None:
    """`/tune status sw-...` is `status`: another member's sweep (its runs, spend, datasets) is not shown."""
    engine = make_engine(permissions=Permissions(admins=frozenset({"admin"})))
    sweep = engine.create_sweep(_priced(engine, fake, max_cost=80.0), user="alice")
    assert engine.get_sweep(sweep.sweep_id, viewer="alice").owner == "alice"
    assert engine.get_sweep(sweep.sweep_id, viewer="admin").sweep_id == sweep.sweep_id
    with pytest.raises(PermissionDenied, match="another member's"):
        engine.get_sweep(sweep.sweep_id, viewer="mallory")


def test_the_approval_buttons_take_a_sweep(make_engine: Any, fake: Any) -> None:
    """Approve / Reject on a sweep's approval request are the jobs' buttons with the sweep's id."""
    from bot.chat.blockkit import to_message, violations
    from bot.chat.cards import sweep_approval_request
    from bot.chat.handlers import Actor, ChatHandlers

    policy = Permissions(admins=frozenset({"bob"}), approval_above=50.0)
    engine = make_engine(permissions=policy)
    chat = ChatHandlers(engine, policy)
    first = engine.create_sweep(_priced(engine, fake, max_cost=80.0), user="carol")
    second = engine.create_sweep(_priced(engine, fake, max_cost=80.0), user="carol")
    ask = sweep_approval_request(first, approvers=["bob"], threshold=50.0)
    assert [b.value for b in ask.buttons] == [first.sweep_id] * 2 and not violations(to_message(ask))
    assert "Not allowed" in chat.approve(first.sweep_id, Actor("carol")).text()  # not one's own
    approved = chat.approve(first.sweep_id, Actor("bob"))
    assert (
        f"approved sweep *{first.sweep_id}*" in approved.text()
        and engine.get_sweep(first.sweep_id).state == "running"
    )
    rejected = chat.reject(second.sweep_id, Actor("bob"))
    assert "rejected sweep" in rejected.text() and engine.get_sweep(second.sweep_id).state == "cancelled"


def test_the_kept_runs_are_let_past_their_boundary_by_a_decision_only_their_run_accepts(
    make_engine: Any, fake: Any, clock: Any
) -> None:
    """Every run's spec pauses it at each stage's last step (issue 36, item 4); the sweep lets the runs it
    keeps go on with a decision signed with their current run's key (the raised cap in it), writes none for
    the runs it stops, and writes it again for a kept job relaunched meanwhile (a new run waits again)."""
    from bot.engine.control import stages
    from bot.engine.launching import integrity
    from runner.contract.spec import JobSpec
    from runner.contract.stage import decision_uri, released

    engine = make_engine()
    view = engine.create_sweep(_priced(engine, fake, max_cost=20.0), user="alice")
    jobs = {r.index: r.job.job_id for r in view.runs}
    specs = [JobSpec.model_validate_json(req.env["TUNEBOT_JOB_SPEC"]) for req in fake.launch_requests]
    assert [s.stages.steps if s.stages else None for s in specs] == [[2, 4]] * 4  # stages end at 2, 4, 10

    def word(job_id: str) -> Any:
        """The decision in the job's current run's folder (its last run's, for a job stopped)."""
        run_id = stages.current_run(engine.ctx, job_id)
        spec = [s for s in specs if s.job_id == job_id and run_id in (None, s.run_id)][-1]
        run_id = spec.run_id
        target = Path(decision_uri(spec.checkpoint.uri))
        if not target.exists():
            return None
        return released(target.read_bytes(), integrity.run_key(engine.ctx, job_id, run_id), job_id, run_id)

    assert all(word(j) is None for j in jobs.values())  # nobody goes past step 2 before the sweep decides
    for index, loss in {0: 3.0, 1: 1.0, 2: 4.0, 3: 2.0}.items():
        clock.advance(60)
        _eval(engine, jobs[index], 2, loss)
    engine.tick()
    view = engine.get_sweep(view.sweep_id)
    for index in (1, 3):
        assert word(jobs[index]) == type(word(jobs[index]))(through=2, max_cost=view.runs[index].cap)
    assert word(jobs[0]) is None and word(jobs[2]) is None
    # Another key's decision is not the sweep's: a run accepts only its own run's.
    from runner.contract.stage import decision

    forged = decision(bytes(32), jobs[1], stages.current_run(engine.ctx, jobs[1]), through=10, max_cost=99.0)
    run_id = stages.current_run(engine.ctx, jobs[1])
    assert released(forged, integrity.run_key(engine.ctx, jobs[1], run_id), jobs[1], run_id) is None
    # Kept run 3 is preempted and relaunched: its new run waits at step 2 again and gets its own word.
    from bot.providers.base import InstanceStatus

    (iid,) = [i for i, inst in fake.instances.items() if inst.job_id == jobs[3]]
    before = stages.current_run(engine.ctx, jobs[3])
    fake.set_status(iid, InstanceStatus.preempted)
    for _ in range(5):
        engine.tick()
        clock.advance(30)
        if stages.current_run(engine.ctx, jobs[3]) not in (None, before):
            break
    after = stages.current_run(engine.ctx, jobs[3])
    assert after not in (None, before)
    specs = [JobSpec.model_validate_json(req.env["TUNEBOT_JOB_SPEC"]) for req in fake.launch_requests]
    engine.tick()
    assert word(jobs[3]) is not None and word(jobs[3]).through == 2


def _through_two_stages(
    engine: Any, view: Any, first: dict[int, float], second: dict[int, float]
) -> dict[int, str]:
    """The runs' jobs by index, after their hosts reported ``first`` (run index: eval loss) at step 2 and
    the kept runs ``second`` at step 4, each stage decided."""
    jobs = {r.index: r.job.job_id for r in view.runs}
    for step, losses in ((2, first), (4, second)):
        for index, loss in losses.items():
            _eval(engine, jobs[index], step, loss)
        engine.tick()
    return jobs


def _run_2_claims_0_01_through_its_stages(engine: Any, view: Any) -> dict[int, str]:
    """The runs' jobs by index, after both stages: run 2's host claimed an eval loss of 0.01 at each, the
    honest runs were ranked below it (run 1 kept to the second stage, then stopped)."""
    return _through_two_stages(engine, view, {0: 3.0, 1: 1.0, 2: 0.01, 3: 2.0}, {1: 0.9, 2: 0.01})


def test_a_host_claiming_0_01_at_every_stage_is_measured_again_and_excluded(
    make_engine: Any, fake: Any, clock: Any
) -> None:
    """Issue 38, item 2, played on 9a0c9c1: the host of run 2 reports an eval loss of 0.01 at every stage and
    at the end; the honest runs were stopped and the thread announced "3.0 -> 0.01 (-100%)" with that host's
    output as the sweep's adapter. Now the winner's output is measured again on another host before it is
    named: the claim does not hold, the run is excluded with both figures, and no winner is named."""
    from .fakes import FakeProvider

    other = FakeProvider("other", price=1.5)
    engine = make_engine(providers={fake.name: fake, other.name: other})
    view = engine.create_sweep(_priced(engine, fake, other, max_cost=20.0), user="alice")
    jobs = _run_2_claims_0_01_through_its_stages(engine, view)
    _eval(engine, jobs[2], 10, 0.01, EventKind.finished, fake=fake)
    engine.tick()
    checker = _verification(engine, view.sweep_id)
    assert _launched(other, checker).verify.job_id == jobs[2]
    assert engine.get_sweep(view.sweep_id).state == "running"  # nothing is announced meanwhile
    _eval(engine, checker, 0, 2.95, EventKind.finished, before=3.0)  # what another host measures
    engine.tick()
    engine.tick()
    view = engine.get_sweep(view.sweep_id)
    assert view.state == "failed" and view.winner is None, view.message
    assert [r.status for r in view.runs] == ["lost", "lost", "excluded", "lost"]
    said = f"its host reported eval loss 0.0100; measured again on another host (job {checker}): 2.9500"
    assert view.runs[2].note == said and said in (view.message or "")
    assert "no winner" in (view.message or "") and "Adapter" not in (view.message or "")
    assert "-100%" not in (view.message or "")


def test_a_winner_whose_host_has_the_only_offer_is_not_measured_by_that_host_and_names_no_winner(
    make_engine: Any, fake: Any, clock: Any
) -> None:
    """A marketplace offer is one machine: a "new instance" of the winner's own offer is its host measuring
    its own claim. With no other host's offer among the sweep's, nothing is launched to check it and the
    sweep names no winner, saying why (before: the check ran on the winner's offer and its claim held)."""
    engine = make_engine()
    view = engine.create_sweep(_priced(engine, fake, max_cost=20.0), user="alice")
    jobs = _run_2_claims_0_01_through_its_stages(engine, view)
    launches = len(fake.launch_requests)
    _eval(engine, jobs[2], 10, 0.01, EventKind.finished, fake=fake)
    for _ in range(3):
        engine.tick()
    assert len(fake.launch_requests) == launches  # no verification on the claimant's own machine
    view = engine.get_sweep(view.sweep_id)
    assert view.state == "failed" and view.winner is None, view.message
    assert view.runs[2].status == "excluded"
    assert "no offer on another host" in (view.runs[2].note or ""), view.runs[2].note
    assert "no winner" in (view.message or "") and "Adapter" not in (view.message or "")


def test_stopping_a_sweep_stops_the_verification_measuring_its_winner(
    make_engine: Any, fake: Any, clock: Any
) -> None:
    from .fakes import FakeProvider

    other = FakeProvider("other", price=1.5)
    engine = make_engine(providers={fake.name: fake, other.name: other})
    view = engine.create_sweep(_priced(engine, fake, other, max_cost=20.0), user="alice")
    jobs = _through_two_stages(engine, view, {0: 3.0, 1: 1.0, 2: 4.0, 3: 2.0}, {1: 0.9, 3: 0.7})
    _eval(engine, jobs[3], 10, 0.5, EventKind.finished, fake=fake)
    engine.tick()
    checker = _verification(engine, view.sweep_id)
    assert engine.get_job(checker).state == "running"
    engine.stop_sweep(view.sweep_id, user="alice")
    for _ in range(3):
        engine.tick()
    assert engine.get_sweep(view.sweep_id).state == "stopped"
    assert engine.get_job(checker).state in ("stopped", "stopping") and not other.live()


def test_a_verification_is_priced_as_what_it_does_not_as_a_run() -> None:
    """The winner's check starts, loads, reads the data and evaluates twice; it trains, answers and saves
    nothing. On ebab0c5 a sweep priced it as a run of one step beside all of its runs and it spent x0.09 of
    that: the sweep's spend fell below the range its quote promises (a CI run failed on it)."""
    from bot.engine.control import verify

    run = {
        "start": 4.0,
        "load": 1.0,
        "data": 0.5,
        "wandb": 1.0,
        "base_eval": 2.0,
        "steps": 30.0,
        "output": 1.5,
    }
    done = {"start": 4.0, "load": 1.0, "data": 0.5, "wandb": 1.0, "base_eval": 2.0, "evals": 2.0}
    assert verify.phases_of(run) == done
    assert verify.share(run) == pytest.approx(10.5 / 40.0)
    assert verify.share({}) is None and verify.share(None) is None  # no phases: priced whole (the safe side)
