"""Every published measurement of docs/estimation.md is a test: memory within 15%, tokens/s within 30%.

Rows the physics cannot reach with any single reading of the source are strict xfails with the
reason, so a future change that makes them pass (or breaks the reasoning) is noticed. Two rows that passed
before issue 11 are now replaced by a stated mechanism (SPEED_XFAIL and UNSLOTH_XFAIL below say which and
why): the old planner met them with a per-stack utilization fitted to them and by counting the logits and a
recomputed layer together, both of which the libraries' code contradicts. How the planner does on sources it
was not fitted on is tests/planner/test_crossval.py (leave one source out).
"""

from __future__ import annotations

import pytest

from bot.planner.gpus import gpu
from bot.planner.memory import CUDA_CONTEXT_GB, estimate_memory
from bot.planner.models import resolve
from bot.planner.request import EstimateRequest
from bot.planner.speed import estimate_speed

from .published import ROWS, UNSLOTH_MIN, UNSLOTH_REQUEST, Row

XFAIL: dict[str, str] = {
    "tunebot h200 qlora 1024 plain": (
        "measured 4.53 GB of torch reserved on a 150 GB H200 with the default allocator, 1.28x the planner's "
        "need (3.55): a card with room to spare never hands the allocator's cache back, which the same run's "
        "LoRA rows show as 1.04-1.16x and the traced LoRA steps on the same card as 1.19x for fixed shapes "
        "(bench/gpu_check/README.md); the rest of the gap, ~0.4 GB, is not explained by a counted mechanism"
    ),
}
SPEED_XFAIL: dict[str, str] = {
    "peft metamath full l40s": (
        "replaced by a stated mechanism (issue 11): the old planner met this row with MFU 0.19 fitted to "
        "it alone ('full fine-tuning is not a fixed 0.19'). The roofline predicts ~4,650 tokens/s: "
        "3,072-token micro-steps of Llama-3.2-3B at the matmul efficiency the other 15 rows share (the "
        "same benchmark's LoRA row is within 11% at the same settings), plus foreach AdamW's memory-bound "
        "pass over 3.2B bf16 weights, gradients and states (~42 B/param at 864 GB/s: 0.16 s per step). "
        "The published 2,315 needs ~1.3 s per step, 0.7 s that no counted mechanism explains (a 46 GB "
        "card near its 37 GB reserved peak with variable-length batches would retry cudaMalloc after "
        "freeing the cache, but nothing published says so)"
    ),
}


def _memory(row: Row) -> float:
    req = EstimateRequest(**row.request)
    arch, _ = resolve(req.model)
    m = estimate_memory(arch, req)
    if row.convention == "footprint":
        return (m.breakdown["weights"] + m.breakdown["cuda_context"]) / 1e9
    if row.convention == "torch":
        return m.torch_reserved_gb
    if row.convention == "allocated":
        return m.torch_reserved_gb - m.breakdown["allocator"] / 1e9
    return m.per_gpu_gb


def _params(rows: list[Row], with_speed: bool = False) -> list:
    out = []
    for row in rows:
        if with_speed and row.tokens_per_second is None:
            continue
        marks = (
            [pytest.mark.xfail(strict=True, reason=XFAIL[row.id])]
            if row.id in XFAIL and not with_speed
            else []
        )
        out.append(pytest.param(row, id=row.id, marks=marks))
    return out


@pytest.mark.parametrize("row", _params(ROWS))
def test_peak_memory_within_15_percent(row: Row) -> None:
    predicted = _memory(row)
    assert predicted == pytest.approx(row.memory_gb, rel=0.15), (
        f"{predicted:.2f} GB vs {row.memory_gb:.2f} GB"
    )


def _speed_params() -> list:
    out = []
    for row in ROWS:
        if row.tokens_per_second is None:
            continue
        reason = SPEED_XFAIL.get(row.id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(row, id=row.id, marks=marks))
    return out


@pytest.mark.parametrize("row", _speed_params())
def test_tokens_per_second_within_30_percent(row: Row) -> None:
    req = EstimateRequest(**row.request)
    arch, _ = resolve(req.model)
    tps = estimate_speed(arch, req, gpu(row.gpu)).tokens_per_second
    assert tps == pytest.approx(row.tokens_per_second, rel=0.30), f"{tps:.0f} vs {row.tokens_per_second}"


