"""A host that ran a job once keeps nothing that acts for the job's next run (issue 28, part A, item 1).

Attack reported on eac3cff: a host whose container was preempted (on a marketplace the owner can cause that)
kept its environment. The job's key was derived from the job id alone, so it was the same in every run; its
storage credentials reached the whole job folder and still worked; the renewal object (``credentials.json`` in
the job's folder) held the next host's credentials signed but readable. It read the next host's credentials,
wrote a signed "finished" event with its own adapter, and the bot terminated the legitimate run and marked the
job succeeded with the forged result; it also signed a checkpoint manifest that the next resume accepted.

Replayed here the way that host plays it - with only the environment its instance got (keys, credentials,
spec) - against the real engine and moto with session policies and expiry enforced (fakes/moto_sts.py); the
provider is the in-memory fake, the runners are played by the test. Scoped: every run gets STS credentials
for its own folder. Static: a store that cannot scope (every host holds the bot's keys): the writes land and
must count for nothing.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fakes.moto_sts import StsWorld
from fakes.snapshot_plan import snapshot_plan as plan_estimate
from fakes.worlds import as_host, attempt

from bot.engine.launching import offers as offers_mod
from bot.planner.request import EstimateRequest
from bot.providers.base import InstanceStatus
from bot.settings import Settings
from runner.contract.spec import JobSpec

ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(20)]


def engine_for(tmp_path: Path, world: StsWorld, **env: Any) -> tuple[Any, Any]:
    from engine.fakes import FakeProvider

    from bot.engine.service import Engine

    cloud = FakeProvider("vast", kind="container")
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        TUNEBOT_CHECKPOINT_URI=f"s3://{world.bucket}/tunebot",
        TUNEBOT_STORAGE_ROLE_ARN=world.role_arn,
        TUNEBOT_HEARTBEAT_TIMEOUT=3600,
        TUNEBOT_IDLE_STOP_MINUTES=600,
        **{**world.env, **env},
    )
    return Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"vast": cloud}), cloud


def fs_of(env: dict[str, str], world: StsWorld) -> Any:
    """The file system a host owner gets from an instance's environment."""
    return as_host(env, world.server.url)


def key_of(env: dict[str, str]) -> bytes:
    return bytes.fromhex(env["TUNEBOT_JOB_KEY"])


def sign(env: dict[str, str], purpose: str, obj: dict[str, Any]) -> dict[str, Any]:
    from runner.contract.integrity import sign as mac

    return mac(key_of(env), purpose, obj)


def event(job_id: str, seq: int, kind: str, **kw: Any) -> dict[str, Any]:
    return {"version": 1, "job_id": job_id, "seq": seq, "kind": kind, "timestamp": time.time(), **kw}


