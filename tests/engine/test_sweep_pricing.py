"""A sweep's estimate prices the eval passes its runs make (one source for the cadence).

Every run of a sweep evaluates at its first stage's step (the stages end at its multiples). Before, the
planner priced each run's eval passes at the automatic cadence (max(10, steps / 50): 1 + 3 passes for 24
steps) while the runs' JobSpecs said every 6 steps (1 + 4 passes): the sweep's money plan was not what ran.
Here the real planner prices a sweep of four configurations on a tiny model and its data; the sweep is
launched on the local provider (a runner stand-in that sleeps); each run's JobSpec, as the runner receives it,
must make exactly the passes its estimate priced, at the cadence the sweep's stages need.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.planner.request import EstimateRequest
from bot.providers.local import LocalProvider
from bot.settings import Settings
from runner.contract.spec import JobSpec
from runner.contract.steps import evaluations

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
GRID = {"learning_rate": [1e-4, 2e-4], "lora_r": [8, 16]}


class Recording(LocalProvider):
    """The local provider, keeping every launch request (the JobSpec the runner would read)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.requests: list[Any] = []

    def launch(self, request: Any) -> Any:
        self.requests.append(request)
        return super().launch(request)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("sweep-pricing-tiny"), seed=0).parent


def test_the_sweeps_estimate_prices_the_eval_passes_its_runs_make(tmp_path: Path, tiny: Path) -> None:
    from bot.engine.service import Engine

    local = Recording(workdir=tmp_path / "local", runner_command=SLEEPER, price_per_hour=1.0)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), TUNEBOT_APPROVAL_ABOVE=50.0)
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"local": local})
    try:
        request = EstimateRequest(
            model=str(tiny / "model"),
            dataset=str(tiny / "data.jsonl"),
            max_steps=24,
            eval_split=0.1,
            seq_len=256,
            batch_size=4,
            samples=0,
            max_cost=5.0,
        )
        est = eng.estimate_sweep(request, GRID)
        assert est.feasible and est.survivors == [4, 2, 1], est.notes
        assert all(steps == [6, 12, 24] for steps in est.steps)  # stages end at 6 x 2^k, then the run's end
        view = eng.create_sweep(est, user="alice")
        assert [r.status for r in view.runs] == ["running"] * 4, [r.status for r in view.runs]
        assert len(local.requests) == 4
        by_job = {r.job_id: r for r in local.requests}
        for run, priced in zip(view.runs, est._estimates, strict=True):
            spec = JobSpec.model_validate(json.loads(by_job[run.job.job_id].env["TUNEBOT_JOB_SPEC"]))
            # What the runner does with this spec (runner/contract/steps.run_length, runner/train.py): its
            # steps, and an eval pass before the first step, then at every multiple of its cadence and at the
            # end.
            steps = spec.max_steps
            cadence = spec.plateau.resolved(steps).every_steps
            assert cadence == est.steps[run.index][0]  # it evaluates where the sweep's stages end
            assert priced.time.steps == steps
            assert priced.time.evaluations == 1 + evaluations(steps, cadence) == 5
            assert priced.time.eval_hours > 0
            assert priced.training is not None and priced.training.eval_every == cadence
    finally:
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()