_LORA16 = (
    "the 16-bit column is 2.3 GB per billion parameters for 14B-70B (33, 76, 164 GB: bf16 weights x1.16) "
    "but 2.6-2.7 for 7B/8B; nothing in a batch-1 LoRA step beyond the 2 B/param weights grows with the "
    "parameter count (adapters, 8-bit optimizer, offloaded checkpoints and chunked logits are ~1 GB), so "
    "these are per-size margins of a rule of thumb, not a measurement"
)
_PAIR = " (test_unsloth_7b_and_8b_columns_contradict_each_other: this row's two cells cannot both pass)"
UNSLOTH_XFAIL = {
    ("meta-llama/Llama-3.2-3B", "qlora"): (
        "replaced by a stated mechanism (issue 11): predicted 2.93 vs 3.5 GB (-16%); it passed at -10% "
        "only because the old planner held the last block's recomputed working set (0.2 GB) together with "
        "the logits. Under checkpointing the loss's backward runs and frees the logits before the last block "
        "is recomputed (torch/utils/checkpoint.py recomputes a block when its own backward first unpacks a "
        "saved tensor). What is left is 2.2 GB of NF4 + 16-bit embeddings, 0.5 GB of chunked logits and "
        "0.1 GB of adapters and 8-bit states: a 'minimum VRAM' guide rounds up from there"
    ),
    ("mistralai/Mistral-7B-v0.1", "lora"): "predicted 15.1 vs 19 GB (-20%): " + _LORA16 + _PAIR,
    ("meta-llama/Llama-3.1-8B", "lora"): "predicted 17.1 vs 22 GB (-22%): " + _LORA16 + _PAIR,
    ("Qwen/Qwen2.5-32B", "qlora"): (
        "predicted 21.2 vs 26 GB (-18%): the table is 0.79 GB per billion parameters here but 0.61 (14B) "
        "and 0.58 (70B) elsewhere; the 32B blocks are NF4 like the others and its batch-1 activations are "
        "~1 GB, so 6.8 GB above the 19.2 GB of weights has no physical source. Even at -15% (22.1 GB) it "
        "needs 3.0 GB above the weights while the 8B cell allows at most 1.2 GB (6.9 - 5.7), a ratio of 2.5; "
        "the terms beyond the weights scale from 8B to 32B by 1.2 (logits), 1.9 (one layer's working set), "
        "2.4 (dequantization scratch) and 3.2 (adapters), about 2.0 for the 8B's mix"
    ),
}


@pytest.mark.parametrize("model", ["mistralai/Mistral-7B-v0.1", "meta-llama/Llama-3.1-8B"])
def test_unsloth_7b_and_8b_columns_contradict_each_other(model: str) -> None:
    """Why no estimator can meet both cells of these rows within 15%.

    With the same settings in both columns, a QLoRA step holds everything a 16-bit LoRA step holds beyond
    the weights (adapters, optimizer states, activations, logits) plus dequantization scratch, so
    LoRA - QLoRA is at most the block Linears' 2 B/param minus the smallest NF4 size (4 bits + 8-bit
    absmax per 64 + fp32 per 256 blocks). Passing both cells needs 0.85 x LoRA - 1.15 x QLoRA, more.
    """
    qlora_gb, lora_gb = UNSLOTH_MIN[model]
    arch, _ = resolve(model)
    smallest_nf4 = 0.5 + 1 / 64 + 4 / (64 * 256)
    largest_physical_gap = arch.block_linear_params * (2.0 - smallest_nf4) / 1e9
    assert 0.85 * lora_gb - 1.15 * qlora_gb > largest_physical_gap


def _unsloth_params() -> list:
    out = []
    for model, (q, lora) in UNSLOTH_MIN.items():
        for method, gb in (("qlora", q), ("lora", lora)):
            reason = UNSLOTH_XFAIL.get((model, method))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(model, method, gb, id=f"unsloth {model} {method}", marks=marks))
    return out


@pytest.mark.parametrize(("model", "method", "gb"), _unsloth_params())
def test_unsloth_minimum_vram(model: str, method: str, gb: float) -> None:
    req = EstimateRequest(**UNSLOTH_REQUEST, model=model, method=method)
    arch, _ = resolve(model)
    m = estimate_memory(arch, req)
    assert m.torch_reserved_gb == pytest.approx(gb, rel=0.15)


def _max_context(capacity_gb: float) -> int:
    arch, _ = resolve("meta-llama/Llama-3.1-8B")
    lo, hi = 256, 262_144
    while hi - lo > 16:
        mid = (lo + hi) // 2
        req = EstimateRequest(
            model="x",
            method="qlora",
            lora_r=32,
            batch_size=1,
            seq_len=mid,
            attn="flash",
            legacy_logits=True,
            loss="plain",
            qlora_upcast=True,  # plain HF: prepare_model_for_kbit_training's fp32 residual stream
        )
        if estimate_memory(arch, req).per_gpu_gb <= capacity_gb:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize(("card", "published"), [("rtx-4090", 5_789), ("a100-80gb", 28_454)])
def test_unsloth_max_context_with_plain_hugging_face(card: str, published: int) -> None:
    """Llama-3.1-8B QLoRA r=32, batch 1, HF + FlashAttention-2: the longest sequence that fits."""
    assert _max_context(gpu(card).memory_gb) == pytest.approx(published, rel=0.15)


def test_cuda_context_matches_hf_measurement() -> None:
    assert CUDA_CONTEXT_GB == pytest.approx(1.343, rel=0.15)


def test_peft_docs_bloomz_full_fine_tune_does_not_fit_an_a100() -> None:
    req = EstimateRequest(
        model="bigscience/bloomz-7b1", method="full", precision="fp32", batch_size=1, seq_len=512
    )
    arch, _ = resolve(req.model)
    assert estimate_memory(arch, req).per_gpu_gb > gpu("a100-80gb").memory_gb


def test_llama3_8b_qlora_weights_split_as_documented() -> None:
    """docs: Llama-3-8B QLoRA keeps about 2.1 GB in bf16 and 3.6 GB in NF4."""
    arch, _ = resolve("meta-llama/Meta-Llama-3-8B")
    assert (arch.parameters - arch.block_linear_params) * 2 / 1e9 == pytest.approx(2.1, rel=0.03)
    assert arch.block_linear_params * 0.516 / 1e9 == pytest.approx(3.6, rel=0.03)
