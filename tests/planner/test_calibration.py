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
from bot.planner.calibration import (
    LOCAL_HOST,
    ONE_HOST_SAFE,
    SLOWEST,
    Calibration,
    Measurement,
    shrunk_factor,
    size_class,
    within_roofline,
)
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


def test_a_world_slower_than_the_physics_is_learned_from_the_first_run() -> None:
    """Issue 36: slower than the physics is the side the quote must not err on (caps and approvals follow
    it), so the first run moves it most of the way (on 9a0c9c1: a third of the way in the log, so the quote
    after a run at 0.7x was still 13% fast); more runs keep it there."""
    physics = _tps(None)
    for n in (1, 3, 10, 30):
        cal = calibrate(_world(n))
        corr = cal.lookup("rtx-4090", "hf", "qlora", 8.03e9)
        assert corr is not None and corr.speed_runs == n and corr.memory_runs == n
        error = abs(_tps(cal) / (0.7 * physics) - 1)
        assert error < (0.08 if n <= 3 else 0.05), (n, error)
    assert 1.0 < cal.lookup("rtx-4090", "hf", "qlora", 8.03e9).memory_factor <= 1.09


def _local(
    speed_x: float, *, host: str | None = LOCAL_HOST, owner: str = "alice", job: str = "j"
) -> Measurement:
    """A run of the issue's H200 shape measured at ``speed_x`` times the physics' tokens/s, reported by
    ``host`` (LOCAL_HOST: the bot's own machine; else a rented host's claim)."""
    m = Measurement(gpu="h200", request=H200_QLORA, job_id=job, host=host, owner=owner)
    return m.model_copy(update={"tokens_per_second": predict_measurement(m).tokens_per_second * speed_x})


H200_QLORA = dict(model="meta-llama/Llama-3.2-1B", method="qlora", seq_len=1024, batch_size=1)
KEY = ("h200", "hf", "qlora", "<3B")


def test_a_run_far_slower_than_quoted_moves_the_next_quote_most_of_the_way() -> None:
    """Issue 36: after a run measured at x0.03 of its quote, `calibrate show` applied x0.817 on 9a0c9c1. A run
    the bot trusts (its own machine, an import) moves the next quote of its class most of the way in what it
    costs: its time covers at least three quarters of what the run measured beyond the physics."""
    corr = calibrate([_local(0.03)]).corrections[KEY]
    measured, quoted = 1 / 0.03, 1 / corr.speed_factor  # time multipliers against the physics
    assert quoted - 1 >= 0.75 * (measured - 1), corr
    assert corr.speed_factor >= 0.03  # never past what was measured
    assert "speed x0.04 from 1 run" in corr.describe()


def test_a_local_cpu_run_is_held_to_the_physics_of_the_cpu_its_quote_priced() -> None:
    """Issue 36: a local run is quoted on its share of this machine (one thread of two here, Python at 0.6 of
    the development machine's: plan.cpu_share), but its measurement was predicted on the nominal CPU (two
    cores to itself, speed 1): a run that went exactly as quoted read as half the physics' speed, and every
    later local quote was doubled (the bench's quotes after its first shapes: x0.48 from 4 runs, each shape
    then billed 0.6-0.8 of its quote). Held to its own CPU, a run that went as quoted moves nothing, one
    slower than quoted moves the quote its way, and a CPU row without the CPU it had is not used."""
    from bot.planner.gpus import CPU
    from bot.planner.models import resolve
    from bot.planner.plan import conditioned_cpu, predicted

    request = dict(model="meta-llama/Llama-3.2-1B", method="lora", seq_len=512, batch_size=1)
    conditions = {"cores": 2.0, "runs": 1.0, "threads": 1.0, "speed": 0.6}
    arch, _ = resolve(request["model"])
    req = EstimateRequest(**request)
    as_quoted = predicted(arch, req, conditioned_cpu(conditions), 1).tokens_per_second
    nominal = predicted(arch, req, CPU, 1).tokens_per_second
    assert as_quoted < 0.7 * nominal  # what the nominal CPU made of a run that went as quoted

    def run(speed_x: float, device: dict | None = conditions) -> Measurement:
        return Measurement(
            gpu="cpu",
            request=request,
            job_id="j",
            host=LOCAL_HOST,
            tokens_per_second=as_quoted * speed_x,
            device=device,
        )

    key = ("cpu", "hf", "lora", "<3B")
    assert abs(calibrate([run(1.0)]).corrections[key].speed_factor - 1.0) < 0.01
    slower = calibrate([run(0.8)]).corrections[key].speed_factor
    assert 0.8 <= slower < 0.9  # most of the way to what it measured, never past it
    assert key not in calibrate([run(1.0, device=None)]).corrections


