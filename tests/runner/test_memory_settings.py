"""The runner trains with the memory settings the planner prices (issue 29): expandable segments in the
caching allocator's configuration before CUDA starts, the AdamW implementation the spec names (fused by
default), and unpacked batches grouped by length."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.packing import GROUP_WINDOW, epoch_rng, plan_unpacked
from runner.cuda_env import ALLOC_CONF_ENV, EXPANDABLE, configure_allocator


def test_expandable_segments_are_added_and_an_operators_choice_is_kept() -> None:
    env: dict[str, str] = {}
    assert configure_allocator(env) == EXPANDABLE and env[ALLOC_CONF_ENV] == "expandable_segments:True"
    env = {ALLOC_CONF_ENV: "max_split_size_mb:512"}
    configure_allocator(env)
    assert env[ALLOC_CONF_ENV] == "max_split_size_mb:512,expandable_segments:True"  # other settings kept
    env = {ALLOC_CONF_ENV: "expandable_segments:False"}
    configure_allocator(env)
    assert env[ALLOC_CONF_ENV] == "expandable_segments:False"  # the operator said so


def test_the_runner_sets_the_allocator_before_training_starts(
    runner_job: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runner/cli.py configures the allocator before it imports the trainer (and so before CUDA starts); the
    launcher's workers inherit the environment."""
    import runner.train
    from runner.cli import run
    from runner.contract.spec import EXIT_OK, RunSummary

    monkeypatch.setenv(ALLOC_CONF_ENV, "")  # restored (or removed) after the test

    seen: dict[str, str | None] = {}

    def fake_train(spec: Any, **_: Any) -> tuple[RunSummary, int]:
        import os

        seen["conf"] = os.environ.get(ALLOC_CONF_ENV)
        return RunSummary(status="finished"), EXIT_OK

    monkeypatch.setattr(runner.train, "run", fake_train)
    path = tmp_path / "job.json"
    path.write_text(runner_job().model_dump_json())
    assert run(["--spec", str(path)]) == EXIT_OK
    assert seen["conf"] == "expandable_segments:True"


@pytest.mark.parametrize(
    ("impl", "flags"),
    [("fused", {"fused": True}), ("foreach", {"foreach": True}), ("for-loop", {"foreach": False})],
)
def test_adamw_runs_the_implementation_the_spec_names(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, impl: str, flags: dict[str, bool]
) -> None:
    import torch

    from runner.distributed import Group
    from runner.train import Preemption, Trainer

    trainer = Trainer(runner_job(optimizer_impl=impl), Preemption(None))
    trainer.group = Group(device=torch.device("cuda", 0))  # as on a GPU host; no CUDA is touched
    trainer.params = [torch.nn.Parameter(torch.zeros(4))]
    made: dict[str, Any] = {}

    class Recording(torch.optim.AdamW):
        def __init__(self, params: Any, **kwargs: Any) -> None:
            made.update(kwargs)
            super().__init__(params, lr=kwargs["lr"])

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    trainer._optimizer()
    assert {k: made[k] for k in flags} == flags
    assert json.loads(runner_job().model_dump_json())["optimizer_impl"] == "fused"  # the default


def test_unpacked_batches_are_grouped_by_length_and_pad_less() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(16, 4096) for _ in range(2000)]
    plan = plan_unpacked(lengths, micro_batch_size=4, rng=epoch_rng(42, 0))
    assert sorted(i for batch in plan for row in batch for i in row) == list(range(len(lengths)))
    assert all(len(b) == 4 for b in plan[:-1])  # only the last one may be short
    assert plan == plan_unpacked(lengths, micro_batch_size=4, rng=epoch_rng(42, 0))  # resumable by index

    def padding(p: list) -> int:
        return sum(max(lengths[r[0]] for r in b) * len(b) - sum(lengths[r[0]] for r in b) for b in p)

    shuffled = list(range(len(lengths)))
    epoch_rng(42, 0).shuffle(shuffled)
    plain = [[[i] for i in shuffled[s : s + 4]] for s in range(0, len(shuffled), 4)]
    assert padding(plan) < 0.1 * padding(plain)  # sorted within windows of GROUP_WINDOW micro-batches
    # the widest micro-batch (the memory peak) is the same; the order of micro-batches stays random
    assert max(max(lengths[r[0]] for r in b) for b in plan) == max(lengths)
    widths = [max(lengths[r[0]] for r in b) for b in plan[: GROUP_WINDOW * 2]]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_the_adamw_a_person_picks_reaches_the_runner_and_the_estimate_follows() -> None:
    """adamw_impl=foreach (torch's default when fused is not asked for) is priced with its temporary and goes
    to the runner in the JobSpec; the default (fused) spec carries nothing new, as older runners expect."""
    from fakes.snapshot_plan import snapshot_plan

    from bot.engine.launching.jobspec import spec_fields
    from bot.planner.options import parse_values
    from bot.planner.request import EstimateRequest
    from runner.contract.spec import JobSpec

    base = dict(model="llama-3.2-1b", method="full", precision="bf16", seq_len=512, tokens=1_000_000)
    chosen = EstimateRequest(**base, **parse_values([("adamw_impl", "foreach")]))
    assert chosen.optimizer_impl == "foreach"
    foreach, fused = snapshot_plan(chosen), snapshot_plan(EstimateRequest(**base))
    assert foreach.training is not None and fused.training is not None
    assert foreach.memory.per_gpu_gb > fused.memory.per_gpu_gb + 2.0  # one bf16 state: 2 B x 1.24B params
    assert any("foreach" in a for a in foreach.assumptions)
    fields = spec_fields(foreach.training)
    assert fields["optimizer_impl"] == "foreach"
    assert "optimizer_impl" not in spec_fields(fused.training)
    extra = {"job_id": "j1", "checkpoint": {"uri": "memory://c"}, "output_uri": "memory://o"}
    spec = JobSpec.model_validate({**fields, **extra, "dataset": {"uri": "memory://d.jsonl"}})
    assert spec.optimizer_impl == "foreach"
