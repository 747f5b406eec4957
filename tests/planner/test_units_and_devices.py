"""GPU names as people type them, one memory unit everywhere, and a CPU job priced as the CPU runs it."""

from __future__ import annotations

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.chat.cards import estimate_reply
from bot.chat.grammar import parse
from bot.planner.gpus import gpu
from bot.planner.options import OptionError, parse_values
from bot.planner.request import EstimateRequest


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("4090", "rtx-4090"),
        ("rtx-4090", "rtx-4090"),
        ("RTX4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("rtx_4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("RTX3090", "rtx-3090"),
        ("H100", "h100-80gb"),
        ("H100 SXM", "h100-80gb"),
        ("A100 80GB", "a100-80gb"),
        ("A100-40GB", "a100-40gb"),
        ("a100", "a100-80gb"),
        ("A6000", "rtx-a6000"),
        ("RTX 6000 Ada", "rtx-6000-ada"),
        ("L40S", "l40s"),
        ("H200", "h200"),
        ("cpu", "cpu"),
    ],
)
def test_every_spelling_of_a_card_means_that_card(typed: str, canonical: str) -> None:
    assert gpu(typed).name == canonical
    assert parse_values([("gpu", typed)]) == {"gpu": canonical}  # CLI flags and /tune key=value alike


@pytest.mark.parametrize("typed", ["RTX4090", "RTX 4090", "rtx_4090", "4090"])
def test_the_estimate_and_the_chat_take_the_same_spellings(typed: str) -> None:
    est = snapshot_plan(
        EstimateRequest(model="llama-3.2-1b", tokens=1_000_000, **parse_values([("gpu", typed)]))
    )
    assert est.speed.gpu == "rtx-4090"
    assert {o.gpu for o in est.offers if o.fits} == {"rtx-4090"}
    words = f'"gpu={typed}"' if " " in typed else f"gpu={typed}"
    command = parse(f"estimate llama-3.2-1b {words}")
    assert command.request.gpu == "rtx-4090"  # type: ignore[attr-defined]


def test_an_unknown_card_lists_the_known_ones() -> None:
    with pytest.raises(OptionError, match="unknown GPU 'T4'; known: rtx-3090, rtx-4090"):
        parse_values([("gpu", "T4")])


def test_memory_is_in_decimal_gb_and_says_so() -> None:
    est = snapshot_plan(EstimateRequest(model="llama-3.1-8b", tokens=1_000_000))
    assert est.memory.per_gpu_gb == pytest.approx(sum(est.memory.breakdown_gb.values()), abs=0.01)
    assert any("GB = 10^9 bytes" in a for a in est.assumptions)
    rtx = next(o for o in est.offers if o.gpu == "rtx-4090")
    assert rtx.gpu_memory_gb == pytest.approx(24564 * 2**20 / 1e9, abs=0.01)  # "24 GB" = 24 GiB = 25.76 GB


def test_a_cpu_job_has_no_cuda_context_and_is_priced_in_fp32() -> None:
    gpu_est = snapshot_plan(EstimateRequest(model="qwen2.5-0.5b", tokens=100_000, gpu="rtx-4090"))
    cpu_est = snapshot_plan(EstimateRequest(model="qwen2.5-0.5b", tokens=100_000, gpu="cpu"))
    assert "cuda_context" in gpu_est.memory.breakdown_gb
    assert "cuda_context" not in cpu_est.memory.breakdown_gb
    params = cpu_est.model.parameters
    assert cpu_est.memory.breakdown_gb["weights"] == pytest.approx(4 * params / 1e9, rel=1e-3)  # fp32 on CPU
    assert gpu_est.memory.breakdown_gb["weights"] == pytest.approx(2 * params / 1e9, rel=1e-3)
    text = repr(estimate_reply(cpu_est, estimate_id=None))
    assert "Memory (host RAM)" in text and "cuda_context" not in text
