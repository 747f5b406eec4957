"""Two jobs on one cloud and one bucket; job A's host attacks job B (issue 19, done means).

`/tune launch` on the fake Slack API for Alice's job A and Bob's job B -> the real engine -> the real Vast
client against the fake Vast API, whose instances run the real runner in sandboxes holding only what the
create call carried (fakes/remote_host.py). Storage is moto with authentication on and session policies and
credential expiry enforced as AWS does them (fakes/moto_sts.py).

With A's host's own environment (what a marketplace host owner reads), the test reads B's data, writes B's
progress.json with a "finished" event pointing at an attacker URL (signed with A's key) and plants a
checkpoint-999999 whose optimizer.pt runs code when unpickled; then B is preempted and resumes.

- scoped (the bot makes each launch STS credentials for its own folder, 60 s long, renewed at half-life):
  every attempt is refused by the store;
- static (a store that cannot scope: every host gets the bot's keys): the writes land, and are ignored -
  B's events must be signed with B's key, B's resume takes only a checkpoint whose manifest B's key signed.

Either way B finishes with its own loss, its own output and the spend its instances cost, and A finishes too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import fsspec
import pytest
from fakes.moto_sts import StsWorld, sts_server  # noqa: F401  (fixture)
from fakes.worlds import HostWorld, RunsCode, as_host, attempt, sts_world  # noqa: F401  (the `world` fixture)
from sqlalchemy import select

from runner.contract.spec import JobSpec
from store.models import CalibrationRun, Instance

pytestmark = pytest.mark.slow

# max_cost: a spending cap that no run on a slow, shared machine reaches (the cap is not what is tested)
COMMON = "seq=128 batch=4 accum=1 lr=1e-2 checkpointing=no plateau=no max_cost=$1"
STEPS_A, STEPS_B = 60, 120
EVIL = "https://evil.example/weights"


def wait_for_step(world: HostWorld, instance_id: str, step: int, timeout: float = 240.0) -> None:
    """The host's log reaches ``step``, the engine ticking meanwhile (it renews the runners' credentials)."""
    deadline = time.monotonic() + timeout
    while world.runner_step(instance_id) < step:
        assert time.monotonic() < deadline, world.hosts.log(instance_id)[-3000:]
        world.engine.tick()
        time.sleep(0.2)


def test_a_hostile_host_cannot_touch_another_job(world: HostWorld, tmp_path: Path) -> None:
    import torch

    store: StsWorld = world.store  # type: ignore[attr-defined]
    a = world.launch(f"dataset={world.tiny / 'data.jsonl'} steps={STEPS_A} {COMMON}", user="U_ALICE")
    b = world.launch(f"dataset={world.tiny / 'bob.jsonl'} steps={STEPS_B} {COMMON}", user="U_BOB")
    host_a = world.hosts.hosts[world.instances(a)[0].provider_instance_id]
    first_b = world.instances(b)[0].provider_instance_id
    spec_b = JobSpec.model_validate_json(world.hosts.hosts[first_b].env["TUNEBOT_JOB_SPEC"])
    wait_for_step(world, first_b, 2)

    # A's host owner, with what A's instance got.
    fs = as_host(host_a.env, store.server.url)
    b_root = spec_b.checkpoint.uri.removeprefix("s3://")
    forged = {
        "version": 1,
        "job_id": b,
        "seq": 5000,
        "kind": "finished",
        "step": STEPS_B,
        "max_steps": STEPS_B,
        "loss": 0.0001,
        "output_uri": EVIL,
        "timestamp": time.time() + 3600,
        "metrics": {"tokens_per_second": 1e9, "max_memory_reserved_gb": 0.1},
    }
    # The best A can sign with: its own job's key (every host gets one; without it the forgery would go
    # unsigned and prove nothing about the key check).
    from runner.contract.integrity import EVENT, sign

    assert host_a.env.get("TUNEBOT_JOB_KEY"), "A's host got no job key: events would go unsigned"
    forged = sign(bytes.fromhex(host_a.env["TUNEBOT_JOB_KEY"]), EVENT, forged)
    marker = tmp_path / "pwned"
    evil_pt = tmp_path / "optimizer.pt"
    torch.save({"state": RunsCode(str(marker)), "param_groups": []}, evil_pt)
    results = {
        "read B's data": attempt(lambda: fs.cat(spec_b.dataset.uri.removeprefix("s3://"))),
        "list B's folder": attempt(lambda: fs.ls(b_root, detail=False, refresh=True)),
        "write B's progress": attempt(
            lambda: fs.pipe_file(
                f"{b_root}/progress.json", json.dumps({"job_id": b, "events": [forged]}).encode()
            )
        ),
        "plant a checkpoint": attempt(
            lambda: (
                fs.put_file(str(evil_pt), f"{b_root}/checkpoint-999999/optimizer.pt"),
                fs.pipe_file(f"{b_root}/checkpoint-999999/COMPLETE", b"step 999999\n"),
            )
        ),
    }
    if world.scoped:  # type: ignore[attr-defined]
        assert set(results.values()) == {"refused (PermissionError)"}, results
    else:  # the bot's own keys: the writes land, and must be ignored
        assert results["write B's progress"] == results["plant a checkpoint"] == "done", results

    # The bot reads B's progress object: what A wrote there must change nothing. B's own runner rewrites that
    # object at each report, so a hostile host writes its forgery again until the bot has read it (on a
    # loaded machine B may report between A's write and the bot's next read).
    told = world.scoped  # type: ignore[attr-defined]
    for tick in range(60):
        world.engine.tick()
        time.sleep(0.3)
        told = told or "ignored" in world.thread_text(b)
        if told and tick >= 2:
            break
        if not world.scoped:  # type: ignore[attr-defined]
            fs.pipe_file(f"{b_root}/progress.json", json.dumps({"job_id": b, "events": [forged]}).encode())
    assert told, "the bot never read A's forgery in B's progress object"
    view = world.engine.get_job(b)
    assert (view.state, view.output_uri) == ("running", None), f"A's forged event ended B: {view}"
    # B is preempted after the attack: its resume must not take the planted checkpoint.
    wait_for_step(world, first_b, 4)
    world.vast.preempt(first_b)
    final = ("succeeded", "failed", "stopped", "cancelled")
    world.tick_until(lambda: all(world.state(j) in final for j in (a, b)), "both jobs", timeout=600)

    assert not marker.exists(), "the planted pickle ran"
    view_b = world.engine.get_job(b)
    last_b = world.instances(b)[-1].provider_instance_id
    log_b = world.hosts.log(last_b)
    assert view_b.state == "succeeded", (view_b.state, view_b.message, log_b[-3000:])
    assert world.engine.get_job(a).state == "succeeded", world.engine.get_job(a).message
    assert (
        len(world.instances(b)) == 2
        and "resumed from s3://" in log_b
        and "checkpoint-999999" not in log_b.split("resumed from")[1].splitlines()[0]
    )
    # B's own loss, output and spend.
    summary = json.loads(log_b.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["steps"] == STEPS_B
    assert view_b.step == STEPS_B and view_b.loss == pytest.approx(summary["final_loss"], rel=1e-6)
    # Its output is its last run's (each run writes its own folder: issue 28).
    spec_last = JobSpec.model_validate_json(world.hosts.hosts[last_b].env["TUNEBOT_JOB_SPEC"])
    assert view_b.output_uri == spec_last.output_uri
    assert EVIL not in json.dumps(view_b.model_dump(mode="json"))
    model = world.adapter(view_b.output_uri, tmp_path / "out-b")
    assert any("lora_A" in name for name, _ in model.named_parameters())
    with world.engine.session() as s:
        rows = list(s.execute(select(Instance).where(Instance.job_id == b)).scalars())
        runs = list(s.execute(select(CalibrationRun).where(CalibrationRun.job_id == b)).scalars())
    billed = sum((r.ended_at - r.launched_at) * r.price_per_hour / 3600 for r in rows)
    assert view_b.spend == pytest.approx(billed, abs=1e-6) and view_b.spend > 0  # shown to the micro-dollar
    assert all(r.tokens_per_second is None or r.tokens_per_second < 1e6 for r in runs)
    thread = world.thread_text(b)
    assert EVIL not in thread and "Finished" in thread
    if world.scoped:  # type: ignore[attr-defined]
        # A host that outlived half of its first credentials' 60 s was renewed by the bot and switched. On a
        # fast machine B's hosts may end sooner; tests/storage/test_launch_and_renewal.py pins renewal down.
        lived = max(r.ended_at - r.launched_at for r in rows)
        renewed = "storage credentials renewed" in log_b + world.hosts.log(first_b)
        assert renewed or lived < 45, (lived, log_b[-2000:])
    else:
        assert thread.count("ignored") >= 1  # told in B's thread (once per kind of thing)
        assert "Storage is not scoped per job" in thread
    fsb = fsspec.filesystem("s3")
    assert fsb.exists(f"{spec_last.output_uri.removeprefix('s3://')}/adapter_model.safetensors")
    assert spec_last.output_uri.startswith(f"s3://{store.bucket}/tunebot/{b}/runs/")
