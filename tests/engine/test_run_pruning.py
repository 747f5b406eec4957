"""Superseded runs' folders are pruned, all but what the bot pinned (bot/engine/watching/pruning.py).

Each run of a job writes under ``<job>/runs/<run>/``; before, a replaced run's folder was never deleted, so a
job's storage grew with every preemption (checkpoints nobody will load, progress objects, credentials). Here a
job's first run writes two checkpoints (the newer one acknowledged), its progress object and an unannounced
checkpoint, then is preempted and replaced; the second run resumes from the acknowledged one. Once the first
run's credentials have expired, the reconcile pass deletes its folder except that checkpoint; before then,
nothing is deleted. On a local folder and on S3 (moto).
"""

from __future__ import annotations

import hashlib
from typing import Any

import fsspec
import pytest
from sqlalchemy import select

from bot.engine.watching import pruning
from bot.providers.base import InstanceStatus
from bot.settings import Settings
from store.models import JobRun

from .conftest import estimate_for
from .conftest import request as job_request
from .test_runner_trust import as_host, env_of, spec_of


def _write(uri: str, data: bytes = b"x") -> None:
    fs, path = fsspec.core.url_to_fs(uri)
    fs.mkdirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def _files(root: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(root)
    path = path.rstrip("/")
    if not fs.exists(path):
        return []
    return sorted(p.removeprefix(path + "/") for p in fs.find(path))


def _checkpoint(folder: str, step: int) -> tuple[str, str]:
    """A complete checkpoint as the runner writes it (manifest, weights, COMPLETE last): (uri, digest)."""
    uri = f"{folder}/checkpoint-{step}"
    manifest = f'{{"step": {step}}}'.encode()
    _write(f"{uri}/adapter_model.safetensors", b"w" * 64)
    _write(f"{uri}/manifest.json", manifest)
    _write(f"{uri}/COMPLETE", b"")
    return uri, hashlib.sha256(manifest).hexdigest()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_replaced_runs_folder_is_pruned_once_its_credentials_expired(
    store: str, make_engine: Any, fake: Any, clock: Any, settings: Settings, request: pytest.FixtureRequest
) -> None:
    if store == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        settings = Settings(TUNEBOT_DATA_DIR=str(settings.data_dir), TUNEBOT_CHECKPOINT_URI=f"{bucket}/tb")
    engine = make_engine(settings=settings)
    job = engine.create_job(job_request(), user="alice", estimate=estimate_for(fake)).job_id
    spec, env = spec_of(fake, 0), env_of(fake, 0)
    folder = spec.checkpoint.uri  # <job>/runs/<run 1>/checkpoints
    run_root = folder.rsplit("/", 1)[0]
    old, old_digest = _checkpoint(folder, 5)
    acked, digest = _checkpoint(folder, 10)
    _checkpoint(folder, 15)  # written, never announced: no one resumes from it
    _write(f"{folder}/progress.json", b"{}")
    _write(f"{run_root}/credentials.json", b"sealed")
    for step, uri, sha in ((5, old, old_digest), (10, acked, digest)):
        event = {
            "version": 1,
            "job_id": job,
            "seq": step,
            "kind": "checkpoint",
            "step": step,
            "max_steps": 100,
        }
        event.update(checkpoint_uri=uri, manifest_sha256=sha, timestamp=clock())
        assert engine.record_runner_event(job, spec.report.token, as_host(event, env))
    # Run 1 is preempted; run 2 resumes from the newest acknowledged checkpoint, in run 1's folder.
    fake.set_status(next(iter(fake.instances)), InstanceStatus.preempted)
    engine.tick()
    engine.tick()
    assert engine.get_job(job).state == "running" and fake.creates == 2
    resume = spec_of(fake, 1).resume
    assert resume and resume[0].uri == acked
    before = _files(run_root)
    assert "checkpoints/checkpoint-15/COMPLETE" in before and "credentials.json" in before

    engine.reconcile()  # its credentials may still be valid: nothing is deleted
    assert _files(run_root) == before
    clock.advance(pruning.hold_s(engine.settings) + 1)
    engine.reconcile()
    kept = _files(run_root)
    # Run 1's folder holds only the checkpoints the job resumes from (the bot's newest acknowledged ones).
    assert kept == [
        "checkpoints/checkpoint-10/COMPLETE",
        "checkpoints/checkpoint-10/adapter_model.safetensors",
        "checkpoints/checkpoint-10/manifest.json",
        "checkpoints/checkpoint-5/COMPLETE",
        "checkpoints/checkpoint-5/adapter_model.safetensors",
        "checkpoints/checkpoint-5/manifest.json",
    ], kept
    with engine.session() as s:
        runs = s.execute(select(JobRun).where(JobRun.job_id == job).order_by(JobRun.number)).scalars().all()
    assert runs[0].pruned_at is not None and runs[1].pruned_at is None  # the current run is never pruned
    current = spec_of(fake, 1).checkpoint.uri
    _write(f"{current}/progress.json", b"{}")
    engine.reconcile()
    assert _files(run_root) == kept and _files(current) == ["progress.json"]
    if store == "local":
        fs, path = fsspec.core.url_to_fs(folder)
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path)) == ["checkpoint-10", "checkpoint-5"]


def test_a_run_with_expiring_credentials_is_kept_whole_for_their_lifetime(tmp_path: Any) -> None:
    """Scoped credentials last TUNEBOT_STORAGE_CREDENTIALS_SECONDS from their last renewal, which came while
    the run was current: its folder stays whole that long after it was replaced (plus a grace); without
    expiring credentials (a local folder, the bot's own keys) the grace alone."""
    base = {"TUNEBOT_DATA_DIR": str(tmp_path), "TUNEBOT_STORAGE_CREDENTIALS_SECONDS": 3600}
    scoped = Settings(**base, TUNEBOT_CHECKPOINT_URI="s3://b/tb", TUNEBOT_STORAGE_CREDENTIALS="assume-role")
    static = Settings(**base, TUNEBOT_CHECKPOINT_URI="s3://b/tb", TUNEBOT_STORAGE_CREDENTIALS="static")
    assert pruning.hold_s(scoped) == 3600 + pruning.GRACE_S
    assert pruning.hold_s(static) == pruning.hold_s(Settings(**base)) == pruning.GRACE_S
