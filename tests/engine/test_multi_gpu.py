"""Estimate and runner agree on how several GPUs share the model (issue 10: a 70B LoRA on 4 x A100-80GB was
priced FSDP-sharded at ~50 GB per GPU while the runner used DDP, a full copy per GPU, and would OOM)."""

from __future__ import annotations

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.engine.launching.jobspec import spec_fields
from bot.planner.request import EstimateRequest
from runner.contract.spec import JobSpec


def runner_spec(est, gpus: int) -> JobSpec:  # type: ignore[no-untyped-def]
    fields = spec_fields(est.training, dataset_uri="s3://b/d.jsonl")
    return JobSpec.model_validate(
        {**fields, "job_id": "j1", "gpus": gpus, "checkpoint": {"uri": "s3://b/c"}, "output_uri": "s3://b/o"}
    )


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_runner_shards_the_way_the_estimate_priced(method: str, gpus: int) -> None:
    est = snapshot_plan(EstimateRequest(model="llama-3.1-8b", method=method, gpus=gpus, tokens=10**6))
    spec = runner_spec(est, gpus)
    assert est.training.sharding == est.memory.sharding
    assert spec.strategy(gpus) == est.memory.sharding  # "none" on one GPU, "fsdp" on several


def test_a_70b_lora_on_four_a100s_is_priced_and_run_sharded() -> None:
    req = EstimateRequest(model="llama-3.1-70b", method="lora", gpus=4, gpu="a100-80gb", tokens=10**6)
    est = snapshot_plan(req)
    one_copy = snapshot_plan(req.model_copy(update={"gpus": 1})).memory.per_gpu_gb
    assert est.memory.sharding == "fsdp" and est.memory.per_gpu_gb < 80 < one_copy  # DDP would not fit
    assert runner_spec(est, 4).strategy(4) == "fsdp"
