"""Preemption safety: SIGTERM saves and exits 75; resumes are exact; a SIGKILL mid-save loses one interval."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.checkpoint import MARKER, CheckpointStore
from runner.contract.spec import EXIT_OK, EXIT_PREEMPTED, parse_progress
from runner.train import run

# Small enough to be quick, and crossing epoch boundaries (~6 steps per epoch) with grad accumulation.
RESUME_JOB = {
    "max_steps": 14,
    "seq_len": 128,
    "micro_batch_size": 4,
    "grad_accum": 2,
    "report": {"every_seconds": 0.01, "token": "job-token"},
}


@pytest.fixture
def small_job(runner_job: Callable[..., Any], runner_tiny_dir: Path, tmp_path: Path) -> Callable[..., Any]:
    """The tiny job on its first 100 records, so that a few steps cross epochs."""
    data = tmp_path / "small.jsonl"
    data.write_text("".join((runner_tiny_dir / "data.jsonl").read_text().splitlines(keepends=True)[:100]))
    return lambda **overrides: runner_job(**{"dataset": {"uri": str(data)}, **RESUME_JOB, **overrides})


@pytest.mark.slow
def test_three_sigterms_resume_exactly_and_events_arrive_in_order(
    small_job: Callable[..., Any],
    write_spec: Callable[..., Path],
    runner_process: Callable[..., Any],
    event_receiver: Any,
    tmp_path: Path,
) -> None:
    baseline_spec = small_job(
        checkpoint={"uri": str(tmp_path / "baseline-ckpt")}, output_uri=str(tmp_path / "baseline-out")
    )
    baseline, code = run(baseline_spec)
    assert code == EXIT_OK and baseline.steps == 14

    report = {**RESUME_JOB["report"], "callback_url": event_receiver.url}
    spec_path = write_spec(small_job(report=report))
    rng = random.Random(6)
    targets = sorted(rng.sample(range(2, 10), 3))  # leave steps to spare: the run must not end first
    resumed_from = []
    for target in targets:
        rc, summary = runner_process(spec_path).finish(sigterm_at_step=target, delay=rng.uniform(0, 0.05))
        assert rc == EXIT_PREEMPTED and summary["status"] == "preempted", summary
        assert summary["steps"] >= target
        resumed_from.append(summary["resumed_from"])
    rc, final = runner_process(spec_path).finish()
    assert rc == EXIT_OK and final["status"] == "finished", final

    assert resumed_from[0] is None and all(resumed_from[1:])
    assert final["resumed_from"].endswith(f"/checkpoint-{summary['steps']}")
    assert final["steps"] == baseline.steps == 14
    assert final["tokens"] == baseline.tokens
    assert abs(final["final_loss"] - baseline.final_loss) < 1e-3, (final["final_loss"], baseline.final_loss)

    # Events: every one reached the receiver with the job token, seq strictly increasing across resumes.
    events = [body for _auth, body in event_receiver.received]
    assert {auth for auth, _ in event_receiver.received} == {"Bearer job-token"}
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 0
    kinds = [e["kind"] for e in events]
    assert kinds.count("started") == 4 and kinds.count("preempted") == 3
    assert kinds[0] == "started" and kinds[-1] == "finished"
    # The progress object beside the checkpoints holds the same story for a bot that pulls.
    pulled = parse_progress((Path(small_job().checkpoint.uri) / "progress.json").read_bytes())
    assert [e.seq for e in pulled] == seqs
    # The bearer token travels only in the Authorization header: never in checkpoints or the output.
    for root in (Path(small_job().checkpoint.uri), Path(small_job().output_uri)):
        written = [f for f in root.rglob("*") if f.is_file()]
        assert written and not [f for f in written if b"job-token" in f.read_bytes()]


@pytest.mark.slow
def test_sigkill_mid_upload_to_s3_then_a_fresh_directory_resumes_from_the_previous_complete_checkpoint(
    small_job: Callable[..., Any],
    runner_tiny_dir: Path,
    write_spec: Callable[..., Path],
    runner_process: Callable[..., Any],
    moto_s3: str,
    tmp_path: Path,
) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.put(str(runner_tiny_dir / "model"), "tunebot/base/", recursive=True)
    fs.put_file(small_job().dataset.uri, "tunebot/data/small.jsonl")
    spec = small_job(
        max_steps=6,
        base_model="s3://tunebot/base/model",
        dataset={"uri": "s3://tunebot/data/small.jsonl"},
        checkpoint={"uri": "s3://tunebot/jobs/j1", "every_minutes": 1e-9, "keep": 2},
        output_uri="s3://tunebot/out/j1",
    )
    first_dir, fresh_dir = tmp_path / "host-1", tmp_path / "host-2"
    first_dir.mkdir(), fresh_dir.mkdir()
    write_spec(spec, "host-1/job.json"), write_spec(spec, "host-2/job.json")

    killed = runner_process(first_dir / "job.json", cwd=first_dir, env={"TUNEBOT_TEST_KILL_DURING_SAVE": "2"})
    try:
        killed.finish()
    except AssertionError:
        pass  # SIGKILL leaves no summary line
    assert killed.proc.returncode == -9, killed.stderr[-2000:]

    store = CheckpointStore(spec.checkpoint.uri)
    complete = store.complete_steps()
    fs.invalidate_cache()
    partial = [p for p in fs.ls("tunebot/jobs/j1") if "checkpoint-" in p and not fs.exists(f"{p}/{MARKER}")]
    assert len(complete) == 1 and len(partial) == 1  # the killed upload has files but no marker

    rc, summary = runner_process(fresh_dir / "job.json", cwd=fresh_dir).finish()
    assert rc == EXIT_OK, summary
    assert summary["resumed_from"] == f"s3://tunebot/jobs/j1/checkpoint-{complete[0]}"
    assert summary["steps"] == 6 and summary["output_uri"] == "s3://tunebot/out/j1"
    fs.invalidate_cache()
    assert fs.exists("tunebot/out/j1/adapter_model.safetensors")
    assert fs.exists("tunebot/out/j1/training_summary.json")
    assert fs.exists("tunebot/jobs/j1/progress.json")
    assert len(store.complete_steps()) == 2  # pruned to keep=2, the killed leftover removed
    assert not [p for p in fs.ls("tunebot/jobs/j1") if "checkpoint-" in p and not fs.exists(f"{p}/{MARKER}")]
