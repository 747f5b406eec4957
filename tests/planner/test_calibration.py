"""Learning from finished runs: convergence, robustness to an odd run, and the planner staying pure."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.planner import EstimateRequest
from bot.planner.calibration import Calibration, Measurement, shrunk_factor, size_class
from bot.planner.inputs import calibrate, predict_measurement

MODEL = "meta-llama/Llama-3.1-8B"
OFFERS = None  # the snapshot


def _request(seq: int) -> dict:
    return dict(model=MODEL, method="qlora", seq_len=seq, batch_size=1, lora_r=16)


def _world(runs: int, true_speed: float = 0.7, true_memory: float = 1.08, seed: int = 0) -> list[Measurement]:
    """Runs on an RTX 4090 whose real utilization is 0.7x the physics and memory 1.08x, with 5% noise."""
    rnd = random.Random(seed)
    out = []
    for i in range(runs):
        m = Measurement(gpu="rtx-4090", request=_request(rnd.choice([512, 1024, 2048, 4096])), job_id=f"j{i}")
        mem_gb, tps, *_ = predict_measurement(m)
        out.append(
            m.model_copy(
                update={
                    "tokens_per_second": tps * true_speed * math.exp(rnd.gauss(0, 0.05)),
                    "max_memory_reserved_gb": mem_gb * true_memory * math.exp(rnd.gauss(0, 0.02)),
                }
            )
        )
    return out


def _tps(calibration: Calibration | None, gpu: str = "rtx-4090", seq: int = 1024) -> float:
    req = EstimateRequest(**_request(seq), gpu=gpu, tokens=1_000_000)
    return snapshot_plan(req, calibration=calibration).speed.tokens_per_second


def test_a_world_slower_than_the_physics_is_learned_in_a_few_runs() -> None:
    physics = _tps(None)
    errors = []
    for n in (1, 3, 10, 30):
        cal = calibrate(_world(n))
        corr = cal.lookup("rtx-4090", "hf", "qlora", 8.03e9)
        assert corr is not None and corr.speed_runs == n and corr.memory_runs == n
        errors.append(abs(_tps(cal) / (0.7 * physics) - 1))
    assert errors == sorted(errors, reverse=True)  # more runs, closer to the truth
    assert errors[0] > 0.15  # one run stays near the physics (a third of the way)
    assert errors[-1] < 0.05  # thirty runs: within 5% of the measured world
    assert 1.0 < cal.lookup("rtx-4090", "hf", "qlora", 8.03e9).memory_factor <= 1.09


def test_one_odd_run_does_not_swing_the_estimate() -> None:
    runs = _world(8)
    before = calibrate(runs)
    odd = runs[0].model_copy(update={"tokens_per_second": runs[0].tokens_per_second * 4, "job_id": "odd"})
    after = calibrate([*runs, odd])
    key = ("rtx-4090", "hf", "qlora", "3-10B")
    assert after.corrections[key].speed_factor == pytest.approx(
        before.corrections[key].speed_factor, rel=0.03
    )
    # alone, an odd first run moves the estimate a bounded step (clipped at 1.5x, a third of the way)
    alone = calibrate([odd]).corrections[key].speed_factor
    assert 1.0 < alone <= 1.5 ** (1 / 3) + 1e-9
    assert shrunk_factor([]) == 1.0


def test_corrections_apply_only_to_their_gpu_class_and_are_passed_in() -> None:
    cal = calibrate(_world(10))
    assert _tps(cal, gpu="h100-80gb") == _tps(None, gpu="h100-80gb")  # another GPU: the physics alone
    assert _tps(cal) < _tps(None)
    est = snapshot_plan(EstimateRequest(**_request(1024), gpu="rtx-4090", tokens=1_000_000), calibration=cal)
    assert est.speed.calibrated_runs == 10
    assert "calibrated from 10 runs on rtx-4090" in est.speed.calibration
    assert any("calibrated from 10 runs on rtx-4090" in a for a in est.assumptions)
    assert sum(est.memory.breakdown_gb.values()) == pytest.approx(est.memory.per_gpu_gb, abs=0.01)
    assert est.memory.breakdown_gb["calibration"] > 0
    # a measurement the planner cannot predict (unknown model) is skipped, not guessed
    assert (
        calibrate(
            [Measurement(gpu="rtx-4090", request={"model": "nope/nope"}, tokens_per_second=1.0)]
        ).skipped
        == 1
    )
    assert size_class(0.5e9) == "<3B" and size_class(70e9) == ">40B"


def test_the_planner_never_reads_the_store() -> None:
    """Calibration comes in as an argument: importing and running the planner loads no database code.

    (The dated snapshot prices come from each cloud's module, bot/providers/<cloud>.py: bot.providers may
    load; the store, the engine and the chat layer may not.)"""
    code = (
        "import sys, json\n"
        "from bot.planner import EstimateRequest, plan_request\n"
        "from bot.planner.inputs import calibrate\n"
        "from bot.providers.snapshot import snapshot_offers\n"
        "request = EstimateRequest(model='meta-llama/Llama-3.2-1B', tokens=1000)\n"
        "plan_request(request, offers=snapshot_offers())\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('store', 'sqlalchemy', 'sqlmodel', 'bot') and not m.startswith(('bot.planner', 'bot.providers')) "
        "and m != 'bot')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_estimate_json_carries_ranges_and_keeps_its_keys() -> None:
    est = snapshot_plan(EstimateRequest(model=MODEL, method="qlora", tokens=1_000_000))
    data = json.loads(est.model_dump_json())
    lo, hi = data["memory"]["per_gpu_gb_range"]
    assert lo < data["memory"]["per_gpu_gb"] < hi
    lo, hi = data["speed"]["tokens_per_second_range"]
    assert lo < data["speed"]["tokens_per_second"] < hi
    lo, hi = data["time"]["hours_range"]
    assert lo < data["time"]["hours"] < hi
    fits = [o for o in data["offers"] if o["fits"]]
    assert fits and all(o["total_cost_range"][0] < o["total_cost"] < o["total_cost_range"][1] for o in fits)
    for key in ("per_gpu_gb", "breakdown_gb", "gpus", "sharding"):
        assert key in data["memory"]
    for key in ("tokens_per_second", "step_seconds", "mfu"):
        assert key in data["speed"]
