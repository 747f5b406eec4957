"""The runner's measurements for calibration: steady speed after warm-up, no memory figures on a CPU."""

from __future__ import annotations

import torch

from runner.contract.spec import RunnerEvent, RunSummary
from runner.measure import WARMUP_STEPS, RunMeter


def test_steady_speed_skips_warm_up_and_cpu_has_no_memory_figures() -> None:
    meter = RunMeter(torch.device("cpu"))
    for i in range(WARMUP_STEPS + 4):
        meter.step(1000, 10.0 if i < WARMUP_STEPS else 0.5)  # slow warm-up steps are not the steady rate
    out = meter.result()
    assert out["tokens_per_second"] == 2000.0
    assert out["steady_steps"] == 4
    assert out["max_memory_reserved_gb"] is None and out["device_memory_used_gb"] is None


def test_too_short_a_run_reports_no_speed_and_metrics_travel_in_events() -> None:
    meter = RunMeter("cpu")
    meter.step(10, 1.0)
    assert meter.result()["tokens_per_second"] is None
    event = RunnerEvent(job_id="j", seq=1, kind="finished", metrics={"tokens_per_second": 5.0})
    assert RunnerEvent.model_validate_json(event.model_dump_json()).metrics == {"tokens_per_second": 5.0}
    assert RunnerEvent.model_validate({"job_id": "j", "seq": 1, "kind": "finished"}).metrics is None
    assert (
        RunSummary(status="finished", metrics={"tokens_per_second": 1.0}).metrics["tokens_per_second"] == 1.0
    )
