"""A runner that could not reach W&B says so on its `started` event; the job's thread hears it once, however
many times the job is resumed while W&B stays away."""

from __future__ import annotations

from fakes.runner_events import signed

from runner.contract.spec import JobSpec

from .conftest import Recorder, estimate_for, request

NOTE = (
    "W&B is unreachable (api.wandb.ai:443 unreachable: Connection refused): logging offline; its files "
    "are kept in s3://b/j/checkpoints/wandb/; upload them with `wandb sync <folder>` once W&B answers"
)


def test_offline_wandb_note_is_posted_once_per_job(engine, fake):
    rec = Recorder(engine.bus)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    token = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"]).report.token
    first = {"job_id": job.job_id, "seq": 0, "kind": "started", "timestamp": 1000.0, "wandb_note": NOTE}
    again = {**first, "seq": 7, "timestamp": 2000.0, "message": "resumed from .../checkpoint-6"}
    assert engine.record_runner_event(job.job_id, token, signed(engine, first))
    # a resumed run, still without W&B
    assert engine.record_runner_event(job.job_id, token, signed(engine, again))
    notes = [e for e in rec.events if e.kind == "link"]
    assert len(notes) == 1, [e.message for e in notes]
    assert notes[0].message == NOTE and notes[0].data["name"] == "Weights & Biases"
    assert notes[0].job_id == job.job_id and notes[0].user == "alice"


def test_bot_wandb_mode_follows_wandb_mode_and_the_key(tmp_path, monkeypatch):
    from bot.engine.launching.launch import wandb_mode
    from bot.settings import Settings

    monkeypatch.delenv("WANDB_MODE", raising=False)  # tests/conftest.py sets offline for every test

    def mode(**env: str) -> str:
        return wandb_mode(Settings(TUNEBOT_DATA_DIR=str(tmp_path), **env))

    assert mode() == "disabled"
    assert mode(WANDB_API_KEY="k" * 40) == "online"
    assert mode(WANDB_API_KEY="k" * 40, WANDB_MODE="offline") == "offline"  # honoured, not forced online
    assert mode(WANDB_MODE="offline") == "offline"  # offline needs no key
    assert mode(WANDB_API_KEY="k" * 40, WANDB_MODE="disabled") == "disabled"
