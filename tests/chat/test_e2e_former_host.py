"""A host that ran a job once, after the job was relaunched elsewhere (issue 28, part A, done means).

Attack reported on eac3cff: a host whose container was preempted (on a marketplace its owner can cause that)
kept its environment. It read the credentials the bot left for the next host, wrote a signed "finished" event
with its own adapter under the job's prefix, and the bot terminated the legitimate run and marked the job
succeeded with the forged result; it also signed a checkpoint manifest that the next resume accepted.

Played here end to end as that host owner plays it: `/tune launch` on the fake Slack API -> the real engine ->
the real Vast client against the fake Vast API, whose instances run the real runner in sandboxes holding only
what the create call carried (fakes/remote_host.py); storage is moto with authentication, session policies
and expiry enforced (fakes/moto_sts.py). Run 1 is preempted and the job relaunched (run 2); run 1's host then
uses its old environment. Run 2 is preempted in turn (run 3), and the job finishes. Scoped credentials and a
store that cannot scope (every host holds the bot's keys) both: the attempts are refused or count for nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fakes.moto_sts import StsWorld, sts_server  # noqa: F401  (fixture)
from fakes.worlds import HostWorld, RunsCode, as_host, attempt, sts_world  # noqa: F401  (the `world` fixture)
from sqlalchemy import update

from runner.contract.spec import JobSpec

pytestmark = pytest.mark.slow

STEPS = 150  # long enough for a SIGTERM to land mid-run (as in test_e2e_remote_host)
# max_cost: a spending cap that no run on a slow, shared machine reaches (the cap is not what is tested)
COMMON = "seq=128 batch=4 accum=1 lr=1e-2 checkpointing=no plateau=no max_cost=$1"


def signed(env: dict[str, str], purpose: str, obj: dict[str, Any]) -> dict[str, Any]:
    from runner.contract.integrity import sign

    return sign(bytes.fromhex(env["TUNEBOT_JOB_KEY"]), purpose, obj)


def spec_of(w: HostWorld, instance_id: str) -> JobSpec:
    return JobSpec.model_validate_json(w.hosts.hosts[instance_id].env["TUNEBOT_JOB_SPEC"])


def reach_step(w: HostWorld, instance_id: str, step: int, timeout: float = 400.0) -> None:
    """The host's log reaches ``step``: polled often (a tiny model's steps take milliseconds), the engine
    ticking every 2 s meanwhile (it renews the run's 60 s credentials)."""
    deadline = last_tick = time.monotonic()
    deadline += timeout
    while w.runner_step(instance_id) < step:
        assert time.monotonic() < deadline, w.hosts.log(instance_id)[-3000:]
        if time.monotonic() - last_tick > 2.0:
            w.engine.tick()
            last_tick = time.monotonic()
        time.sleep(0.01)


def test_a_former_host_cannot_act_for_the_job_after_a_relaunch(
    world: HostWorld,
    tmp_path: Path,
) -> None:
    import torch

    store: StsWorld = world.store  # type: ignore[attr-defined]
    scoped: bool = world.scoped  # type: ignore[attr-defined]
    b = world.launch(f"dataset={world.tiny / 'bob.jsonl'} steps={STEPS} {COMMON}", user="U_BOB")
    first = world.instances(b)[0].provider_instance_id
    reach_step(world, first, 1)
    world.vast.preempt(first)  # its owner preempts it: SIGTERM, the runner saves a checkpoint and exits
    world.tick_until(lambda: len(world.instances(b)) == 2, "the relaunch")
    second = world.instances(b)[1].provider_instance_id
    old_env, new_env = world.hosts.hosts[first].env, world.hosts.hosts[second].env
    old, new = spec_of(world, first), spec_of(world, second)
    if scoped:  # half of run 2's credentials' life passes: the bot leaves it fresh ones
        from store.models import Job

        with world.engine.session() as s:
            s.execute(
                update(Job).where(Job.id == b).values(credentials_issued_at=Job.credentials_issued_at - 600)
            )
            s.commit()
        world.engine.tick()

    # --- run 1's host, with its old environment -------------------------------------------------------
    fs = as_host(old_env, store.server.url)
    job_root = f"{store.bucket}/tunebot/{b}"
    next_creds = new_env.get("TUNEBOT_CREDENTIALS_URI", f"s3://{job_root}/credentials.json").removeprefix(
        "s3://"
    )
    new_root = new.checkpoint.uri.removeprefix("s3://")
    old_root = old.checkpoint.uri.removeprefix("s3://")
    stolen: dict[str, bytes] = {}
    results = {
        "list the job's folder": attempt(lambda: fs.ls(job_root, detail=False, refresh=True)),
        "read the next run's credentials": attempt(lambda: stolen.update(creds=fs.cat(next_creds))),
        "read the next run's progress": attempt(lambda: fs.cat(f"{new_root}/progress.json")),
    }
    if scoped:
        assert set(results.values()) == {"refused (PermissionError)"}, results
    if "creds" in stolen:  # what it could read of what the bot left for run 2 gives it no credentials
        from runner.credentials import read_renewal

        copy = tmp_path / "stolen.json"
        copy.write_bytes(stolen["creds"])
        assert read_renewal(str(copy), bytes.fromhex(old_env["TUNEBOT_JOB_KEY"]), b) is None
        assert "AWS_SECRET_ACCESS_KEY" not in stolen["creds"].decode(errors="replace")

    # Its own "adapter" as the job's output, with a manifest signed with its old key ...
    evil_out = old.output_uri.removeprefix("s3://")
    weights = b"the former host's adapter"
    fs.pipe_file(f"{evil_out}/adapter_model.safetensors", weights)
    files = {
        "adapter_model.safetensors": {"size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
    }
    out_manifest = json.dumps(
        signed(
            old_env, "output", {"version": 1, "kind": "output", "job_id": b, "run_id": None, "files": files}
        )
    ).encode()
    fs.pipe_file(f"{evil_out}/manifest.json", out_manifest)
    # ... and a newer checkpoint whose optimizer runs code, its manifest signed with the old key.
    from runner.contract import manifest

    marker = tmp_path / "pwned"
    planted = tmp_path / "checkpoint-999999"
    planted.mkdir()
    (planted / "adapter_model.safetensors").write_bytes(weights)
    torch.save({"state": RunsCode(str(marker)), "param_groups": []}, planted / "optimizer.pt")
    written = manifest.write(planted, job_id=b, step=999_999, key=bytes.fromhex(old_env["TUNEBOT_JOB_KEY"]))
    evil_ckpt = f"{old_root}/checkpoint-999999"
    for p in sorted(planted.iterdir()):
        fs.put_file(str(p), f"{evil_ckpt}/{p.name}")
    fs.pipe_file(f"{evil_ckpt}/COMPLETE", b"step 999999\n")
    now = time.time() + 3600
    forged = [
        signed(
            old_env,
            "event",
            {
                "version": 1,
                "job_id": b,
                "seq": 9000,
                "kind": "checkpoint",
                "step": 999_999,
                "checkpoint_uri": f"s3://{evil_ckpt}",
                "manifest_sha256": hashlib.sha256(written.read_bytes()).hexdigest(),
                "timestamp": now,
            },
        ),
        signed(
            old_env,
            "event",
            {
                "version": 1,
                "job_id": b,
                "seq": 9001,
                "kind": "finished",
                "step": STEPS,
                "max_steps": STEPS,
                "loss": 0.0001,
                "output_uri": old.output_uri,
                "manifest_sha256": hashlib.sha256(out_manifest).hexdigest(),
                "timestamp": now + 1,
                "metrics": {"max_memory_reserved_gb": 0.1, "tokens_per_second": 1e9},
            },
        ),
    ]
    progress = json.dumps({"job_id": b, "events": forged}).encode()
    writes = {
        "its own run's progress": attempt(lambda: fs.pipe_file(f"{old_root}/progress.json", progress)),
        "the next run's progress": attempt(lambda: fs.pipe_file(f"{new_root}/progress.json", progress)),
    }
    if scoped:  # its old credentials reach its own old folder until they expire (60 s here), nothing else
        assert writes["the next run's progress"] == "refused (PermissionError)", writes
    else:  # the bot's own keys: both land, and must count for nothing
        assert set(writes.values()) == {"done"}, writes
    pushed = [
        world.stack.http.post(
            f"{world.stack.url}/runner/events",
            content=json.dumps(e),
            headers={"Authorization": f"Bearer {old.report.token}", "Content-Type": "application/json"},
        )
        for e in forged
    ]
    assert all(r.status_code != 200 or r.json().get("ok") is False for r in pushed), [r.text for r in pushed]
    for _ in range(3):
        world.engine.tick()
        time.sleep(0.3)
    view = world.engine.get_job(b)
    assert view.state == "running" and view.output_uri is None, (view.state, view.output_uri, view.message)
    assert world.instances(b)[1].ended_at is None, "the legitimate run was terminated"
    assert "999999" not in (view.checkpoint_uri or "")
    # Run 2 resumed from the checkpoint run 1 saved on the SIGTERM, as the bot acknowledged it.
    assert [p.uri.rsplit("/", 1)[0] for p in new.resume] == [old.checkpoint.uri], new.resume

    # Run 2 is preempted in turn: the next resume takes only checkpoints the bot acknowledged.
    world.vast.preempt(second)
    world.tick_until(lambda: len(world.instances(b)) == 3, "the second relaunch", timeout=400)
    third = world.instances(b)[2].provider_instance_id
    resume = spec_of(world, third).resume
    assert resume and all("999999" not in p.uri for p in resume), resume
    world.tick_until(lambda: world.state(b) in ("succeeded", "failed", "stopped"), "job B", timeout=900)

    assert not marker.exists(), "the planted pickle ran"
    view = world.engine.get_job(b)
    log = world.hosts.log(third)
    assert view.state == "succeeded", (view.state, view.message, log[-3000:])
    assert "resumed from s3://" in log and "999999" not in log.split("resumed from")[1].splitlines()[0]
    summary = json.loads(log.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["steps"] == STEPS
    assert view.output_uri == spec_of(world, third).output_uri != old.output_uri
    assert view.loss == pytest.approx(summary["final_loss"], rel=1e-6) and view.loss != 0.0001
    model = world.adapter(view.output_uri, tmp_path / "out")
    assert any("lora_A" in name for name, _ in model.named_parameters())
