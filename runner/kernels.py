"""Liger's Triton kernels on CUDA where they install, and a clean fall-back with a line in the job's log.

liger-kernel (in the runner's install: pyproject's runner extra, the staged wheel's requirements on Linux,
bot/engine/launching/runner_bundle.py) replaces a model's RMSNorm, rotary embedding and SwiGLU with fused
Triton kernels and computes the loss with its fused linear cross-entropy (runner/loss.py ``liger``), which
never holds more than a chunk of logits and computes the gradients during the forward. JobSpec.kernels
"liger" (the default) asks for them; "torch" never uses them. Where they cannot run (no CUDA, liger-kernel or
Triton not installed, a model type Liger does not know) the run goes on with plain torch and the loss the plan
chose, and ``describe`` says why in the log. The model's own logits are compared with the fused loss at start
(runner/loss.check_against_plain) either way.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from runner.kernel_check import Fn, Inputs


def liger_problem() -> str | None:
    """Why Liger's kernels cannot run on this host, None when they can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (Liger's kernels are Triton kernels for GPUs)"
    for module, package in (("triton", "triton"), ("liger_kernel", "liger-kernel")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed"
    return None


def probe_device(device_type: str) -> Any:
    """Where the kernels are tried: the run's device (this process's current CUDA device), wherever the
    weights sit before FSDP wraps them."""
    import torch

    return torch.device(device_type)


def apply_liger(model: Any, device_type: str) -> str | None:
    """Liger's RMSNorm, RoPE and SwiGLU patched into ``model`` (its base model under peft), once each kernel
    (and the fused loss) has trained correctly on the device (``probe``); the reason when not (then the model
    is unchanged)."""
    import torch

    if device_type != "cuda":
        return "no CUDA device (Liger's kernels are Triton kernels for GPUs)"
    problem = liger_problem()
    if problem:
        return problem
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
            return f"Liger has no kernels for model type {model_type!r}"
        widths = Widths.of(getattr(base, "config", None))
        problem = probe(liger_kernels(widths), probe_device(device_type), torch.bfloat16)
        if problem:
            return problem
        # the loss is runner/loss.py's (Liger's fused linear cross-entropy inside the lm_head's call)
        _apply_liger_kernel_to_instance(
            model=base,
            rope=True,
            rms_norm=True,
            swiglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
        )
    except Exception as exc:  # noqa: BLE001 - an optional speed-up never stops a run
        return f"Liger's kernels failed to apply ({type(exc).__name__}: {str(exc)[:200]})"
    return None


# name: (the kernel, torch's reference, its inputs, the positions of the inputs a step trains through)
Checks = dict[str, tuple[Fn, Fn, Inputs, tuple[int, ...]]]


@dataclass(frozen=True)
class Widths:
    """The model's widths the kernels are tried at: Triton compiles a kernel per width (and caches it), so a
    check at the model's own widths compiles what the first step would have and costs it nothing more."""

    hidden: int = 64
    intermediate: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16

    @classmethod
    def of(cls, config: Any) -> Widths:
        heads = int(getattr(config, "num_attention_heads", 0) or cls.heads)
        hidden = int(getattr(config, "hidden_size", 0) or cls.hidden)
        return cls(
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", 0) or hidden),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", 0) or heads),
            head_dim=int(getattr(config, "head_dim", 0) or hidden // heads),
        )


