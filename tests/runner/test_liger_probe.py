"""Liger's kernels are tried on the device before the model is patched (runner/kernels.py ``probe``): a Triton
kernel that cannot compile for a rented host's driver, or computes something else, leaves the model on torch
with the reason in the job's log instead of failing the first step of a paid run."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from runner import kernels
from runner.kernels import probe, torch_references
from runner.loss import IGNORE_INDEX, plain_loss


def references_as_kernels(widths: kernels.Widths | None = None) -> kernels.Checks:
    return {name: (check[0], *check) for name, check in torch_references(widths).items()}


def test_torchs_references_compute_what_a_llama_block_computes():
    """The references the kernels are held to are transformers' own Llama pieces and the runner's plain loss
    (a wrong reference would pass Liger over on every GPU)."""
    refs = torch_references()
    norm = modeling_llama.LlamaRMSNorm(64, eps=1e-6)
    x, w = refs["RMSNorm"][1]("cpu", torch.float32)
    norm.weight.data.copy_(w)
    torch.testing.assert_close(refs["RMSNorm"][0](x, w), norm(x))

    q, k, cos, sin = refs["RoPE"][1]("cpu", torch.float32)
    for got, want in zip(
        refs["RoPE"][0](q, k, cos, sin), modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), strict=True
    ):
        torch.testing.assert_close(got, want)

    a, b = refs["SwiGLU"][1]("cpu", torch.float32)
    mlp_act = modeling_llama.ACT2FN["silu"]
    torch.testing.assert_close(refs["SwiGLU"][0](a, b), mlp_act(a) * b)

    hidden, weight, labels = refs["fused linear cross-entropy"][1]("cpu", torch.float32)
    assert (labels == IGNORE_INDEX).any()
    torch.testing.assert_close(
        refs["fused linear cross-entropy"][0](hidden, weight, labels), plain_loss(hidden @ weight.T, labels)
    )


def test_the_probe_passes_kernels_that_compute_as_torch_and_names_the_first_that_does_not():
    checks = references_as_kernels()
    assert probe(checks, "cpu", torch.float32) is None
    assert probe(checks, "cpu", torch.bfloat16) is None  # within bf16's rounding

    rope, inputs, trained = torch_references()["RoPE"]
    constant_tables = dict(
        checks, RoPE=(lambda q, k, c, s: rope(q, k, c.detach(), s.detach()), rope, inputs, trained)
    )
    assert probe(constant_tables, "cpu", torch.float32) is None  # Liger's RoPE gives cos and sin no gradient

    def no_compile(*args):
        raise RuntimeError("PTX was compiled with an unsupported toolchain.\nmore")

    broken = dict(checks, RoPE=(no_compile, *checks["RoPE"][1:]))
    assert probe(broken, "cpu", torch.bfloat16) == (
        "Liger's RoPE failed on this device (RuntimeError: PTX was compiled with an unsupported toolchain.)"
    )
    ref, _, inputs, trained = checks["SwiGLU"]
    wrong = dict(checks, SwiGLU=(lambda a, b: a * b, ref, inputs, trained))
    assert probe(wrong, "cpu", torch.bfloat16) == "Liger's SwiGLU computes something else than torch's"
    detached = dict(checks, SwiGLU=(lambda a, b: ref(a, b.detach()), ref, inputs, trained))
    assert probe(detached, "cpu", torch.float32) == "Liger's SwiGLU gives no gradient where torch's does"


@pytest.fixture
def fake_liger(monkeypatch):
    """A liger-kernel whose patching is recorded, on a host that passes liger_problem (as a CUDA host; its
    kernels are tried on this CPU)."""
    patched: list[object] = []
    root = types.ModuleType("liger_kernel")
    transformers_mod = types.ModuleType("liger_kernel.transformers")
    transformers_mod._apply_liger_kernel_to_instance = lambda model, **kw: patched.append(model)
    monkey = types.ModuleType("liger_kernel.transformers.monkey_patch")
    monkey.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": None}
    for name, mod in (
        ("liger_kernel", root),
        ("liger_kernel.transformers", transformers_mod),
        ("liger_kernel.transformers.monkey_patch", monkey),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(kernels, "liger_problem", lambda: None)
    monkeypatch.setattr(kernels, "probe_device", lambda device_type: torch.device("cpu"))
    return patched


def tiny_llama():
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_a_kernel_that_fails_its_probe_leaves_the_model_unpatched_and_says_why(fake_liger, monkeypatch):
    def no_compile(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    checks = references_as_kernels()
    checks["RMSNorm"] = (no_compile, *checks["RMSNorm"][1:])
    monkeypatch.setattr(kernels, "liger_kernels", lambda widths: checks)
    model = tiny_llama()
    problem = kernels.apply_liger(model, "cuda")
    assert problem == (
        "Liger's RMSNorm failed on this device "
        "(RuntimeError: no kernel image is available for execution on the device)"
    )
    assert fake_liger == []
    assert (
        kernels.describe("liger", problem, "chunked")
        == f"kernels: torch, not Liger: {problem}; loss: chunked cross-entropy"
    )


def test_kernels_that_pass_their_probe_are_patched_in(fake_liger, monkeypatch):
    """...tried at the model's own widths (Triton compiles a kernel per width: the first step then finds the
    kernels the check compiled)."""
    tried: list[kernels.Widths] = []
    monkeypatch.setattr(
        kernels, "liger_kernels", lambda widths: tried.append(widths) or references_as_kernels(widths)
    )
    model = tiny_llama()
    assert kernels.apply_liger(model, "cuda") is None
    assert fake_liger == [model]
    assert tried == [kernels.Widths(hidden=32, intermediate=64, heads=2, kv_heads=2, head_dim=16)]
    x, w = torch_references(tried[0])["RMSNorm"][1]("cpu", torch.float32)
    q, k, cos, _ = torch_references(tried[0])["RoPE"][1]("cpu", torch.float32)
    assert x.shape[-1] == 32 and q.shape[1:] == (2, 8, 16) and cos.shape[-1] == 16
