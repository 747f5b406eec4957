"""The planner's memory estimate against a whole Hugging Face training step at full size.

bench/allocator_replay/trace.py runs transformers + PEFT on the meta device (real shapes, dtypes and tensor
lifetimes, no memory), sends every allocation and free through the caching-allocator emulation, and reads
the peak reserved memory. Here two of its cases are checks: a regression in the activation, logits or
optimizer terms (or a transformers upgrade that changes what a step keeps) shows up as a gap.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bot.planner.memory import estimate_memory
from bot.planner.models import resolve
from bot.planner.request import EstimateRequest

TRACE = Path(__file__).resolve().parents[2] / "bench" / "allocator_replay" / "trace.py"
CASES = {
    "Llama-3.1-8B LoRA all r=16, 1 x 2048, ckpt",
    "Qwen3-4B LoRA q,v r=8, 2 x 512, no ckpt",
}


def _trace_module():
    spec = importlib.util.spec_from_file_location("allocator_replay_trace", TRACE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_planner_matches_a_traced_hugging_face_step_within_5_percent() -> None:
    pytest.importorskip("peft")
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    trace = _trace_module()
    checked = 0
    for label, request in trace.HF_CASES:
        if label not in CASES:
            continue
        alloc = trace.trace_hf(request, steps=2)
        reserved, allocated = alloc.peak_reserved / 1e9, alloc.peak_allocated / 1e9
        assert reserved >= allocated > 5.0, label  # a real step of a multi-GB model was traced
        req = EstimateRequest(**request, autocast=False)  # the meta device runs no autocast
        m = estimate_memory(resolve(req.model)[0], req)
        planned = m.torch_reserved_gb
        assert planned == pytest.approx(reserved, rel=0.05), (
            f"{label}: planner {planned:.2f} vs traced {reserved:.2f}"
        )
        checked += 1
    assert checked == len(CASES)
    assert torch.nn.functional.scaled_dot_product_attention is sdpa  # the emulation does not leak
