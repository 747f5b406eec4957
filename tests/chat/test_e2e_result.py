"""Every ending leaves a result, end to end: real tiny training on this CPU through the chat commands, the
real engine and the local provider.

- A job stopped by its owner half-way: its card points at its newest checkpoint, which peft loads on the
  base model; `resume JOB` continues the same job to its last step, the loss going on from where it was.
- A job stopped by its budget: `resume JOB` alone is refused with the cap that would let it finish;
  `resume JOB max_cost=...` continues it to the end, its spend counting both runs.
- `clone JOB steps=... lr=...` relaunches it with the changes, estimated and priced again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.worlds import ConsoleWorld, console_world
from fakes.worlds import console_text as text

from bot.engine.record.jobstate import FINAL

# Long enough that a quiet fast machine (~25 steps/s on this tiny model) is still training when a checkpoint
# past step 8 is seen and the job is stopped (checkpoints every 0.3 s); short enough for a loaded one.
MAX_STEPS = 80
# The job's training options, as a person types them; only the cadence of checkpoints and reports is the
# test's own (seconds instead of minutes).
OPTIONS = (
    "seq=256 batch=4 accum=1 r=8 alpha=16 lr=1e-2 warmup=5% scheduler=cosine "
    f"steps={MAX_STEPS} seed=0 plateau=no checkpointing=no"
)
CADENCE = {"checkpoint": {"every_minutes": 0.005, "keep": 2}, "report": {"every_seconds": 0.3}}


@pytest.fixture
def world(tmp_path: Path, tiny_model: Path) -> Iterator[ConsoleWorld]:
    """fakes.worlds.ConsoleWorld on the suite's one tiny model (tests/chat/conftest.py)."""
    with console_world(tmp_path, tiny_model, CADENCE) as w:
        yield w


