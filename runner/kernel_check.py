"""An optional kernel tried on the device against torch's own computation before a run relies on it.

The runner's optional kernels (the varlen attention kernels of runner/attention.py, Liger's of
runner/kernels.py) have not all run on a GPU of this project's, and where one cannot run on a rented host (a
Triton that cannot compile for its driver, a torch whose signature differs) it would fail the run's first
step. So each is run once, forward and backward, on small inputs on the device, in the run's dtype, beside a
plain torch reference in fp32, with the same dense random gradient flowing back into both (an expanded
ones-gradient could hide an in-place write in a backward, and errors that cancel); what it finds is turned
into the job log's line by its caller, and a kernel with a finding is passed over, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Fn = Callable[..., Any]
Inputs = Callable[[Any, Any], list[Any]]  # (device, dtype) -> the call's arguments


@dataclass(frozen=True)
class Finding:
    """What is wrong with a kernel: it ``raised`` (``error``), or at ``index`` (its outputs first, then the
    gradients of the trained inputs) a gradient is ``missing``, has the wrong ``shape`` or is not finite, or
    ``differs`` from the reference's."""

    what: str  # raised | missing | shape | differs
    index: int = -1
    error: str = ""
    shape: tuple[int, ...] = ()


def said(exc: BaseException) -> str:
    """An exception as one short line of the job's log."""
    text = str(exc).strip()
    first = text.splitlines()[0][:160].rstrip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def compare(
    kernel: Fn,
    reference: Fn,
    inputs_on: Inputs,
    trained: tuple[int, ...],
    device: Any,
    dtype: Any,
    *,
    rtol: float,
    atol: float,
) -> Finding | None:
    """``kernel`` in ``dtype`` against ``reference`` in fp32 on the same inputs (``trained``: the positions
    whose gradients a step needs), within ``rtol`` of the reference's largest value plus ``atol``; None when
    it computes what the reference does. Nothing raises out of it (the device's tensors included)."""
    import torch

    def run(fn: Fn, on: Any) -> list[Any]:
        inputs = inputs_on(device, on)
        leaves = [t.clone().requires_grad_() if i in trained else t for i, t in enumerate(inputs)]
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        gen = torch.Generator().manual_seed(1)  # the same upstream gradients for the kernel and the reference
        upstream = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
        torch.autograd.backward(outs, upstream)
        grads = [leaves[i].grad for i in trained]
        return [None if t is None else t.detach().float().cpu() for t in (*outs, *grads)]

    try:
        got = run(kernel, dtype)
        want = run(reference, torch.float32)
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run here is passed over, not fatal
        return Finding("raised", error=said(exc))
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a is None and b is not None:
            return Finding("missing", index)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a is None or b is None:
            continue
        if a.shape != b.shape or not torch.isfinite(a).all():
            return Finding("shape", index, shape=tuple(a.shape))
        if float((a - b).abs().max()) > rtol * float(b.abs().max()) + atol:
            return Finding("differs", index)
    return None