def test_one_host_claiming_to_be_very_slow_moves_its_class_a_bounded_step() -> None:
    """A rented host's slow claim raises the quotes of everyone's jobs of its class: alone it moves them most
    of the way to ONE_HOST_SAFE (2x), no further; a second host of another owner saying the same carries it
    the rest of the way; nothing goes past the physical floor (SLOWEST)."""
    one = calibrate([_local(0.03, host="vast:1", owner="mallory")]).corrections[KEY]
    assert 1 / ONE_HOST_SAFE <= one.speed_factor <= 0.6, one
    assert one.speed_held == 1 and "until a second agrees" in one.describe()
    same_owner = calibrate(
        [_local(0.03, host="vast:1", owner="mallory"), _local(0.03, host="vast:2", owner="mallory", job="k")]
    ).corrections[KEY]
    assert same_owner.speed_factor >= 1 / ONE_HOST_SAFE  # one member behind two hosts: still held
    two = calibrate(
        [_local(0.03, host="vast:1", owner="mallory"), _local(0.03, host="vast:2", owner="bob", job="k")]
    ).corrections[KEY]
    assert two.speed_factor <= 0.04 and two.speed_held == 0, two
    absurd = calibrate([_local(1e-6)]).corrections[KEY]
    assert absurd.speed_factor >= 1 / SLOWEST  # past the floor, a host does something else


def test_no_calibration_takes_an_estimate_past_the_roofline() -> None:
    """Faster claims keep their corroboration rule, and never promise more than the GPUs' matmul rate: thirty
    hosts of three owners claiming 1.5x on a job the physics already puts at 70% of it (9a0c9c1: 105%)."""
    req = dict(model="meta-llama/Llama-3.1-70B", method="full", seq_len=32768, batch_size=1, attn="flash")
    base = Measurement(gpu="h100-80gb", gpus=8, request=req)
    p = predict_measurement(base)
    assert p.mfu > 0.65
    roofline = p.tokens_per_second / p.mfu  # every FLOP at the measured matmul rate
    runs = [
        base.model_copy(
            update={"tokens_per_second": p.tokens_per_second * 1.5, "job_id": f"j{i}", "host": f"h{i}"}
            | {"owner": f"u{i % 3}"}
        )
        for i in range(30)
    ]
    est = snapshot_plan(
        EstimateRequest(**req, gpu="h100-80gb", gpus=8, tokens=1_000_000), calibration=calibrate(runs)
    )
    assert est.speed.calibrated_runs == 30
    assert est.speed.tokens_per_second <= roofline and est.speed.matmul_share <= 1.0, est.speed
    assert within_roofline(1.5, 0.8) == 1.25 and within_roofline(1.5, None) == 1.5


def test_a_memory_claim_larger_than_the_gpu_counts_as_what_the_gpu_holds() -> None:
    m = Measurement(gpu="rtx-4090", request=_request(1024), job_id="big", max_memory_reserved_gb=400.0)
    p = predict_measurement(m)
    corr = calibrate([m]).corrections[("rtx-4090", "hf", "qlora", "3-10B")]
    assert 1.0 < corr.memory_factor * p.memory_gb <= 24.0 + 1e-6, corr


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
    load, and bot.money, the layer below the planner that writes amounts; the store, the engine and the chat
    layer may not.)"""
    code = (
        "import sys, json\n"
        "from bot.planner import EstimateRequest, plan_request\n"
        "from bot.planner.inputs import calibrate\n"
        "from bot.providers.snapshot import snapshot_offers\n"
        "request = EstimateRequest(model='meta-llama/Llama-3.2-1B', tokens=1000)\n"
        "plan_request(request, offers=snapshot_offers())\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('store', 'sqlalchemy', 'sqlmodel', 'bot') and not m.startswith(('bot.planner', 'bot.providers')) "
        "and m not in ('bot', 'bot.money'))))\n"
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