def _loads_with_peft(base: Path, checkpoint: str) -> int:
    """PeftModel.from_pretrained on the base, as the card says; the number of adapter tensors loaded."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), checkpoint)
    saved = load_file(f"{checkpoint}/adapter_model.safetensors")
    params = {n.replace(".default.", "."): p for n, p in model.named_parameters() if "lora_" in n}
    assert saved and all(torch.equal(params[n].detach(), t) for n, t in saved.items())
    return len(saved)


def _losses(world: ConsoleWorld, job_id: str) -> list[tuple[int, float]]:
    return world.job(job_id).losses


@pytest.mark.slow
def test_stopped_by_its_owner_then_resumed_to_the_end(world: ConsoleWorld) -> None:
    job_id = world.launch(f"launch {world.model} dataset={world.data} {OPTIONS} max_cost=$20")
    world.until(lambda: _checkpointed_mid_run(world, job_id), "a checkpoint past step 8")
    stop = world.say(f"stop {job_id}")
    assert "Stopping job" in text(stop)
    world.until(lambda: world.job(job_id).state in FINAL, "the stop")
    stopped = world.job(job_id)
    assert stopped.state == "stopped" and stopped.stop_reason == "user", stopped.message
    assert stopped.output_uri is None and stopped.checkpoint_uri
    assert 0 < stopped.checkpoint_step < MAX_STEPS
    card = text(world.say(f"status {job_id}"))
    assert f"Checkpoint {stopped.checkpoint_uri} (step {stopped.checkpoint_step})" in card
    assert f"resume {job_id}" in card and "PeftModel.from_pretrained" in card
    assert _loads_with_peft(world.model, stopped.checkpoint_uri) > 0  # the result, usable as it is
    before = _losses(world, job_id)

    resumed = world.say(f"resume {job_id}")
    assert f"Resuming job {job_id} from {stopped.checkpoint_uri}" in text(resumed), text(resumed)
    world.until(lambda: world.job(job_id).state in FINAL, "the end of the resumed run")
    done = world.job(job_id)
    assert done.state == "succeeded" and done.step == MAX_STEPS, _audit(world, job_id)
    assert done.output_uri and Path(done.output_uri, "adapter_model.safetensors").is_file()
    # The loss goes on from where the stopped run left it, not from an untrained model's.
    losses = _losses(world, job_id)
    first_loss, last_before = before[0][1], before[-1][1]
    after = [loss for step, loss in losses if step > stopped.checkpoint_step]
    assert after and after[0] < first_loss - 0.5 * (first_loss - last_before), (before, losses)
    assert after[-1] < last_before
    logs = [world.local.log_path(i).read_text() for i in _instance_ids(world, job_id)]
    assert len(logs) == 2 and f"resumed from {stopped.checkpoint_uri}" in logs[1]


@pytest.mark.slow
def test_stopped_by_its_budget_then_resumed_with_a_higher_cap(world: ConsoleWorld) -> None:
    from sqlalchemy import update

    from store.models import Job

    job_id = world.launch(f"launch {world.model} dataset={world.data} {OPTIONS} max_cost=$20")
    world.until(lambda: _checkpointed_mid_run(world, job_id), "a checkpoint past step 8")
    # The cap is reached now: lowered to what the job has spent (how long a CPU run takes on a shared
    # machine is not predictable enough to pick a cap it reaches half-way).
    cap = round(world.job(job_id).spend, 4)
    with world.engine.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(max_cost=cap))
        s.commit()
    world.until(lambda: world.job(job_id).state in FINAL, "the budget stop")
    stopped = world.job(job_id)
    assert stopped.state == "stopped" and stopped.stop_reason == "budget", stopped
    assert stopped.step < MAX_STEPS and stopped.checkpoint_uri, stopped
    assert _loads_with_peft(world.model, stopped.checkpoint_uri) > 0
    refused = text(world.say(f"resume {job_id}"))
    hint = f"cap: resume it with a higher cap, e.g. resume {job_id} max_cost=$"
    assert hint in refused, refused
    assert world.job(job_id).state == "stopped"
    resumed = text(world.say(f"resume {job_id} max_cost=$10"))
    assert "Resuming job" in resumed and "of max $10.00" in resumed, resumed
    world.until(lambda: world.job(job_id).state in FINAL, "the end of the resumed run")
    done = world.job(job_id)
    assert done.state == "succeeded" and done.step == MAX_STEPS, done.message
    assert done.spend > stopped.spend  # one job: both runs' spend, under the new cap
    assert done.max_cost == 10.0


@pytest.mark.slow
def test_clone_relaunches_with_changes(world: ConsoleWorld) -> None:
    job_id = world.launch(f"launch {world.model} dataset={world.data} {OPTIONS} max_cost=$20")
    world.say(f"stop {job_id}")  # a job in any state may be cloned; this one need not use the CPU
    clone_id = world.launch(f"clone {job_id} steps=12 lr=5e-3")
    assert clone_id != job_id
    world.until(lambda: world.job(clone_id).state in FINAL, "the clone")
    clone = world.job(clone_id)
    assert clone.state == "succeeded" and clone.step == 12 and clone.max_steps == 12, clone.message
    import json

    spec = json.loads(Path(clone.output_uri, "job.json").read_text())
    assert spec["learning_rate"] == 5e-3 and spec["max_steps"] == 12 and spec["lora"]["r"] == 8


def _checkpointed_mid_run(world: ConsoleWorld, job_id: str) -> bool:
    job = world.job(job_id)
    assert job.state not in FINAL, f"the job ended ({job.state}) before it could be stopped: raise MAX_STEPS"
    return job.checkpoint_step is not None and job.step >= 8


def _instance_ids(world: ConsoleWorld, job_id: str) -> list[str]:
    from sqlalchemy import select

    from store.models import Instance

    with world.engine.session() as s:
        rows = s.execute(select(Instance).where(Instance.job_id == job_id).order_by(Instance.id)).scalars()
        return [r.provider_instance_id for r in rows]


def _audit(world: ConsoleWorld, job_id: str) -> str:
    from sqlalchemy import select

    from store.models import AuditLog

    with world.engine.session() as s:
        rows = s.execute(select(AuditLog).where(AuditLog.job_id == job_id).order_by(AuditLog.id)).scalars()
        return "\n".join(f"{r.action} {r.actor} {r.details}" for r in rows)
