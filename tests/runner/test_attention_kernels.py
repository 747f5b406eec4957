"""The varlen kernel packed rows attend through is chosen on the device by trying it first
(runner/attention.py): a kernel that raises or computes something else is passed over with its reason in the
job's log, so an optional kernel no GPU here has run never fails a paid run's first step."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from runner import attention
from runner.attention import Kernel, adapt_varlen_attn, candidates, per_segment, probe, resolve

STARTS = [0, 4, 13, 20]


def packed(heads: int = 4, kv_heads: int = 2, d: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    total = STARTS[-1]
    return tuple(torch.randn(total, h, d, generator=gen) for h in (heads, kv_heads, kv_heads))


def reference(q, k, v, cu, n, scale):
    return per_segment(q, k, v, [int(x) for x in cu.tolist()], scale)


def segments_sdpa(q, k, v, cu, causal: bool, scale: float | None, gqa: bool) -> torch.Tensor:
    """What a varlen kernel computes, strict about what its signature says it takes."""
    if q.shape[1] != k.shape[1] and not gqa:
        raise RuntimeError("number of heads in key/value must equal the query's")
    out = torch.empty_like(q)
    bounds = [int(x) for x in cu.tolist()]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        part = F.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=causal, scale=scale, enable_gqa=gqa
        )
        out[a:b] = part.transpose(0, 1)
    return out


def varlen_newer(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    return segments_sdpa(q, k, v, cu_q, window_size == (-1, 0), scale, enable_gqa)


def varlen_first(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
    return segments_sdpa(q, k, v, cu_q, is_causal, None, False)


def varlen_no_causal(q, k, v, cu_q, cu_k, max_q, max_k):
    return segments_sdpa(q, k, v, cu_q, False, None, False)


@pytest.mark.parametrize("fn", [varlen_newer, varlen_first], ids=["window_size", "is_causal"])
def test_torch_varlen_attn_is_called_as_the_torch_present_takes_it(fn):
    """Causal, the model's own scale (not the kernel's default) and grouped-query K/V, on either signature."""
    q, k, v = packed()
    cu = torch.tensor(STARTS, dtype=torch.int32)
    call = adapt_varlen_attn(fn)
    assert call is not None
    torch.testing.assert_close(call(q, k, v, cu, 9, 0.2), reference(q, k, v, cu, 9, 0.2))


def test_a_varlen_attn_without_a_causal_form_is_not_a_candidate():
    assert adapt_varlen_attn(varlen_no_causal) is None


def test_this_torchs_varlen_attn_takes_the_call_the_runner_makes():
    """The installed torch's signature (the runner's torch pin) binds the adapted call's keywords."""
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    params = inspect.signature(varlen.varlen_attn).parameters
    assert "window_size" in params or "is_causal" in params
    names = [k.name if isinstance(k, Kernel) else k for k in candidates()]
    assert any("varlen_attn" in n for n in names)
    assert any("aten._flash_attention_forward" in n for n in names)


def test_the_probe_passes_a_correct_kernel_and_names_what_is_wrong_with_others():
    def raises(q, k, v, cu, n, scale):
        raise TypeError("varlen_attn() got an unexpected keyword argument 'window_size'")

    def not_causal(q, k, v, cu, n, scale):
        return segments_sdpa(q, k, v, cu, False, scale, True)

    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu, n, scale):
            ctx.save_for_backward(q, k, v)
            return reference(q, k, v, cu, n, scale)

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            return torch.ones_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None, None

    class NoKeyGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu, n, scale):
            return reference(q, k, v, cu, n, scale)

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None, None, None, None

    def wrong_grad(q, k, v, cu, n, scale):
        return WrongGrad.apply(q, k, v, cu, n, scale)

    shape = dict(device="cpu", dtype=torch.float32, heads=4, kv_heads=2, head_dim=8)
    assert probe(reference, **shape) is None
    assert "TypeError: varlen_attn() got an unexpected keyword" in probe(raises, **shape)
    assert probe(not_causal, **shape) == "its output differs from causal attention's"
    assert probe(wrong_grad, **shape) == "its dq differs from causal attention's"
    no_key_grad = lambda q, k, v, cu, n, scale: NoKeyGrad.apply(q, k, v, cu, n, scale)  # noqa: E731
    assert probe(no_key_grad, **shape) == "no gradient reaches its k"
    # a bf16 kernel within bf16's rounding passes
    bf16 = dict(shape, dtype=torch.bfloat16)
    assert probe(reference, **bf16) is None


def test_the_first_kernel_that_trains_correctly_is_kept_and_the_log_says_why_others_were_not():
    def broken(*args):
        raise RuntimeError("no kernel image for sm_80")

    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    found = [
        "flash-attn (not installed)",
        Kernel(
            "a broken kernel", lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel image for sm_80"))
        ),
        Kernel("the right kernel", reference),
        Kernel("never tried", lambda *a: pytest.fail("tried after one was chosen")),
    ]
    try:
        choice = resolve(torch.device("cpu"), torch.float32, config, found)
        assert choice.kernel is found[2] and attention.chosen() is choice
        assert choice.line() == (
            "attention: packed rows through the right kernel, no mask (not flash-attn (not installed); "
            "not a broken kernel: RuntimeError: no kernel image for sm_80)"
        )
    finally:
        attention._CHOICE.clear()


def test_where_no_kernel_runs_packed_rows_keep_sdpa_with_its_mask_and_the_log_says_why():
    """The real candidates of this CPU host: each is tried and passed over with its reason (the aten kernel
    and torch's varlen_attn are CUDA kernels), none raises out of the choice."""
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    try:
        choice = resolve(torch.device("cpu"), torch.bfloat16, config)
        assert choice.kernel is None
        line = choice.line()
        assert line.startswith(
            "attention: transformers' sdpa with the packed rows' mask made on the device (not "
        )
        assert "(aten._flash_attention_forward): NotImplementedError: " in line
        assert len(choice.passed_over) == len(candidates())
    finally:
        attention._CHOICE.clear()


def test_the_model_is_loaded_with_the_varlen_attention_only_where_a_kernel_passed(runner_job, monkeypatch):
    """runner/model.attn_implementation on a CUDA device, as the runner asks for it: with no kernel that
    trains here (this CPU build: every probe on "cuda" raises) transformers' sdpa, and the log's line says
    why; with one that passes, the varlen attention registered with transformers."""
    from runner.model import attn_implementation, precision_for

    spec = runner_job()  # the defaults: LoRA, sdpa
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    cuda = torch.device("cuda")
    plan = precision_for(spec, "cuda")
    try:
        assert attn_implementation(spec, cuda, plan, config) == "sdpa"
        choice = attention.chosen()
        assert choice is not None and choice.kernel is None and choice.passed_over
        monkeypatch.setattr(attention, "candidates", lambda: [Kernel("the right kernel", reference)])
        monkeypatch.setattr(attention, "probe", lambda *args: None)
        assert attn_implementation(spec, cuda, plan, config) == attention.NAME
        assert attention.chosen().line() == "attention: packed rows through the right kernel, no mask"
        from transformers import AttentionInterface

        assert AttentionInterface()[attention.NAME] is attention.varlen_attention
    finally:
        attention._CHOICE.clear()
