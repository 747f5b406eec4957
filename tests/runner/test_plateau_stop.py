"""A run whose (eval) loss stops improving stops by itself: saves, reports `plateau`, exits 0, has output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.checkpoint import CheckpointStore
from runner.contract.spec import EXIT_OK, parse_progress
from runner.train import run


def test_plateau_on_the_eval_loss_stops_saves_and_reports(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    # An improvement of 100 nats never happens: the detector stops after its baseline and `patience` looks.
    spec = runner_job(
        max_steps=50,
        seq_len=128,
        grad_accum=1,
        dataset={"eval_fraction": 0.05},
        plateau={
            "enabled": True,
            "patience": 1,
            "min_delta": 100.0,
            "every_steps": 2,
            "warmup_steps": 0,
            "ema": 0.0,
        },
        wandb={"mode": "offline", "project": "tunebot-test"},
        checkpoint={"every_minutes": 60},
    )  # only the plateau's save, however slow the machine
    summary, code = run(spec)
    assert code == EXIT_OK and summary.status == "plateau", summary
    assert summary.steps == 4  # eval every 2 steps: baseline at step 2, one look at step 4
    assert summary.output_uri == spec.output_uri
    assert (Path(spec.output_uri) / "adapter_model.safetensors").exists()
    assert CheckpointStore(spec.checkpoint.uri).complete_steps() == [4]
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    assert events[-1].kind.value == "plateau" and events[-1].output_uri == spec.output_uri
    assert list((tmp_path / "wandb").glob("offline-run-*"))  # W&B offline wrote its run without network
