"""Issue 38 item 1 on a cloud: a runner the bot stops saves and reports its checkpoint on the way out, and
`resume` continues from it.

`/tune launch` on the fake Slack API -> the real engine -> the real Vast client against the fake Vast API,
whose instances really run a team's runner image in sandboxes holding only what the create call carried
(tests/fakes/remote_host.py); storage is an S3-compatible server (moto). A cloud gives the bot no signal path
to the runner, and a destroy here kills the host at once, as a real cloud's does (``destroy_grace_s=0``):
nothing the runner does after it survives. So `/tune stop` mid-training must reach the runner through the
signed stop request beside its checkpoints (runner/contract/stop.py), and the bot must wait for its report
before it terminates. On 9a0c9c1 the stop terminated at once: the job stopped with "No checkpoint was saved"
and a resume started again from step 0.

The heartbeat is shrunk (an 8 s timeout: a beat, and a look for the request, every 2 s; a 1 s tick) rather
than the job made long.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.remote_host import HostPool
from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)
from fakes.worlds import HostWorld, host_world, listeners_settled
from sqlalchemy import select

from store.models import RunCheckpoint, RunnerEventRecord

pytestmark = pytest.mark.slow

IMAGE = "ghcr.io/acme/tunebot-runner:1"  # a team's prebuilt runner image: no install at start
STEPS = 1500  # ~15 s of the tiny model on a quiet machine: the stop lands mid-run, the resume finishes it
OPTIONS = (
    f"steps={STEPS} seq=64 batch=2 accum=1 lr=1e-3 checkpointing=no plateau=no eval=0 samples=0 max_cost=$1"
)


@pytest.fixture
def world(tmp_path: Path, s3_bucket: str) -> Iterator[HostWorld]:  # noqa: F811
    from runner.tiny import make_tiny

    bot = tmp_path / "bot"
    tiny = make_tiny(bot / "tiny").parent
    hosts = HostPool(
        tmp_path / "hosts",
        images={IMAGE: [str(Path(sys.executable).parent / "tunebot-runner")]},
        bot_roots=[bot],
        destroy_grace_s=0,  # a destroy kills: only what the runner reported before it counts
    )
    with host_world(
        bot,
        tiny,
        hosts,
        TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot",
        TUNEBOT_RUNNER_IMAGE=IMAGE,
        TUNEBOT_HEARTBEAT_TIMEOUT=8,
        TUNEBOT_RECONCILE_EVERY=1,
    ) as world:
        yield world


def test_a_user_stop_on_a_cloud_keeps_the_step_reached_and_resume_continues_from_it(world: HostWorld) -> None:
    job = world.launch(f"dataset={world.tiny / 'data.jsonl'} {OPTIONS}", user="U_ALICE")
    first = world.instances(job)[0].provider_instance_id
    world.tick_until(lambda: world.runner_step(first) >= 5, "training under way")
    asked_at = world.runner_step(first)

    world.stack.command(f"stop {job}", user="U_ALICE")
    listeners_settled()
    world.tick_until(lambda: world.state(job) == "stopped", "the stop")

    # The runner heard the bot's request (no signal reached it), saved where it was, said so and exited.
    log = world.hosts.log(first)
    assert "stop requested by the bot (user): finishing the current step" in log, log[-3000:]
    # (Its last summary line may not be in the log: the bot ends the instance once the report is in, while
    # the runner may still be closing W&B.)
    assert "SIGTERM" not in log, log[-3000:]
    with world.engine.session() as s:
        (said,) = s.execute(
            select(RunnerEventRecord).where(
                RunnerEventRecord.job_id == job, RunnerEventRecord.kind == "preempted"
            )
        ).scalars()
        acked = s.execute(select(RunCheckpoint).where(RunCheckpoint.job_id == job)).scalars().all()
    reached = said.step
    assert STEPS > reached >= asked_at >= 5
    assert said.payload["message"] == "stop requested by the bot (user): saved and exiting"
    # Acknowledged (its run's signed report, the run still current), and that is the stopped job's result.
    assert [(c.step, c.uri) for c in acked] == [(reached, said.payload["checkpoint_uri"])]
    view = world.engine.get_job(job)
    assert view.stop_reason == "user" and view.checkpoint_step == reached, view
    assert view.checkpoint_uri == said.payload["checkpoint_uri"]
    assert f"(step {reached})" in world.thread_text(job)
    # Terminated after the report, and billed until then: the wait is in the ledger.
    (inst,) = world.instances(job)
    assert inst.end_reason == "stopped:user" and inst.ended_at >= said.at
    assert view.spend >= inst.price_per_hour * (said.at - inst.launched_at) / 3600 > 0

    # `resume` continues from that checkpoint, on a new instance, to the end.
    world.stack.command(f"resume {job}", user="U_ALICE")
    listeners_settled()
    world.tick_until(lambda: len(world.instances(job)) == 2, "the resume's launch")
    # (1,500 steps: ~30 s alone on a 2-core machine, minutes beside another test's runners)
    world.tick_until(
        lambda: world.state(job) in ("succeeded", "failed", "stopped"), "the resumed run", timeout=900
    )
    second = world.instances(job)[1].provider_instance_id
    log = world.hosts.log(second)
    assert f"resumed from {said.payload['checkpoint_uri']} at step {reached}" in log, log[-3000:]
    spec = json.loads(world.hosts.hosts[second].env["TUNEBOT_JOB_SPEC"])
    assert [p["step"] for p in spec["resume"]] == [reached]
    view = world.engine.get_job(job)
    assert view.state == "succeeded" and view.step == STEPS, (view, log[-3000:])
    assert world.vast.live_instances() == []
