"""When nothing fits, the estimate says what would, and shows no time for a GPU the job does not fit (issue
27).

Seen on eac3cff: a cost limit too low was answered with `gpus=2` (more GPUs cost more); a 70B full fine-tune
on 8 GPUs (151 GB per GPU) got no word on 16 GPUs or another method that fits; a 72B LoRA showed "Compute time
2.9 h on h200 x1", a GPU it does not fit; "MFU 70%" was a share of the measured matmul rate, not of the peak.
"""

from __future__ import annotations

import re

from fakes.snapshot_plan import snapshot_plan

from bot.chat.cards import estimate_reply
from bot.chat.terminal import cli_console, render
from bot.planner.gpus import GPUS
from bot.planner.request import EstimateRequest


def card(est) -> str:  # type: ignore[no-untyped-def]
    console = cli_console()
    with console.capture() as captured:
        render(estimate_reply(est, estimate_id=None, detailed=True), console)
    return captured.get()


def test_a_cost_limit_too_low_suggests_the_limit_that_covers_an_offer_or_a_shorter_run() -> None:
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", tokens=10_000_000, max_cost=0.2)
    est = snapshot_plan(req)
    assert not any(o.fits for o in est.offers) and est.suggestions
    text = " ".join(est.suggestions)
    assert "gpus=" not in text and "qlora" not in text  # memory is not what is short
    cap = float(re.search(r"max_cost=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    raised = snapshot_plan(req.model_copy(update={"max_cost": cap}))
    cheapest = min((o for o in raised.offers if o.fits), key=lambda o: o.total_cost)
    assert cheapest.total_cost <= cap and f"{cheapest.provider} {cheapest.gpu}" in text
    steps = int(re.search(r"steps=(\d+)", text).group(1))  # type: ignore[union-attr]
    assert 0 < steps < est.time.steps
    shorter = snapshot_plan(req.model_copy(update={"max_steps": steps}))
    assert any(o.fits for o in shorter.offers)  # within the same limit


def test_a_70b_full_fine_tune_on_8_gpus_is_told_what_fits() -> None:
    req = EstimateRequest(model="meta-llama/Llama-3.1-70B", method="full", gpus=8, tokens=1_000_000)
    est = snapshot_plan(req)
    assert not any(o.fits for o in est.offers) and est.memory.per_gpu_gb > 141
    text = " | ".join(est.suggestions)
    # said, not suggested: 16 GPUs, or 32 where 16 do not hold the top of the multi-GPU memory range
    assert re.search(r"\b(16|32) GPUs would need", text) and "more than 8 GPUs" in text
    assert "gpus=16" not in text
    for method in ("lora", "qlora"):  # each method suggested really fits on 8 GPUs
        assert f"method={method}" in text
        other = snapshot_plan(req.for_method(method))
        assert any(o.fits for o in other.offers), method


def test_no_time_is_shown_for_a_gpu_the_job_does_not_fit() -> None:
    est = snapshot_plan(EstimateRequest(model="Qwen/Qwen2.5-72B", method="lora"))
    assert not any(o.fits for o in est.offers)
    assert est.speed.gpu == "h200" and not est.speed.fits
    shown = card(est)
    line = next(ln for ln in shown.splitlines() if ln.startswith("Compute time"))
    assert "does not fit h200 x1" in line and "if it did" in line, line
    assert "if the job fitted (it does not)" in shown
    fits = snapshot_plan(EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora"))
    assert fits.speed.fits and "does not fit" not in card(fits)


def test_mfu_is_stated_against_the_peak_dense_rate() -> None:
    req = EstimateRequest(model="meta-llama/Llama-3.1-70B", method="full", gpus=8, tokens=10**7)
    est = snapshot_plan(req)
    s = est.speed
    gpu = GPUS[s.gpu]
    assert s.matmul_share is not None
    assert abs(s.mfu - s.matmul_share * gpu.matmul_tflops / gpu.dense_tflops) < 1e-3
    assert s.mfu < s.matmul_share  # H200: 790 measured of 989 peak
    shown = card(est)
    assert f"MFU {s.mfu:.0%} of peak ({s.matmul_share:.0%} of measured matmul)" in shown
    assert f"{gpu.dense_tflops:g} TFLOPS bf16 dense peak" in shown
