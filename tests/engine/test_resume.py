"""Every ending leaves a result, and a stopped or failed job can go on: the card of a stopped job points at
its newest complete checkpoint (never at an output folder that does not exist); `resume` continues the same
job (same checkpoint folder, spend and cap counting everything), raising the cap goes through approval, and
only the owner or an admin may do it; `clone` relaunches with changed options."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.runner_events import checkpoint_event, signed

from bot.chat import cards
from bot.chat.terminal import cli_console, render
from bot.engine.api import EngineError, PermissionDenied
from bot.engine.permissions import OPERATOR, Permissions
from bot.providers.base import InstanceStatus
from runner.contract.spec import JobSpec

from .conftest import Recorder, estimate_for, request


def _spec(fake) -> JobSpec:  # noqa: ANN001
    return JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])


def _save_checkpoint(folder: str, step: int, *, complete: bool = True, engine=None, job=None) -> str:  # noqa: ANN001
    """What the runner leaves: checkpoint-N/ with the adapter files, COMPLETE written last; then, once it is
    complete, the signed event that announces it (what makes the bot acknowledge it: issue 28)."""
    path = Path(folder) / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    (path / "adapter_config.json").write_text("{}")
    if complete:
        (path / "COMPLETE").write_text(f"step {step}\n")
        if engine is not None:
            token = JobSpec.model_validate_json(job).report.token
            job_id = JobSpec.model_validate_json(job).job_id
            assert engine.record_runner_event(
                job_id, token, checkpoint_event(engine, job_id, step, step, folder)
            )
    return str(path)


def _card_text(view) -> str:  # noqa: ANN001
    import io

    buf = io.StringIO()
    render(cards.job_card(view), cli_console(buf))
    return " ".join(buf.getvalue().split())


def test_stopped_job_card_points_at_its_newest_checkpoint_not_a_missing_output(engine, fake, clock):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    folder, spec = _spec(fake).checkpoint.uri, fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]
    _save_checkpoint(folder, 10, engine=engine, job=spec)
    newest = _save_checkpoint(folder, 20, engine=engine, job=spec)
    _save_checkpoint(folder, 30, complete=False)  # a save killed half-way is not a result
    _save_checkpoint(folder, 40)  # nor one its run never announced (issue 28: not acknowledged)
    clock.advance(600)
    view = engine.stop(job.job_id, user="alice")
    assert view.state == "stopped" and view.stop_reason == "user"
    assert view.output_uri is None  # it used to name <job>/output, which a stopped job never wrote
    assert view.checkpoint_uri == newest and view.checkpoint_step == 20
    text = _card_text(view)
    assert f"Checkpoint {newest} (step 20)" in text
    assert f'PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("tiny"), "{newest}")' in text
    assert f"resume {job.job_id} [max_cost=$X] continues from it" in text
    assert f"clone {job.job_id} key=value" in text
    resume_buttons = [b for b in cards.job_card(view).buttons if b.action == "resume_job"]
    assert [b.value for b in resume_buttons] == [job.job_id]


def test_checkpoint_events_show_on_a_running_job_and_only_inside_its_folder(engine, fake):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    spec = _spec(fake)
    token, folder = spec.report.token, spec.checkpoint.uri
    base = {"job_id": job.job_id, "kind": "checkpoint"}
    mine = {
        **base,
        "seq": 1,
        "step": 5,
        "timestamp": 1.0,
        "checkpoint_uri": f"{folder}/checkpoint-5",
        "manifest_sha256": "5" * 64,
    }
    engine.record_runner_event(job.job_id, token, signed(engine, mine))
    assert engine.get_job(job.job_id).checkpoint_uri == f"{folder}/checkpoint-5"
    # a host naming a folder that is not this job's is not believed
    other = {
        **base,
        "seq": 2,
        "step": 9,
        "timestamp": 2.0,
        "checkpoint_uri": "s3://other/checkpoint-9",
        "manifest_sha256": "9" * 64,
    }
    engine.record_runner_event(job.job_id, token, signed(engine, other))
    view = engine.get_job(job.job_id)
    assert view.checkpoint_uri == f"{folder}/checkpoint-5" and view.checkpoint_step == 5


def test_resume_continues_the_same_job_from_its_checkpoint(engine, fake, clock):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=1.0))
    first = _spec(fake)
    ckpt = _save_checkpoint(
        first.checkpoint.uri, 12, engine=engine, job=fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]
    )
    clock.advance(900)
    stopped = engine.stop(job.job_id, user="alice")
    spent = stopped.spend
    assert spent == pytest.approx(0.25, abs=1e-6)
    clock.advance(3600)  # nothing bills while it is stopped
    view = engine.resume(job.job_id, user="alice")
    assert view.state == "running" and fake.creates == 2 and len(fake.live()) == 1
    again = _spec(fake)
    assert again.job_id == first.job_id and [p.uri for p in again.resume] == [ckpt]  # resumes there
    assert again.wandb.run_id == first.wandb.run_id and again.cost.spent_before == pytest.approx(spent)
    assert view.max_cost == stopped.max_cost and view.checkpoint_uri == ckpt
    assert view.stop_reason is None and view.message is None
    clock.advance(600)
    # one job: all its spend, before and after the resume
    assert engine.get_job(job.job_id).spend == pytest.approx(spent + 600 / 3600, abs=1e-6)
    resumed = [e for e in rec.events if e.kind == "resumed"]
    assert len(resumed) == 1 and ckpt in resumed[0].message and "step 12" in resumed[0].message
    # the runner ends it this time
    fake.set_status(
        next(i for i in fake.instances if fake.instances[i].status == InstanceStatus.running),
        InstanceStatus.exited,
        0,
    )
    engine.tick()
    assert engine.get_job(job.job_id).state == "succeeded"


def test_budget_stopped_job_needs_a_higher_cap_and_approval_above_the_threshold(make_engine, fake, clock):
    policy = Permissions(admins=frozenset({"admin"}), approval_above=50.0)
    engine = make_engine(permissions=policy)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=1.0), max_cost=2.0)
    token = _spec(fake).report.token
    for seq in range(30):  # $1/h, reporting progress: the projected spend reaches the $2 cap
        clock.advance(600)
        event = {"job_id": job.job_id, "seq": seq, "kind": "progress", "step": seq, "timestamp": float(seq)}
        engine.record_runner_event(job.job_id, token, signed(engine, event))
        engine.tick()
        if engine.get_job(job.job_id).state == "stopped":
            break
    stopped = engine.get_job(job.job_id)
    assert stopped.state == "stopped" and stopped.stop_reason == "budget", stopped
    with pytest.raises(EngineError, match=r"higher cap, e.g. `resume \w+ max_cost=\$"):
        engine.resume(job.job_id, user="alice")  # the same cap would stop it again at once
    with pytest.raises(EngineError, match="would stop it again"):
        engine.resume(job.job_id, user="alice", max_cost=stopped.spend)
    with pytest.raises(PermissionDenied, match="only the job's owner or an admin may resume it"):
        engine.resume(job.job_id, user="mallory", max_cost=10.0)
    assert engine.get_job(job.job_id).state == "stopped"  # refusals change nothing

    view = engine.resume(job.job_id, user="alice", max_cost=80.0)  # above the $50 approval amount
    assert view.state == "pending_approval" and fake.creates == 1
    with pytest.raises(PermissionDenied):
        engine.approve(job.job_id, approver="alice")  # never one's own
    view = engine.approve(job.job_id, approver=OPERATOR)
    assert view.state == "running" and view.max_cost == 80.0 and fake.creates == 2

    # a modest raise of a small job needs nobody
    job2 = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=0.5), max_cost=1.0)
    engine.stop(job2.job_id, user="alice")
    assert engine.resume(job2.job_id, user="alice", max_cost=3.0).state == "running"


def test_only_stopped_or_failed_jobs_resume(engine, fake, clock):
    done = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    fake.set_status(next(iter(fake.instances)), InstanceStatus.exited, 0)
    engine.tick()
    assert engine.get_job(done.job_id).state == "succeeded"
    with pytest.raises(EngineError, match=f"nothing to resume; `clone {done.job_id}"):
        engine.resume(done.job_id, user="alice")
    failed = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    iid = [i for i, inst in fake.instances.items() if inst.status == InstanceStatus.running][0]
    fake.set_status(iid, InstanceStatus.exited, 1)
    engine.tick()
    assert engine.get_job(failed.job_id).state == "failed"
    view = engine.resume(failed.job_id, user="alice")
    assert view.state == "running" and view.checkpoint_uri is None  # no checkpoint: from the beginning


def test_clone_changes_options_through_the_options_table(engine, fake):
    from bot.planner import options

    job = engine.create_job(request(lora_r=8), user="alice", estimate=estimate_for(fake))
    changes = options.parse_values([("lr", "1e-4"), ("steps", "1k"), ("r", "32")])
    req = engine.clone_request(job.job_id, changes)
    assert (req.learning_rate, req.max_steps, req.lora_r) == (1e-4, 1000, 32)
    assert req.model == "tiny" and req.dataset == request().dataset  # everything else as it was
    with pytest.raises(EngineError, match="lr"):
        engine.clone_request(job.job_id, {"learning_rate": 5.0})
    with pytest.raises(EngineError, match="no job"):
        engine.clone_request("nope", {})


def test_a_spent_budget_refuses_the_resume_like_a_new_job(engine, fake, clock):
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake, hours=1.0), max_cost=5.0)
    clock.advance(1800)
    engine.stop(job.job_id, user="alice")  # $0.50 spent today
    engine.set_budget("user", "alice", daily=0.4, monthly=None, user=OPERATOR)
    with pytest.raises(EngineError, match="budget"):
        engine.resume(job.job_id, user="alice")
    assert engine.get_job(job.job_id).state == "stopped" and fake.creates == 1


def test_a_resume_is_announced_as_a_resume_not_a_recovery(engine, fake, clock):
    """Issue 27: `resume` of a stopped job was announced "Recovered: ..." like a relaunch after preemption."""
    from bot.chat.notifier import milestone_text

    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    spec = _spec(fake)  # the checkpoint its run announced (acknowledged: issue 28)
    announced = fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]
    _save_checkpoint(spec.checkpoint.uri, 20, engine=engine, job=announced)
    clock.advance(600)
    engine.stop(job.job_id, user="alice")
    rec.events.clear()
    view = engine.resume(job.job_id, user="alice")
    assert view.state == "running"
    started = [e for e in rec.events if str(e.kind) in ("job_started", "recovered")]
    assert [str(e.kind) for e in started] == ["job_started"], rec.kinds()
    said = milestone_text(started[0], view)
    assert said.startswith(":arrow_forward: Resumed:") and "step 20" in said, said
    assert "Recovered" not in said
    # a relaunch after a preemption is still a recovery
    rec.events.clear()
    fake.set_status(
        next(i for i, x in fake.instances.items() if x.status == InstanceStatus.running),
        InstanceStatus.preempted,
    )
    engine.tick()
    assert "recovered" in rec.kinds()
