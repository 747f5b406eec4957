"""Stack-specific memory mechanisms that the published rows alone do not pin down."""

from __future__ import annotations

import pytest

from bot.planner.memory import FRAGMENTATION, NF4_DEQUANT_BYTES, estimate_memory, nf4_dequant_path
from bot.planner.models import resolve
from bot.planner.request import EstimateRequest


def _qlora(**kw: object) -> EstimateRequest:
    # the published stacks' default allocator (no expandable segments), fixed-length batches
    kw.setdefault("expandable_segments", False)
    return EstimateRequest(model="meta-llama/Llama-2-7b-hf", method="qlora", batch_size=2, seq_len=768, **kw)


def test_eager_torchao_dequant_needs_its_int64_temporaries() -> None:
    """torchtune QLoRA without compile dequantizes through int64 indices: 14 B/param of the largest
    Linear (Llama-2-7B's MLP, 45M parameters) instead of a kernel's bf16 output."""
    arch, _ = resolve("meta-llama/Llama-2-7b-hf")
    # qlora_upcast=False: the same 16-bit residual stream in both (prepare_model_for_kbit_training's fp32
    # stream is a Hugging Face mechanism of its own, see memory.fp32_residual)
    eager = estimate_memory(arch, _qlora(stack="torchtune", qlora_upcast=False))
    kernel = estimate_memory(arch, _qlora(stack="hf", qlora_upcast=False))
    biggest = 4096 * 11008
    extra = (NF4_DEQUANT_BYTES["torchao eager"] - NF4_DEQUANT_BYTES["kernel"]) * biggest
    assert eager.breakdown["activations"] - kernel.breakdown["activations"] == pytest.approx(extra)
    assert eager.per_gpu_gb - kernel.per_gpu_gb == pytest.approx(extra * FRAGMENTATION["packed"] / 1e9)


@pytest.mark.parametrize(
    ("stack", "compile", "path"),
    [
        ("torchtune", False, "torchao eager"),
        ("torchtune", True, "kernel"),
        ("hf", False, "kernel"),
        ("unsloth", False, "unsloth buffer"),
    ],
)
def test_dequant_path_follows_the_stack(stack: str, compile: bool, path: str) -> None:
    assert nf4_dequant_path(_qlora(stack=stack, compile=compile)) == path


def test_the_default_request_prices_the_runners_autocast() -> None:
    """The runner autocasts on CUDA as runner/model.uses_autocast says (every method since issue 37: LoRA's
    fp32 adapters then read their bf16 inputs as they are); without autocast (9a0c9c1's runner) they read
    fp32 copies, which the estimate counts when asked to."""
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    from runner.contract.spec import Defaults, Method
    from runner.model import uses_autocast

    arch, _ = resolve("meta-llama/Llama-3.1-8B")
    for method in ("full", "lora", "qlora"):
        req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method=method)
        spec = SimpleNamespace(method=Method(method), resolved_precision=Defaults.precision_for(method))
        assert req.autocast is uses_autocast(spec, torch.device("cuda"))  # type: ignore[arg-type]
    lora = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", gradient_checkpointing=False)
    assert lora.autocast and not lora.qlora_upcast
    without = lora.model_copy(update={"autocast": False})
    assert (
        estimate_memory(arch, without).breakdown["activations"]
        > estimate_memory(arch, lora).breakdown["activations"]
    )


def test_the_cublas_workspace_is_torch_reserved_memory_beside_the_context() -> None:
    """cuBLAS' per-stream workspace comes from the caching allocator: torch.cuda.max_memory_reserved counts
    it, the CUDA context does not; the CPU runner has none."""
    from bot.planner.memory import CUBLAS_WORKSPACE_BYTES
    from bot.planner.plan import on_cpu

    arch, _ = resolve("meta-llama/Llama-3.1-8B")
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B")
    mem = estimate_memory(arch, req)
    assert mem.breakdown["cublas_workspace"] == CUBLAS_WORKSPACE_BYTES == 32 * 2**20
    assert mem.torch_reserved_gb * 1e9 == pytest.approx(mem.per_gpu_bytes - mem.breakdown["cuda_context"])
    assert "cublas_workspace" not in on_cpu(arch, req).breakdown
