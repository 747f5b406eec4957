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
from typing import Any


def liger_problem() -> str | None:
    """Why Liger's kernels cannot run on this host, None when they can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (Liger's kernels are Triton kernels for GPUs)"
    for module, package in (("triton", "triton"), ("liger_kernel", "liger-kernel")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed"
    return None


def apply_liger(model: Any, device_type: str) -> str | None:
    """Liger's RMSNorm, RoPE and SwiGLU patched into ``model`` (its base model under peft); the reason when
    not (then the model is unchanged)."""
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


def describe(wanted: str, problem: str | None, loss: str) -> str:
    """The job log's line about the kernels that run."""
    if wanted != "liger":
        return f"kernels: torch (kernels=torch); loss: {loss} cross-entropy"
    if problem is None:
        return "kernels: Liger (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy)"
    return f"kernels: torch, not Liger: {problem}; loss: {loss} cross-entropy"