class Host:
    """What one instance's environment lets its owner do: write under its folder, sign with its key."""

    def __init__(self, env: dict[str, str], world: StsWorld) -> None:
        self.env, self.world = env, world
        self.spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
        self.fs = fs_of(env, world)
        self.events: list[dict[str, Any]] = []

    @staticmethod
    def path(uri: str) -> str:
        return uri.removeprefix("s3://")

    def report(self, *events: dict[str, Any], into: str | None = None) -> None:
        """Signed events appended to a progress object (its own run's, or ``into``: a checkpoint folder)."""
        signed = [sign(self.env, "event", e) for e in events]
        if into is None:
            self.events.extend(signed)
            body, target = self.events, self.spec.checkpoint.uri
        else:
            body, target = signed, into
        self.fs.pipe_file(f"{self.path(target)}/progress.json", json.dumps({"events": body}).encode())

    def checkpoint(self, folder: str, step: int, weights: bytes) -> str:
        """A checkpoint as the runner writes one (files, manifest signed with this host's key, COMPLETE last);
        the SHA-256 of the manifest's bytes."""
        from runner.contract import manifest

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp)
            (local / "adapter_model.safetensors").write_bytes(weights)
            (local / "trainer_state.json").write_text(json.dumps({"step": step}))
            written = manifest.write(local, job_id=self.spec.job_id, step=step, key=key_of(self.env))
            remote = f"{self.path(folder)}/checkpoint-{step}"
            for p in sorted(local.iterdir()):
                self.fs.put_file(str(p), f"{remote}/{p.name}")
            self.fs.pipe_file(f"{remote}/COMPLETE", b"done")
            return hashlib.sha256(written.read_bytes()).hexdigest()

    def output(self, folder: str, weights: bytes) -> str:
        """An output folder with its manifest (runner/contract/manifest.py's output form) signed with this
        host's key; the manifest's SHA-256."""
        files = {
            "adapter_model.safetensors": {"size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}
        }
        body = {"version": 1, "kind": "output", "job_id": self.spec.job_id, "run_id": run_of(self.spec)}
        raw = json.dumps(sign(self.env, "output", {**body, "files": files})).encode()
        self.fs.pipe_file(f"{self.path(folder)}/adapter_model.safetensors", weights)
        self.fs.pipe_file(f"{self.path(folder)}/manifest.json", raw)
        return hashlib.sha256(raw).hexdigest()


def run_of(spec: JobSpec) -> str | None:
    return getattr(spec, "run_id", None)  # (eac3cff had no runs: every launch was the job)


def running_instance(cloud: Any) -> str:
    (live,) = [i for i in cloud.live() if i.status == InstanceStatus.running]
    return live.instance_id


@pytest.mark.parametrize("mode", ["scoped", "static"])
def test_a_former_host_cannot_act_for_the_next_run(tmp_path: Path, sts_s3: StsWorld, mode: str) -> None:
    world = sts_s3
    scoped = mode == "scoped"
    eng, cloud = engine_for(
        tmp_path,
        world,
        TUNEBOT_STORAGE_CREDENTIALS="assume-role" if scoped else "static",
    )
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    est = offers_mod.for_this_engine(plan_estimate(req, offers=[cloud.offer()]), eng.providers, [])
    job_id = eng.create_job(req, user="alice", estimate=est).job_id

    # Run 1 trains, saves a checkpoint at step 5 and says so (signed): the bot acknowledges it.
    first = Host(cloud.launch_requests[-1].env, world)
    digest5 = first.checkpoint(first.spec.checkpoint.uri, 5, b"weights at step 5")
    uri5 = f"{first.spec.checkpoint.uri}/checkpoint-5"
    first.report(
        event(job_id, 0, "started", max_steps=100),
        event(job_id, 1, "checkpoint", step=5, checkpoint_uri=uri5, manifest_sha256=digest5),
    )
    eng.tick()
    assert eng.get_job(job_id).checkpoint_uri == uri5
    # Its host owner preempts the container: the bot relaunches the job.
    cloud.set_status(running_instance(cloud), InstanceStatus.preempted)
    eng.tick()
    assert eng.get_job(job_id).state == "running" and len(cloud.launch_requests) == 2
    second = Host(cloud.launch_requests[-1].env, world)
    second.report(event(job_id, 2, "started", step=5, max_steps=100, message=f"resumed from {uri5}"))
    eng.tick()
    if scoped:  # half of the second run's credentials' life passes: the bot renews them, in its own folder
        from sqlalchemy import update

        from store.models import Job

        with eng.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(credentials_issued_at=Job.credentials_issued_at - 10**5)
            )
            s.commit()
        eng.tick()
        assert second.fs.exists(Host.path(second.env["TUNEBOT_CREDENTIALS_URI"]))

    # --- the former host, with its old environment ---------------------------------------------------
    old, job_root = first, f"{world.bucket}/tunebot/{job_id}"
    next_creds = Host.path(
        second.env.get("TUNEBOT_CREDENTIALS_URI") or f"s3://{job_root}/runs/x/credentials.json"
    )
    forged_out = f"{Host.path(old.spec.output_uri)}"
    results = {
        "list the job's folder": attempt(lambda: old.fs.ls(job_root, detail=False, refresh=True)),
        "read the next run's credentials": attempt(lambda: old.fs.cat(next_creds)),
        "read the next run's progress": attempt(
            lambda: old.fs.cat(f"{Host.path(second.spec.checkpoint.uri)}/progress.json")
        ),
        "write the next run's progress": attempt(
            lambda: old.report(event(job_id, 10**6, "progress", step=99), into=second.spec.checkpoint.uri)
        ),
    }
    if scoped:
        assert set(results.values()) == {"refused (PermissionError)"}, results
    else:  # the bot's own keys: reads and writes land; nothing of it may count
        assert results["write the next run's progress"] == "done", results
    # Whatever it could read of what the bot left for the next run, it cannot open (sealed to that run).
    from runner.credentials import read_renewal

    if scoped:
        renewal = second.env["TUNEBOT_CREDENTIALS_URI"]
        assert read_renewal(renewal, key_of(old.env), job_id) is None
        assert read_renewal(renewal, key_of(second.env), job_id, run_of(second.spec)), (
            "the next run reads them"
        )

    # A "finished" event with its own adapter, and a newer checkpoint, all signed with its old key.
    digest_out = old.output(forged_out, b"the attacker's adapter")
    digest_evil = old.checkpoint(old.spec.checkpoint.uri, 999_999, b"the attacker's checkpoint")
    evil = f"{old.spec.checkpoint.uri}/checkpoint-999999"
    forged = [
        event(
            job_id, 10**6 + 1, "checkpoint", step=999_999, checkpoint_uri=evil, manifest_sha256=digest_evil
        ),
        event(
            job_id,
            10**6 + 2,
            "finished",
            step=100,
            max_steps=100,
            loss=0.0001,
            output_uri=old.spec.output_uri,
            manifest_sha256=digest_out,
            metrics={"max_memory_reserved_gb": 0.1, "tokens_per_second": 1e9},
        ),
    ]
    old.report(*forged)  # its own run's progress object (its credentials still reach it)
    if not scoped:
        old.report(*forged, into=second.spec.checkpoint.uri)  # and the next run's, with the bot's keys
    token = old.spec.report.token
    pushed = [eng.record_runner_event(job_id, token, sign(old.env, "event", e)) for e in forged]
    assert pushed == [False, False]  # its report token ended with its run
    for _ in range(3):
        eng.tick()
    view = eng.get_job(job_id)
    assert view.state == "running" and view.output_uri is None, (view.state, view.output_uri, view.message)
    assert running_instance(cloud), "the legitimate run was terminated"
    assert view.checkpoint_uri == uri5 and view.checkpoint_step == 5  # the forged checkpoint is not one
    # What made that so: each run its own key, and the next resume pinned to what run 1 acknowledged.
    assert run_of(second.spec) != run_of(first.spec) and key_of(second.env) != key_of(first.env)
    assert [(p.uri, p.step, p.manifest_sha256) for p in second.spec.resume] == [(uri5, 5, digest5)]

    # The legitimate run goes on, is preempted in turn: the next resume takes only acknowledged checkpoints.
    digest9 = second.checkpoint(second.spec.checkpoint.uri, 9, b"weights at step 9")
    uri9 = f"{second.spec.checkpoint.uri}/checkpoint-9"
    second.report(event(job_id, 3, "checkpoint", step=9, checkpoint_uri=uri9, manifest_sha256=digest9))
    eng.tick()
    assert eng.get_job(job_id).checkpoint_uri == uri9
    cloud.set_status(running_instance(cloud), InstanceStatus.preempted)
    eng.tick()
    third = Host(cloud.launch_requests[-1].env, world)
    assert [p.uri for p in third.spec.resume] == [uri9, uri5], third.spec.resume
    assert all("999999" not in p.uri for p in third.spec.resume)

    # The third run finishes with its own output: that, not the attacker's, is the job's result.
    third.report(event(job_id, 4, "started", step=9, max_steps=100))
    out_digest = third.output(third.spec.output_uri, b"the real adapter")
    third.report(
        event(
            job_id,
            5,
            "finished",
            step=100,
            max_steps=100,
            output_uri=third.spec.output_uri,
            manifest_sha256=out_digest,
        )
    )
    for _ in range(3):
        eng.tick()
    view = eng.get_job(job_id)
    assert view.state == "succeeded" and view.output_uri == third.spec.output_uri, (
        view.state,
        view.output_uri,
    )
    assert view.output_uri != old.spec.output_uri
    eng.close()