def torch_references(widths: Widths | None = None) -> dict[str, tuple[Fn, Inputs, tuple[int, ...]]]:
    """What each Liger kernel the runner uses computes, in plain torch as a Llama block computes it, with
    inputs of the model's widths (a few rows of each) and the inputs whose gradients a step needs (RoPE's cos
    and sin are constants, a loss's labels are integers). The loss is tried on a small vocabulary: the lm_head
    of a large one is a gigabyte."""
    import torch

    w = widths or Widths()
    import torch.nn.functional as F

    from runner.loss import IGNORE_INDEX

    def rms_norm(x, w):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * y.to(x.dtype)

    def rope(q, k, cos, sin):
        def rotate(t):
            half = t.shape[-1] // 2
            return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate(q) * s, k * c + rotate(k) * s

    def rope_inputs(device, dtype):
        gen = torch.Generator().manual_seed(0)
        angle = torch.rand(1, 8, w.head_dim // 2, generator=gen) * 3
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        q = torch.randn(2, w.heads, 8, w.head_dim, generator=gen)
        k = torch.randn(2, w.kv_heads, 8, w.head_dim, generator=gen)
        return [q.to(device, dtype), k.to(device, dtype), cos.to(device, dtype), sin.to(device, dtype)]

    def loss(hidden, weight, labels):
        logits = hidden[:, :-1].float() @ weight.float().T
        return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), reduction="sum")

    def loss_inputs(device, dtype):
        gen = torch.Generator().manual_seed(0)
        labels = torch.randint(0, 96, (2, 9), generator=gen)
        labels[0, :3] = IGNORE_INDEX
        hidden = torch.randn(2, 9, w.hidden, generator=gen)
        weight = torch.randn(96, w.hidden, generator=gen) / w.hidden**0.5
        return [hidden.to(device, dtype), weight.to(device, dtype), labels.to(device)]

    def plain_inputs(*shapes):
        def make(device, dtype):
            gen = torch.Generator().manual_seed(0)
            return [torch.randn(*shape, generator=gen).to(device, dtype) for shape in shapes]

        return make

    return {
        "RMSNorm": (rms_norm, plain_inputs((2, 8, w.hidden), (w.hidden,)), (0, 1)),
        "RoPE": (rope, rope_inputs, (0, 1)),
        "SwiGLU": (
            lambda a, b: F.silu(a) * b,
            plain_inputs((2, 8, w.intermediate), (2, 8, w.intermediate)),
            (0, 1),
        ),
        "fused linear cross-entropy": (loss, loss_inputs, (0, 1)),
    }


def liger_kernels(widths: Widths | None = None) -> Checks:
    """Each Liger kernel the runner uses beside torch's reference and its inputs (``torch_references``)."""
    from liger_kernel.transformers.functional import liger_rms_norm, liger_rope, liger_swiglu

    from runner.loss import liger_loss

    kernels: dict[str, Fn] = {
        "RMSNorm": lambda x, w: liger_rms_norm(x, w, 1e-6),
        "RoPE": liger_rope,
        "SwiGLU": liger_swiglu,
        "fused linear cross-entropy": lambda hidden, weight, labels: liger_loss(hidden, weight, None, labels),
    }
    return {name: (kernels[name], *check) for name, check in torch_references(widths).items()}


def probe(kernels: Checks, device: Any, dtype: Any) -> str | None:
    """Why one of ``kernels`` cannot train here (it raised - a Triton that cannot compile for this driver or
    card -, or its outputs or input gradients are not torch's), None when all can: each forward and backward
    once on small inputs on the device (runner/kernel_check.py), before the model is patched, so a kernel no
    GPU of this project's has run fails here and the run trains with torch, not at its first step."""
    from runner.kernel_check import compare

    for name, (kernel, reference, inputs_on, trained) in kernels.items():
        found = compare(kernel, reference, inputs_on, trained, device, dtype, rtol=0.05, atol=1e-2)
        if found is None:
            continue
        if found.what == "raised":
            return f"Liger's {name} failed on this device ({found.error})"
        if found.what == "missing":
            return f"Liger's {name} gives no gradient where torch's does"
        if found.what == "shape":
            return f"Liger's {name} computes something else than torch's (shape {found.shape})"
        return f"Liger's {name} computes something else than torch's"
    return None


def describe(wanted: str, problem: str | None, loss: str) -> str:
    """The job log's line about the kernels that run."""
    if wanted != "liger":
        return f"kernels: torch (kernels=torch); loss: {loss} cross-entropy"
    if problem is None:
        return "kernels: Liger (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy)"
    return f"kernels: torch, not Liger: {problem}; loss: {loss} cross-entropy"
