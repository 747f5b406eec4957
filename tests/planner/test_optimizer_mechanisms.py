"""The optimizer step's temporaries (memory.optimizer_step_bytes) against torch.optim.AdamW itself.

Every tensor torch allocates during optimizer.step() is traced on the CPU (a TorchDispatchMode sees each op's
fresh outputs; a finalizer on the storage sees it freed): the live bytes beyond the parameters, gradients and
states, at their peak. torch/optim/adam.py: _multi_tensor_adam (foreach, torch's default on CUDA when fused is
not asked for) builds `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`, one temporary the size of
every state at once; _fused_adam updates in place; _single_tensor_adam (for-loop) holds a square root and its
quotient of one parameter at a time. The first step also allocates the two states (lazy init in _init_group).
"""

from __future__ import annotations

import weakref

import pytest

from bot.planner.architectures import from_config
from bot.planner.memory import estimate_memory, optimizer_step_bytes
from bot.planner.request import EstimateRequest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

CFG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 384,
    "tie_word_embeddings": False,
    "head_dim": 16,
}


class FreshBytes(TorchDispatchMode):
    """Peak live bytes of the storages ops create (in-place results reuse their input's storage: not new)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = self.total = 0

    def _freed(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is not None:
            self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            if key in self.live or key in inputs or nbytes == 0:
                continue
            self.live[key] = nbytes
            self.now += nbytes
            self.total += nbytes
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


def _model(dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**CFG), dtype=dtype)


KWARGS = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("impl", ["foreach", "fused", "for-loop"])
def test_adamw_step_temporaries_match_the_planner(impl: str, precision: str) -> None:
    pytest.importorskip("transformers")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = _model(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, **KWARGS[impl])
    first, second = FreshBytes(), FreshBytes()
    with first:
        optimizer.step()  # lazy init: exp_avg and exp_avg_sq, zeros_like each parameter
    with second:
        optimizer.step()
    n = sum(p.numel() for p in params)
    elem = params[0].element_size()
    arch = from_config(CFG, "tiny")
    assert arch.parameters == n  # the planner counts the same tensors
    req = EstimateRequest(model="tiny", method="full", precision=precision, optimizer_impl=impl)
    planned = optimizer_step_bytes(arch, req, n, float(elem), 1.0)
    assert second.peak == pytest.approx(planned, rel=0.01, abs=64), (impl, second.peak, planned)
    # the states the planner prices (2 x the parameters' dtype) are what the first step creates
    assert first.total - second.total == pytest.approx(2 * n * elem, rel=0.01)


def test_foreach_prices_a_full_fine_tune_higher_than_fused_by_one_state() -> None:
    """The estimate follows the optimizer a person picks: foreach costs one parameter-sized temporary at the
    optimizer step, which wins the peak for a pure-bf16 full fine-tune at a short sequence."""
    from bot.planner.models import resolve

    arch = resolve("meta-llama/Llama-3.2-1B")[0]
    base = dict(model="meta-llama/Llama-3.2-1B", method="full", precision="bf16", seq_len=512)
    fused = estimate_memory(arch, EstimateRequest(**base))
    foreach = estimate_memory(arch, EstimateRequest(**base, optimizer_impl="foreach"))
    assert foreach.peak_phase == "optimizer step"
    assert foreach.per_gpu_bytes - fused.per_gpu_bytes >= 0.9 * 2 * arch.parameters
